"""A run on a cluster, its pure parts: the cluster section, what a cluster refuses, the
machines' budgets, one fidelity verdict and one timeline from every machine's."""

from __future__ import annotations

import sys

import pytest

from fabriclab.model import experiment as xp
from testbed.errors import ConfigError
from testbed.plan.fidelity import (HEADROOM, machine_budget_mbit_hops, merge_fidelity,
                              merge_timelines, saturation_mbit_hops)
from testbed.model.partition import Machine, check_cluster_spec, cut_links, machine_part, partition
from testbed.model.builders import fat_tree

BASE = {"version": 1, "fabric": {"topology": "fat_tree", "k": 4},
        "workload": {"collectives": [{"op": "all_reduce", "size": "1MiB", "ranks": 4}]}}


def test_the_cluster_section_names_the_ray_head_and_bad_values_name_the_field():
    exp = xp.parse({**BASE, "cluster": {"address": "10.0.0.1:6379", "machines": 2}})
    assert exp.cluster.address == "10.0.0.1:6379" and exp.cluster.machines == 2
    assert xp.parse(BASE).cluster is None
    for bad, field in (({"address": "10.0.0.1"}, "cluster.address"),
                       ({"address": "h:1", "machines": 0}, "cluster.machines"),
                       ({"machines": 2}, "cluster"),
                       ({"address": "h:1", "nodes": 2}, "cluster")):
        with pytest.raises(ConfigError) as err:
            xp.parse({**BASE, "cluster": bad})
        assert err.value.path.startswith(field), err.value


def test_cluster_on_the_command_line_sets_the_address_of_every_variant(tmp_path):
    path = tmp_path / "e.yaml"
    path.write_text("version: 1\nfabric: {topology: fat_tree, k: 4}\ncluster: {address: a:1, "
                    "machines: 3}\nworkload: {collectives: [{op: all_reduce, size: 1MiB, "
                    "ranks: 4}]}\nvariants: [{name: v, set: {controller.routing: dmodk}}]\n")
    exp = xp.load(path, cluster="10.1.2.3:6379")
    assert exp.cluster.address == "10.1.2.3:6379" and exp.cluster.machines == 3
    assert exp.variants[0].cluster == exp.cluster
    assert exp.raw["cluster"]["address"] == "10.1.2.3:6379"  # experiment.json says so


def test_what_a_cluster_does_not_offer_yet_is_refused_by_field():
    pfc = xp.parse({**BASE, "fabric": {**BASE["fabric"], "pfc": {"priorities": [3]},
                                       "traffic_classes": {"dscp_to_priority": {26: 3}}}})
    with pytest.raises(ConfigError) as err:
        check_cluster_spec(pfc)
    assert err.value.path == "fabric.pfc"
    check_cluster_spec(xp.parse(BASE))
    # link failures are: each machine fails its ends (a cut link's on both machines)
    check_cluster_spec(xp.parse({**BASE, "failures": [{"at_s": 1, "link": ["agg1_1", "core1"],
                                                         "action": "down"}]}))


def test_a_machines_budget_scales_with_its_cores():
    assert machine_budget_mbit_hops(9000, 2) == HEADROOM * saturation_mbit_hops(9000)
    assert machine_budget_mbit_hops(9000, 8) == 4 * machine_budget_mbit_hops(9000, 2)
    assert machine_budget_mbit_hops(1500, 0) == machine_budget_mbit_hops(1500, 1)


def test_a_machine_part_knows_its_nodes_and_the_coordinator_builds_none():
    topo = fat_tree(4, 10, 10)
    plan = partition(topo, [Machine("m1", 800), Machine("m2", 800)])
    tunnels = cut_links(plan, {"m1": "10.0.0.1", "m2": "10.0.0.2"}, 9000,
                        {"m1": 9050, "m2": 9050})
    parts = [machine_part(topo, plan, tunnels, m) for m in ("m1", "m2")]
    assert parts[0].nodes | parts[1].nodes == set(topo.nodes)
    assert not parts[0].nodes & parts[1].nodes
    assert all(sw in parts[0].nodes for sw in parts[0].switches)


def _report(verdict: str, idle: float, reasons=()) -> dict:
    return {"samples": 5, "idle_pct": {"median": idle, "min": idle - 10},
            "vswitchd_pct": {"ovs0": 3.0}, "verdict": verdict, "reasons": list(reasons)}


