"""A fabric partitioned over a cluster of namespace machines, used as a user uses it: the
quickstart run over two machines, a machine dying mid-run, a sweep's cells at once on the
machines (a failing one fails the sweep), link and switch failures acting on every machine's
ends, and ``fabriclab fail`` on a cluster fabric kept up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from telemetry.prometheus import Prometheus
from testbed.model.partition import VXLAN_OVERHEAD
from tests.integration.cluster_cli import ROOT, fabriclab_cli
from tests.integration.conftest import DATAPATHS

CLUSTER_RUN = """version: 1
name: quickstart-cluster
description: the quickstart fabric (k=4 fat-tree, 10 Mbit/s, jumbo frames), D-mod-k routing
fabric:
  topology: fat_tree
  k: 4
  host_link: {rate_mbps: 10}
  fabric_link: {rate_mbps: 10}
  queue: {size_kb: 256}
  mtu: 9000
controller: {routing: dmodk, ready_timeout_s: 60}
workload:
  connections: 2
  collectives:
    - {op: all_reduce, algorithm: ring, size: %s, ranks: 16, repetitions: %d}
"""
SIZE = 4 << 20
RANKS = 16


def _on(text: str, datapath: str) -> str:
    """An experiment's text on ``datapath`` (the default is auto: said either way)."""
    return text + f"emulator: {{datapath: {datapath}}}\n"


def _ring_bytes_received(out: Path) -> int:
    rows = (out / "flows.csv").read_text().splitlines()
    col = rows[0].split(",").index("bytes")
    return sum(int(r.split(",")[col]) for r in rows[1:])


@DATAPATHS
def test_the_quickstart_fabric_runs_partitioned_over_two_machines(tmp_path, datapath):
    """``fabriclab up --check`` and ``fabriclab run --cluster`` unchanged on two namespace
    machines with a jumbo underlay: the plan splits k=4 by pods (8 cut links as VXLAN), every
    pair is reachable through the tunnels, a ring all-reduce delivers every byte at the
    busbw the same fabric gives on one machine (within 10 %), results.json records the
    partition and each machine's fidelity, and nothing is left."""
    from testbed.cluster.nscluster import NamespaceCluster

    exp = tmp_path / "cluster.yaml"
    exp.write_text(_on(CLUSTER_RUN % ("4MiB", 2), datapath))
    ray = str(Path(sys.executable).parent / "ray")
    single = fabriclab_cli(["run", str(exp), "--out", str(tmp_path / "single")], tmp_path / "state")
    assert single.returncode == 0, single.stdout[-2000:] + single.stderr[-2000:]
    with NamespaceCluster(2, ray, underlay_mtu=9000 + VXLAN_OVERHEAD) as cluster:
        up = fabriclab_cli(["up", str(exp), "--check", "--cluster", cluster.address],
                  tmp_path / "coord", cluster)
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        doc = json.loads(up.stdout[up.stdout.index("{"):])
        assert doc["reachability"]["complete"], doc["reachability"]
        assert doc["datapath"].endswith("on 2 machines"), doc["datapath"]
        assert doc["datapath"].startswith("ebpf") == (datapath == "ebpf"), doc["datapath"]
        assert doc["vswitchd_instances"] == (20 if datapath == "ovs" else 0)
        assert doc["controller"].startswith("10.250.0.1:")  # the coordinator's underlay
        # OpenFlow over TLS where every machine's switches can (eBPF); said where not
        plain = [w for w in doc["warnings"] if "OpenFlow runs over plain TCP" in w]
        assert bool(plain) == (datapath != "ebpf"), doc["warnings"]
        out = tmp_path / "cluster"
        run = fabriclab_cli(["run", str(exp), "--out", str(out), "--cluster", cluster.address],
                   tmp_path / "coord", cluster)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert not cluster.errors
    res = json.loads((out / "results.json").read_text())
    one = json.loads((tmp_path / "single" / "results.json").read_text())
    part = res["cluster"]
    assert set(part["machines"]) == {"machine1", "machine2"}
    assert [m["nodes"] for m in part["machines"].values()] == [18, 18]  # two pods, two cores
    assert len(part["cut_links"]) == 8 and part["cut_links"][0]["vni"] == 1000
    assert set(res["fidelity"]["machines"]) == {"machine1", "machine2"}
    assert res["fidelity"]["verdict"] == "ok", res["fidelity"]
    assert _ring_bytes_received(out) == _ring_bytes_received(tmp_path / "single") \
        == 2 * 2 * (RANKS - 1) * SIZE  # 2 repetitions, every rank 2(N-1)/N of the size
    for runs in (res, one):
        assert [c["bytes"] for c in runs["collectives"]] == [SIZE, SIZE]
    busbw = [sum(c["busbw_GBps"] for c in r["collectives"]) / 2 for r in (res, one)]
    print(f"busbw cluster {busbw[0] * 1e3:.2f} Mbit/s, one machine {busbw[1] * 1e3:.2f}; "
          f"bring-up {res['timings_s']['bring_up']} s against {one['timings_s']['bring_up']}")
    assert abs(busbw[0] - busbw[1]) <= 0.10 * busbw[1], busbw
    # the ring crossed the machines: through the cores, half of whose links are cut links
    tiers = res["congestion"]["utilization"]
    assert tiers["agg->core"]["max"] > 0.3 and tiers["core->agg"]["max"] > 0.3, tiers


