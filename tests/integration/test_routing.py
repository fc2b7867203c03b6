"""Routing modes on real switches: paths traced with ofproto/trace at every hop (deterministic:
no traffic, no timing)."""

from __future__ import annotations

import itertools

import pytest

from testbed.trace import flow_path
from tests.integration.conftest import experiment
from traffic.patterns import pattern_pairs

K4 = "version: 1\nfabric: {topology: fat_tree, k: 4}\n"


def _uplinks_used_by_aggs(fabric, flows: int = 32) -> dict[str, set[str]]:
    """For flows h1_1_1 -> h3_1_1 with distinct source ports: agg -> cores it sent them to."""
    used: dict[str, set[str]] = {}
    for sport in range(20000, 20000 + flows):
        path = flow_path(fabric, "h1_1_1", "h3_1_1", "tcp", sport, 5201)
        used.setdefault(path[2], set()).add(path[3])
    return used


@pytest.mark.parametrize("seed", ["per_switch", "shared"])
def test_ecmp_seed_decides_whether_the_fabric_polarizes(make_fabric, seed):
    fabric = make_fabric(experiment(K4 + f"controller: {{ecmp_seed: {seed}}}\n"))
    used = _uplinks_used_by_aggs(fabric)
    assert set(used) == {"agg1_1", "agg1_2"}, "the edge switch must spread flows over both aggs"
    if seed == "shared":
        # the agg hashes exactly like the edge below it: every flow it gets lands on one bucket
        assert all(len(cores) == 1 for cores in used.values()), used
    else:
        assert all(len(cores) == 2 for cores in used.values()), used


def test_dmodk_pins_shift_permutations_onto_disjoint_paths(make_fabric):
    fabric = make_fabric(experiment(K4 + "controller: {routing: dmodk}\n"))
    for pattern in ("same_pod", "cross_pod"):
        hops = []
        for n, (src, dst) in enumerate(pattern_pairs(fabric.topo, pattern)):
            path = flow_path(fabric, src, dst, "tcp", 30000 + n, 5201)
            hops += list(itertools.pairwise(path))
        assert len(hops) == len(set(hops)), f"{pattern}: flows share a link direction"


LS = ("version: 1\nfabric:\n  topology: leaf_spine\n  leaves: 2\n  spines: 2\n"
      "  hosts_per_leaf: 2\n  host_link: {rate_mbps: 10}\n  fabric_link: {rate_mbps: 10}\n")


def test_adaptive_routing_gives_each_elephant_its_own_uplink(make_fabric):
    """Two flows leave each leaf for the other: per-flow ECMP puts both on one uplink half the
    time; adaptive routing learns them, sees two elephants, and pins one to each uplink (the
    switches' per-port counters show the split)."""
    from testbed.congestion import summarize_congestion  # noqa: F401 - counters' shape
    from traffic.runner import run_job

    exp = experiment(LS + "controller: {routing: adaptive, poll_interval_s: 0.5}\n"
                          "workload:\n  collectives:\n"
                          "    - {op: flows, pattern: cross_pod, size: 8MiB}\n")
    fabric = make_fabric(exp)
    (job,) = exp.workload.jobs
    before = fabric.congestion()
    (result,) = run_job(fabric, list(job.collectives), connections=1, timeout_s=120)
    after = fabric.congestion()
    status = fabric.controller_status()["adaptive"]
    print(status, result.efficiency)
    for leaf in ("leaf1", "leaf2"):
        up = [after[p]["queue"]["bytes"] - before[p]["queue"]["bytes"]
              for p in (f"{leaf}-eth3", f"{leaf}-eth4")]
        assert min(up) > 0.3 * sum(up), (leaf, up)
    assert status["placements"] >= 4 and status["flows"] >= 4
    # from the last sample in which it had not sent (an upper bound of when it started) to its
    # pinning: within two polls (plus the round's own latency)
    assert max(status["reaction_s"]) <= 2 * 0.5 + 0.1, status
    assert result.efficiency > 0.8, result