def test_one_machine_degraded_degrades_the_run_naming_it():
    merged = merge_fidelity({"m1": _report("ok", 70), "m2": _report(
        "degraded", 5, ["the machine was 5 % idle (median)"])})
    assert merged["verdict"] == "degraded"
    assert merged["reasons"] == ["m2: the machine was 5 % idle (median)"]
    assert merged["idle_pct"] == {"median": 5, "min": -5}
    assert set(merged["machines"]) == {"m1", "m2"}
    assert merge_fidelity({"m1": _report("ok", 70), "m2": _report("ok", 60)})["verdict"] == "ok"
    assert merge_fidelity({"m1": {}}) == {}


def test_the_machines_timelines_are_one_sample_by_sample():
    def timeline(port: str, idle: list[float]) -> dict:
        return {"interval_s": 1.0, "fields": ["sent_bytes"],
                "ports": {port: {"node": "x"}},
                "samples": [{"t_s": float(i), "idle_pct": v, "vswitchd_pct": {"ovs0": 1.0},
                             "ports": {port: [i * 100]}} for i, v in enumerate(idle)]}

    merged = merge_timelines({"m1": timeline("a", [50, 40, 30]), "m2": timeline("b", [60, 20])})
    assert set(merged["ports"]) == {"a", "b"}
    assert len(merged["samples"]) == 2  # as many as every machine has
    assert [s["idle_pct"] for s in merged["samples"]] == [50, 20]
    assert merged["samples"][1]["ports"] == {"a": [100], "b": [100]}
    assert set(merged["samples"][0]["vswitchd_pct"]) == {"m1/ovs0", "m2/ovs0"}


def test_a_machines_failure_is_its_root_cause_without_rays_framing():
    from testbed.cluster.machines import cluster_versions, root_cause

    text = ("The actor died because of an error raised in its creation task, \x1b[36mray::"
            "MachineAgent.__init__()\x1b[39m (pid=1, ip=10.250.0.2)\n  ^^^^^\nRuntimeError: "
            "The actor with name MachineAgent failed to import on the worker. This may be "
            "because needed library dependencies are not installed in the worker environment:"
            "\n\n\x1b[36mray::MachineAgent.__init__()\x1b[39m\nModuleNotFoundError: No module "
            "named 'testbed.cluster.machines'\n")
    assert root_cause(text) == "ModuleNotFoundError: No module named 'testbed.cluster.machines'"
    assert root_cause("lost\n\n") == "lost" and root_cause("") == "no detail"
    mismatch = ("Version mismatch: The cluster was started with:\n    Ray: 2.60.0\n    Python: "
                "3.11.2\nThis process on node 10.250.0.1 was started with:\n    Ray: 2.59.0\n"
                "    Python: 3.11.2\n")
    assert cluster_versions(mismatch) == "Ray 2.60.0 (Python 3.11.2)"
    assert cluster_versions("Version mismatch somewhere") == ""


def test_a_head_nobody_listens_at_is_said_at_once():
    import socket
    import time

    from testbed.cluster.machines import _reach_head
    from testbed.errors import TestbedError

    with socket.socket() as sock:  # a port of loopback that was free a moment ago
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(TestbedError, match=f"cannot reach the Ray cluster's head at "
                                           f"127.0.0.1:{port}: Connection refused"):
        _reach_head(f"127.0.0.1:{port}")
    assert time.monotonic() - start < 2.0


def test_up_on_a_cluster_without_ray_names_the_extra_to_install(monkeypatch, capsys):
    """``fabriclab up --cluster`` where Ray is not installed: one error naming the 'cluster'
    extra, exit 3, nothing built (Ray is imported only when a cluster is joined)."""
    from pathlib import Path

    from fabriclab.cli import main as cli

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray: ImportError
    quickstart = Path(__file__).resolve().parents[2] / "experiments" / "quickstart.yaml"
    code = cli.main(["up", str(quickstart), "--check", "--backend", "host",
                     "--cluster", "127.0.0.1:1"])
    out = capsys.readouterr().err  # errors go to stderr
    assert code == 3, out
    assert "'cluster' extra" in out and "fabriclab[cluster]" in out, out