def test_a_machine_dying_mid_run_is_named_and_the_others_are_cleaned(tmp_path):
    """machine2's Ray node killed (SIGKILL, every process) while a ring all-reduce runs: the
    run fails with one error naming machine2, results.json keeps it, machine1's part is torn
    down by the run, and machine2's leftovers (its hosts' shells, vswitchds, agents) are
    removed by its run record inside its namespace (what ``fabriclab clean`` there does)."""
    import signal
    import time

    from testbed.cluster.nscluster import NamespaceCluster
    from testbed.linux.procfs import descendants

    exp = tmp_path / "cluster.yaml"
    exp.write_text(CLUSTER_RUN % ("16MiB", 3))
    ray = str(Path(sys.executable).parent / "ray")
    out = tmp_path / "run"
    with NamespaceCluster(2, ray, underlay_mtu=9000 + VXLAN_OVERHEAD) as cluster:
        m1, m2 = cluster.machines
        cmd = ["ip", "netns", "exec", m1.netns, sys.executable, "-m", "fabriclab.cli",
               "--state-dir", str(tmp_path / "coord"), "run", str(exp), "--out", str(out),
               "--cluster", cluster.address]
        run = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd=ROOT, env={**os.environ, **cluster.auth})
        try:
            def measuring() -> bool:  # the workload started: agents run on both machines
                text = subprocess.run(["ps", "-eo", "args"], capture_output=True,
                                      text=True).stdout
                return text.count("traffic.agents.agent") >= RANKS or run.poll() is not None

            deadline = time.monotonic() + 120
            while not measuring() and time.monotonic() < deadline:
                time.sleep(0.2)
            assert run.poll() is None, run.communicate()[0][-3000:]
            time.sleep(2)
            node = [m2.ray.pid, *descendants(m2.ray.pid)]
            for pid in node:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            stdout, stderr = run.communicate(timeout=300)
        finally:
            if run.poll() is None:
                run.kill()
                run.communicate()
        assert run.returncode != 0
        text = stdout + stderr
        assert "machine machine2 is gone" in text, text[-3000:]
        doc = json.loads((out / "results.json").read_text())
        assert doc["complete"] is False and "machine2" in doc["error"], doc.get("error")
        # machine1's part went with the run: no shell of its hosts is left (machine2's are)
        left = subprocess.run(["ip", "netns", "pids", m1.netns], capture_output=True,
                              text=True).stdout.split()
        shells = [p for p in left if "mininet:" in Path(f"/proc/{p}/cmdline").read_text()]
        assert not shells, shells
    assert not cluster.errors, cluster.errors  # machine2 cleaned by its record


PARALLEL = """version: 1
name: parallel-sweep
fabric: {topology: fat_tree, k: 4, mtu: 9000, queue: {size_kb: 256}}
controller: {routing: dmodk, ready_timeout_s: 60}
workload:
  collectives: [{op: all_reduce, algorithm: ring, size: 1MiB, ranks: 16}]
sweep:
  axes: {controller.routing: [ecmp, dmodk]}
"""


FAILING_CELL = """version: 1
name: parallel-failing-cell
fabric: {topology: leaf_spine, leaves: 2, spines: 1, hosts_per_leaf: 2, mtu: 1500}
workload:
  collectives: [{op: all_reduce, algorithm: ring, size: 256KiB, ranks: 4}]
sweep:
  axes: {workload.congestion_control: [cubic, dctcp]}
"""


