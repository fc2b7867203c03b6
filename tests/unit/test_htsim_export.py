"""An experiment as htsim reads it (fabriclab.model.htsim, ``fabriclab export``): the topology,
the connection matrix with its triggers, the command line, and what is refused by name."""

import json
import re
import subprocess
import sys

import pytest

from fabriclab.model import experiment as xp
from fabriclab.model import htsim
from testbed.errors import ConfigError

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def scenario(**workload) -> dict:
    pairs = [[f"h{1 + (i + 1) // 9}_{(i + 1) % 9 + 1}", "h1_1"] for i in range(16)]
    return {"version": 1, "name": "check",
            "fabric": {"topology": "leaf_spine", "leaves": 2, "spines": 9, "hosts_per_leaf": 9,
                       "host_link": {"rate_gbps": 400, "latency_ns": 650,
                                     "ecn": {"mode": "step", "k_bdp": 0.5}},
                       "fabric_link": {"rate_gbps": 400, "latency_ns": 650},
                       "queue": {"size_bdp": 8}, "mtu": 4200},
            "emulator": {"datapath": "ebpf", "time_scale": 50_000},
            "workload": {"transport": "uet", "connections": 1, **workload,
                         "collectives": workload.get("collectives") or [
                             {"op": "flows", "label": "incast", "size": "1MiB",
                              "pairs": pairs},
                             {"op": "all_reduce", "size": "4MiB", "ranks": 4}]}}


def parse_cm(text: str) -> tuple[dict, list[dict], dict[int, dict]]:
    """htsim's connection matrix, read as its loader reads it."""
    lines = [line.split() for line in text.splitlines() if line.strip()]
    head = {t[0]: int(t[1]) for t in lines if t[0] in ("Nodes", "Connections", "Triggers")}
    flows, triggers = [], {}
    for tok in lines:
        if "->" in tok[0]:
            src, dst = map(int, tok[0].split("->"))
            flow = {"src": src, "dst": dst}
            for key, value in zip(tok[1::2], tok[2::2]):
                flow[key] = int(value)
            flows.append(flow)
        elif tok[0] == "trigger":
            triggers[int(tok[2])] = {"type": tok[3], "count": int(tok[5])}
    return head, flows, triggers


def test_topology_in_real_units_and_nodes_tor_by_tor():
    exp = xp.parse(scenario())
    made = htsim.export(exp, 1000)
    topo = made.files["check.topo"]
    assert "Nodes 18\nTiers 2\nPodsize 18" in topo
    assert re.search(r"Tier 0\nDownlink_speed_Gbps 400\nRadix_Down 9\nRadix_Up 9\n"
                     r"Downlink_Latency_ns 650", topo)
    assert re.search(r"Tier 1\nDownlink_speed_Gbps 400\nRadix_Down 2\nDownlink_Latency_ns 650",
                     topo)
    ids = htsim.node_ids(exp)
    assert ids["h1_1"] == 0 and ids["h1_9"] == 8 and ids["h2_1"] == 9 and ids["h2_9"] == 17


def test_the_connection_matrix_chains_steps_and_collectives_by_triggers():
    exp = xp.parse(scenario())
    head, flows, triggers = parse_cm(htsim.export(exp, 1000).files["check.cm"])
    assert head["Nodes"] == 18 and head["Connections"] == len(flows) == 16 + 4 * 6
    assert head["Triggers"] == len(triggers)
    incast, ring = flows[:16], flows[16:]
    assert all(f["dst"] == 0 and f["start"] == 0 and f["size"] == 1 << 20 for f in incast)
    # the incast ends in one barrier counting its 16 flows; the ring's first step waits on it
    (done,) = {f["send_done_trigger"] for f in incast}
    assert triggers[done] == {"type": "barrier", "count": 16}
    first = [f for f in ring if f.get("trigger") == done]
    assert len(first) == 4
    # every later step of a rank waits for what it received the step before
    for f in ring:
        if f.get("trigger") != done:
            feeding = [g for g in ring if g.get("recv_done_trigger") == f["trigger"]]
            assert [g["dst"] for g in feeding] == [f["src"]]
            assert triggers[f["trigger"]]["count"] == 1
    assert sum(f["size"] for f in ring) == exp.workload.jobs[1].collectives[0].moved_bytes()
    ids = [f["id"] for f in flows]
    assert ids == list(range(1, len(flows) + 1))
    # every trigger is referenced by a flow that waits for it
    waited = {f["trigger"] for f in flows if "trigger" in f}
    assert set(triggers) == waited


