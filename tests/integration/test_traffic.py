"""Collectives run by real agents in the hosts, over TCP through the emulated fabric."""

from __future__ import annotations

import pytest

from testbed.errors import TestbedError
from tests.integration.conftest import experiment
from traffic.runner import Collective, run_job
from traffic.schedules import build

K4 = "version: 1\nfabric: {topology: fat_tree, k: 4}\n"  # 10 Mbit/s links, non-blocking
# dmodk pins every step of these collectives (shift permutations) onto disjoint paths, so the
# band below tests the emulation, not the luck of ECMP hashing
PINNED = K4 + "controller: {routing: dmodk}\n"
RANKS = ("h1_1_1", "h2_1_1", "h3_1_1", "h4_1_1")  # one per pod: every transfer crosses the core


def test_ring_all_reduce_and_all_to_all_complete_near_line_rate(make_fabric):
    fabric = make_fabric(experiment(PINNED))
    size = 2 << 20
    results = run_job(fabric, [Collective("all_reduce", RANKS, build("all_reduce", 4, size)),
                               Collective("all_to_all", RANKS, build("all_to_all", 4, size))],
                      connections=2, timeout_s=120)
    for res in results:
        print(f"{res.op}: {res.duration_s:.2f} s, busbw {res.busbw_gbps * 1e3:.2f} Mbit/s, "
              f"efficiency {res.efficiency:.3f}")
        assert res.bytes == size and res.ranks == list(RANKS)
        # one shaped path per rank pair at 10 Mbit/s: busbw close to the line rate
        assert 0.85 <= res.efficiency <= 1.05, res
        assert 0 < res.flow_completion_s["p50"] <= res.flow_completion_s["max"] <= res.duration_s


def test_a_stuck_rank_is_named(make_fabric):
    fabric = make_fabric(experiment(K4))
    fabric.set_link("h3_1_1", "edge3_1", up=False)  # rank 2 is cut off
    with pytest.raises(TestbedError) as err:
        run_job(fabric, [Collective("all_reduce", RANKS, build("all_reduce", 4, 1 << 20))],
                timeout_s=15)
    assert "rank 2 (h3_1_1)" in str(err.value) or "h3_1_1" in str(err.value)