def test_a_sweeps_cells_run_at_once_one_per_machine(tmp_path):
    """``--parallel``: two cells, each built whole on its own machine at the same time, their
    run directories back in the sweep's, the sweep's wall time under the cells' sum; without
    it, the cells in turn share one partitioned fabric. A jumbo fabric over this 1550-byte
    underlay is refused by machine before anything is built."""
    from testbed.cluster.nscluster import NamespaceCluster

    exp = tmp_path / "sweep.yaml"
    exp.write_text(PARALLEL)
    ray = str(Path(sys.executable).parent / "ray")
    out = tmp_path / "sweep"
    jumbo = tmp_path / "jumbo.yaml"
    jumbo.write_text(CLUSTER_RUN % ("1MiB", 1))
    with NamespaceCluster(2, ray) as cluster:  # an underlay MTU of 1550
        run = fabriclab_cli(["run", str(exp), "--out", str(out), "--parallel", "--cluster",
                    cluster.address], tmp_path / "coord", cluster)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        # a jumbo fabric partitioned over it: refused before anything is built, by machine
        up = fabriclab_cli(["up", str(jumbo), "--check", "--cluster", cluster.address],
                  tmp_path / "coord", cluster)
        assert up.returncode == 2, up.stdout[-3000:] + up.stderr[-3000:]
        assert "cluster.machines[0]: machine1's underlay MTU is 1550: fabric.mtu 9000 in " \
               "VXLAN needs 9050 or more" in up.stdout + up.stderr, up.stdout + up.stderr
        # without --parallel: the cells one after another on one partitioned fabric, shared
        # (a new controller for the second cell)
        small = tmp_path / "mtu1500.yaml"  # what this underlay carries in VXLAN
        small.write_text(PARALLEL.replace("mtu: 9000", "mtu: 1500"))
        in_turn = fabriclab_cli(["run", str(small), "--out", str(tmp_path / "in-turn"), "--cluster",
                        cluster.address], tmp_path / "coord", cluster)
        assert in_turn.returncode == 0, in_turn.stdout[-3000:] + in_turn.stderr[-3000:]
        shared = json.loads((tmp_path / "in-turn" / "sweep.json").read_text())["cells"]
        assert [(c["complete"], c["fabric_reused"]) for c in shared] == [(True, False),
                                                                        (True, True)]
        # a cell that fails on its machine (a TCP congestion control this kernel lacks) fails
        # the sweep's exit status; the other cell's results stand
        failing = tmp_path / "failing.yaml"
        failing.write_text(FAILING_CELL)
        mixed = fabriclab_cli(["run", str(failing), "--out", str(tmp_path / "mixed"), "--parallel",
                      "--cluster", cluster.address], tmp_path / "coord", cluster)
        assert mixed.returncode == 3, mixed.stdout[-3000:] + mixed.stderr[-3000:]
        cells = {c["name"]: c for c in json.loads((tmp_path / "mixed" / "sweep.json")
                                                   .read_text())["cells"]}
        assert cells["congestion_control=cubic"]["complete"], cells
        assert "dctcp" in cells["congestion_control=dctcp"]["error"], cells
        assert not cluster.errors
    sweep = json.loads((out / "sweep.json").read_text())
    assert [c["complete"] for c in sweep["cells"]] == [True, True], sweep["cells"]
    docs = [json.loads((out / c["name"] / "results.json").read_text()) for c in sweep["cells"]]
    assert {d["machine"] for d in docs} == {"machine1", "machine2"}
    assert all(d["collectives"][0]["bytes"] == 1 << 20 for d in docs)
    assert (out / "report.html").exists() and (out / sweep["cells"][0]["name"] / "flows.csv"
                                               ).exists()
    total = sum(d["timings_s"]["total"] for d in docs)
    assert sweep["wall_s"] < 0.85 * total, (sweep["wall_s"], total)


FAILING = """version: 1
name: cluster-failures
fabric: {topology: fat_tree, k: 4, mtu: 1500}
controller: {routing: dmodk}
workload:
  collectives:
    - {op: all_reduce, size: 2MiB, ranks: [h1_1_1, h2_1_1, h3_1_1, h4_1_1]}
failures:
  - {at_s: 0.2, link: [agg1_1, core2], action: down}
  - {at_s: 0.4, switch: core1, action: down}
  - {at_s: 0.8, link: [agg1_1, core2], action: up}
"""


