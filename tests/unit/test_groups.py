"""Groups as the eBPF datapath applies them (testbed/plan/groups.py): the flow hash is FNV-1a
as specified (so C can match it), weights share the flows out in proportion, a dead bucket gets
nothing, the basis decides whether two tiers polarize, fast failover takes the first live
port."""

from __future__ import annotations

import random

import pytest

from testbed.plan.groups import apply_group, fast_failover, flow_hash, select_bucket


def test_the_hash_is_fnv1a_then_murmurs_finalizer_in_network_order():
    # the reference, step by step over bytes 00000007 0a010101 0a020101 06 1f90 0050
    data = bytes.fromhex("00000007" "0a010101" "0a020101" "06" "1f90" "0050")
    h = 2166136261
    for b in data:
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    h ^= h >> 16
    assert flow_hash(7, "10.1.1.1", "10.2.1.1", 6, 8080, 80) == h == 0xcbbede1b
    # pinned, for the datapath's C to reproduce
    assert flow_hash(0, "10.0.0.1", "10.0.0.2", 17, 49152, 4791) == 0x933538
    assert flow_hash(8, "10.1.1.1", "10.2.1.1", 6, 8080, 80) != h


def test_weights_share_the_flows_in_proportion_and_a_dead_bucket_gets_none():
    rng = random.Random(3)
    counts = [0, 0, 0]
    for _ in range(30000):
        pkt = {"ipv4_src": f"10.1.1.{rng.randrange(1, 255)}", "ipv4_dst": "10.2.1.1",
               "ip_proto": 17, "udp_src": rng.randrange(1, 65536), "udp_dst": 4791}
        counts[[1, 2, 3].index(apply_group("select", [1, 2, 3], [1, 2, 1], 11, pkt,
                                           lambda p: True))] += 1
    shares = [c / sum(counts) for c in counts]
    assert shares == pytest.approx([0.25, 0.5, 0.25], abs=0.02), shares
    pkt = {"ipv4_src": "10.1.1.1", "ipv4_dst": "10.2.1.1", "ip_proto": 6, "tcp_src": 1,
           "tcp_dst": 2}
    assert all(apply_group("select", [1, 2, 3], [1, 2, 1], b, pkt, lambda p: p != 2) in (1, 3)
               for b in range(200))
    assert apply_group("select", [1, 2], [], 0, pkt, lambda p: False) is None
    assert select_bucket([0, 0], 5) is None and select_bucket([0, 3], 5) == 1


def test_a_shared_basis_polarizes_two_tiers_and_per_switch_bases_do_not():
    rng = random.Random(5)
    flows = [{"ipv4_src": "10.1.1.1", "ipv4_dst": f"10.{rng.randrange(2, 9)}.1.1", "ip_proto": 6,
              "tcp_src": rng.randrange(1024, 65536), "tcp_dst": 5001} for _ in range(4000)]

    def second_tier_spread(basis1: int, basis2: int) -> int:
        """Of the flows the first switch sends to bucket 0, how many buckets of 2 the next
        switch uses."""
        first = [f for f in flows if apply_group("select", [0, 1], [], basis1, f,
                                                 lambda p: True) == 0]
        return len({apply_group("select", [0, 1], [], basis2, f, lambda p: True)
                    for f in first})

    assert second_tier_spread(9, 9) == 1  # the same hash: all to one uplink (polarized)
    assert second_tier_spread(9, 10) == 2


def test_fast_failover_takes_the_first_live_port():
    assert fast_failover([3, 1, 2], lambda p: p != 3) == 1
    assert fast_failover([3, 1], lambda p: False) is None
    assert apply_group("ff", [4, 5], [], 0, {}, lambda p: p == 5) == 5


def test_a_switch_forwards_by_its_best_entry_then_its_group_over_live_ports():
    from testbed.model.openflow import FlowEntry, GroupEntry
    from testbed.plan.groups import forward

    flows = [FlowEntry(100, (("eth_type", 0x0800), ("ipv4_dst", ("10.2.0.0", "255.255.0.0"))),
                       (("group", 1),)),
             FlowEntry(200, (("eth_type", 0x0800), ("ipv4_dst", ("10.1.1.2", "255.255.255.255"))),
                       (("output", 1),)),
             FlowEntry(0, (), (("output", "controller"),))]
    ff = {1: GroupEntry(1, (3, 4), kind="ff")}
    packet = {"eth_type": 0x0800, "ipv4_src": "10.1.1.2", "ipv4_dst": "10.2.1.1",
              "ip_proto": 17, "udp_src": 5000, "udp_dst": 7000, "in_port": 1}
    assert forward(flows, ff, lambda p: True, packet) == 3
    assert forward(flows, ff, lambda p: p != 3, packet) == 4  # its first live port
    assert forward(flows, ff, lambda p: False, packet) is None
    assert forward(flows, ff, lambda p: True, {**packet, "ipv4_dst": "10.1.1.2"}) == 1
    # to the controller only (the table-miss entry): not forwarded
    assert forward(flows, ff, lambda p: True, {**packet, "ipv4_dst": "10.9.9.9"}) is None