def test_command_lines_per_transport():
    exp = xp.parse(scenario())
    made = htsim.export(exp, 1234.5)
    cmd = made.command
    assert cmd[:5] == ["htsim_uec", "-topo", "check.topo", "-tm", "check.cm"]
    args = dict(zip(cmd[5::2], cmd[6::2]))
    assert args["-linkspeed"] == "400000" and args["-mtu"] == "4200" and args["-end"] == "1235"
    queue = exp.fabric.queue_kb * 1024 // 4200
    assert args["-q"] == str(queue)
    k = round(exp.port_ecn("host")[0].k_bytes / 4200)
    assert cmd[cmd.index("-ecn") + 1:cmd.index("-ecn") + 3] == [str(k), str(k)]
    assert "-disable_trim" in cmd and cmd[cmd.index("-load_balancing_algo") + 1] == "reps"
    roce = htsim.export(xp.parse(scenario(transport="rocev2")), 1000)
    assert roce.command[0] == "htsim_roce" and "-dcqcn" in roce.command
    assert roce.command[1:3] == ["-tiers", "2"] and "check.topo" not in roce.files
    assert any("lossless" in n for n in roce.notes)
    hpcc = htsim.export(xp.parse(scenario(transport={"kind": "rocev2",
                                                     "congestion_control": "hpcc"})), 1000)
    assert hpcc.command[0] == "htsim_hpcc" and "-topo" not in hpcc.command


def test_what_htsim_cannot_hold_is_refused_by_name():
    data = scenario()
    data["fabric"]["fabric_link"]["rate_gbps"] = 300  # 9 x 400 over 9 x 300: not whole
    with pytest.raises(ConfigError) as err:
        htsim.export(xp.parse(data), 1000)
    assert err.value.path == "fabric.fabric_link.rate_gbps" and "oversubscription" in \
        err.value.message
    data = scenario(transport="tcp")
    with pytest.raises(ConfigError) as err:
        htsim.export(xp.parse(data), 1000)
    assert err.value.path == "workload.transport"
    data = scenario()
    data["fabric"] = {"topology": "ring", "leaves": 3, "hosts_per_leaf": 2}
    data["workload"]["collectives"] = [{"op": "all_reduce", "size": "1MiB", "ranks": 4}]
    with pytest.raises(ConfigError) as err:
        htsim.export(xp.parse(data), 1000)
    assert err.value.path == "fabric.topology"


def test_fabriclab_export_writes_each_variant(tmp_path):
    data = scenario()
    data["variants"] = [{"name": "uet", "set": {}},
                        {"name": "dcqcn", "set": {"workload.transport": "rocev2"}}]
    path = tmp_path / "check.yaml"
    path.write_text(json.dumps(data))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "fabriclab.cli", "export", str(path), "-o",
                           str(out), "--json"], capture_output=True, text=True, cwd=ROOT,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [e["name"] for e in doc["exports"]] == ["uet", "dcqcn"]
    assert (out / "uet.topo").is_file() and (out / "uet.cm").is_file()
    assert (out / "uet.cmd").read_text().startswith("htsim_uec -topo uet.topo -tm uet.cm")
    assert (out / "dcqcn.cmd").read_text().startswith("htsim_roce -tiers 2 -tm dcqcn.cm")