@DATAPATHS
def test_link_and_switch_failures_on_a_cluster_act_on_every_machines_ends(tmp_path, datapath):
    """The same failures as on one machine, partitioned over two: agg1_1-core2 is a cut link
    (agg1_1 on machine1, core2 on machine2), so each machine cuts, signals and takes down its
    own end; core1's four links have ends on both machines. The ring over the four pods goes
    on around them (the controller reroutes), every event is applied without error, in the
    order cut, switches told, down, and the repair counts what the cut dropped."""
    from testbed.cluster.nscluster import NamespaceCluster

    exp = tmp_path / "fail.yaml"
    exp.write_text(_on(FAILING, datapath))
    ray = str(Path(sys.executable).parent / "ray")
    out = tmp_path / "run"
    started = time.time()
    with NamespaceCluster(2, ray) as cluster:
        run = fabriclab_cli(["run", str(exp), "--out", str(out), "--cluster", cluster.address,
                    "--telemetry"], tmp_path / "coord", cluster)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert not cluster.errors
    ended = time.time()
    doc = json.loads((out / "results.json").read_text())
    # Prometheus scraped every machine's CPU through the coordinator's exporter
    with Prometheus(out / "prometheus", {}) as prom:
        def machines(metric: str) -> set[str]:
            return {s["metric"]["machine"] for s in prom.api(
                "query_range", query=metric, start=f"{started:.3f}", end=f"{ended:.3f}",
                step="1")["result"]}
        assert machines("fabriclab_machine_cpu_cores") == {"coordinator", "machine1",
                                                           "machine2"}
        if datapath == "ovs":  # the eBPF switches have no process of their own
            assert machines("fabriclab_vswitchd_cpu_seconds_total") == {"machine1",
                                                                        "machine2"}
    cut = {c["link"] for c in doc["cluster"]["cut_links"]}
    assert "agg1_1:4-core2:1" in cut, cut  # the failed link crosses the machines
    assert doc["complete"] is True and doc["collectives"][0]["efficiency"] > 0.1, doc
    applied = doc["failures"]
    assert [(f["target"], f["action"], f["links"]) for f in applied] == [
        ("link agg1_1-core2", "down", 1), ("switch core1", "down", 4),
        ("link agg1_1-core2", "up", 1)]
    assert all(not f["errors"] and f["applied_s"] >= f["at_s"] for f in applied), applied
    for f in applied[:2]:
        steps = f["steps_s"]
        assert steps["cut_s"] <= steps["signalled_s"] <= steps["down_s"], f
    assert applied[2]["steps_s"]["up_s"] <= applied[2]["steps_s"]["signalled_s"]
    # the cut's program counted (None: no cut loaded, the failure only took the veths down)
    assert isinstance(applied[2]["cut_drops"], int), applied[2]
    assert all(set(f["throughput"]) >= {"before_mbps", "during_mbps", "after_mbps"}
               for f in applied)
    print("cluster failures:", [(f["target"], f["action"], f["took_s"], f["steps_s"])
                                for f in applied])


#: Ray's worker ports (``ray start``'s defaults): a driver's core worker listens on one
RAY_WORKER_PORTS = range(10002, 20000)


