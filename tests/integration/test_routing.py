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