def _listening_beyond(machine, drivers: set[int]) -> list[str]:
    """The listening sockets in ``machine``'s namespace that fabriclab's processes have on an
    address other than the machine's underlay or loopback; fails when fabriclab's controller
    is not among them at all. Ray's own are left out (its servers bind every interface, which
    docs/cluster.md says): its node's processes, and in the ``drivers`` (the fabriclab
    commands, Ray drivers) the core worker's port from Ray's worker range."""
    import re

    from testbed.linux.procfs import descendants

    ray = {machine.ray.pid, *descendants(machine.ray.pid)}
    lines = subprocess.run(["ip", "netns", "exec", machine.netns, "ss", "-Hltnup"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    ours = []
    for line in lines:
        pids = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if not pids or pids & ray:
            continue
        port = int(re.search(r":(\d+)\s", line).group(1))
        if pids & drivers and port in RAY_WORKER_PORTS:
            continue
        ours.append(line)
    controller = [line for line in ours if f"{machine.ip}:" in line]
    assert controller, lines  # the controller listens on the underlay
    local = rf"\s({re.escape(machine.ip)}|127\.0\.0\.\d+|\[::1\]):\d+\s"
    return [line for line in ours if not re.search(local, line)]


@DATAPATHS
def test_fabriclab_fail_and_restore_reach_a_cluster_fabric_kept_up(tmp_path, datapath):
    """``fabriclab up --cluster`` keeps the partitioned fabric up; ``fabriclab fail`` /
    ``restore`` from another process on the head find its machines' actors by name: a cut
    link's end goes down on each machine, the controller sees it, the repair brings both
    back; a bad target is named; SIGTERM tears ``up`` down (despite Ray's own handler), and
    then ``fail`` says no fabric runs. What listens on the head's machine: the controller on
    its underlay address, fabriclab's exporters on loopback, nothing else of fabriclab's."""
    import signal

    from testbed.cluster.nscluster import NamespaceCluster
    from testbed.linux.procfs import descendants
    from testbed.model.builders import fat_tree
    from testbed.poll import wait_for
    from testbed.runs.registry import Registry

    exp = tmp_path / "up.yaml"
    exp.write_text(_on("version: 1\nname: cluster-up\nfabric: {topology: fat_tree, k: 4, "
                       "mtu: 1500}\ncontroller: {routing: dmodk}\n", datapath))
    ray = str(Path(sys.executable).parent / "ray")
    state = tmp_path / "coord"
    link = fat_tree(4).find_link("agg1_1", "core2")
    with NamespaceCluster(2, ray) as cluster:
        m1, m2 = cluster.machines
        up = subprocess.Popen(["ip", "netns", "exec", m1.netns, sys.executable, "-m",
                               "fabriclab.cli", "--state-dir", str(state), "up", str(exp),
                               "--cluster", cluster.address], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                              env={**os.environ, **cluster.auth})
        said_up: list[str] = []
        reader = threading.Thread(target=lambda: said_up.extend(up.stdout), daemon=True)
        reader.start()
        try:
            def status() -> dict:
                runs = Registry(state).runs()
                path = Path(runs[0].run_dir) / "controller-status.json" if runs else None
                try:
                    return json.loads(path.read_text()) if path else {}
                except (OSError, ValueError):
                    return {}

            def is_up(netns: str, ifname: str) -> bool:
                out = subprocess.run(["ip", "-n", netns, "-j", "link", "show", ifname],
                                     capture_output=True, text=True, check=True).stdout
                return "UP" in json.loads(out)[0]["flags"]

            # up, as it says (the wiring's count grows while the machines still build)
            wait_for(lambda: any("fabric is up" in line for line in said_up)
                     or up.poll() is not None, 180, "the cluster fabric up")
            assert up.poll() is None, "".join(said_up)[-3000:]
            wide = _listening_beyond(m1, {up.pid, *descendants(up.pid)})
            assert not wide, wide  # the controller on the underlay, the rest on loopback
            ends = ((m1.netns, link.a.ifname), (m2.netns, link.b.ifname))  # agg1_1, core2
            assert all(is_up(*e) for e in ends)
            out = fabriclab_cli(["fail", "agg1_1", "core2"], state, cluster, timeout_s=120)
            assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
            assert "link agg1_1-core2 down" in out.stdout and "cluster" in out.stdout, out.stdout
            assert not any(is_up(*e) for e in ends)  # each machine took its end down
            wait_for(lambda: link.name in status().get("links_down", []), 15,
                     "the controller to see the cut link down")
            out = fabriclab_cli(["restore", "agg1_1", "core2"], state, cluster, timeout_s=120)
            assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
            assert all(is_up(*e) for e in ends)
            wait_for(lambda: not status().get("links_down"), 15, "the link back up")
            bad = fabriclab_cli(["fail", "agg1_1", "core9"], state, cluster, timeout_s=120)
            assert bad.returncode != 0 and "core9" in bad.stdout + bad.stderr
        finally:
            up.send_signal(signal.SIGTERM)
            up.wait(timeout=180)
            reader.join(timeout=10)
            said = "".join(said_up)
        # Ray's own SIGTERM handler does not end it: the fabric is torn down on every machine
        assert up.returncode == 130 and "torn down" in said, said[-3000:]
        gone = fabriclab_cli(["fail", "agg1_1", "core2"], state, cluster, timeout_s=120)
        assert gone.returncode != 0 and "no running fabric" in (gone.stdout + gone.stderr), \
            gone.stdout[-1000:] + gone.stderr[-1000:]
    assert not cluster.errors, cluster.errors
