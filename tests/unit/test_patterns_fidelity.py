"""Traffic patterns, max-min fair shares, the ECMP expectation, and switch sharding."""

import dataclasses

import pytest

from testbed.errors import ConfigError
from testbed.plan.fidelity import capacities, ecmp_expectation, max_min_rates, switch_hops
from traffic.measure.transport import goodput_fraction
from testbed.model.topology import shard_switches
from testbed.model.builders import fat_tree, leaf_spine
from traffic.workloads.patterns import pattern_pairs


def _is_partial_permutation(pairs):
    srcs = [s for s, _ in pairs]
    dsts = [d for _, d in pairs]
    return len(set(srcs)) == len(srcs) and len(set(dsts)) == len(dsts)


@pytest.mark.parametrize("pattern,hops", [("same_edge", 1), ("same_pod", 3), ("cross_pod", 5)])
@pytest.mark.parametrize("k", [4, 6])
def test_pinned_patterns_have_the_expected_reach(pattern, hops, k):
    topo = fat_tree(k)
    pairs = pattern_pairs(topo, pattern)
    assert len(pairs) == len(topo.hosts)
    assert _is_partial_permutation(pairs)
    assert {switch_hops(topo, s, d) for s, d in pairs} == {hops}


def test_leaf_spine_patterns():
    topo = leaf_spine(3, 2, 2)
    assert {switch_hops(topo, s, d) for s, d in pattern_pairs(topo, "cross_pod")} == {3}
    assert {switch_hops(topo, s, d) for s, d in pattern_pairs(topo, "same_edge")} == {1}
    with pytest.raises(ConfigError, match="same_pod needs a fat_tree"):
        pattern_pairs(topo, "same_pod", field="workload.pattern")


def test_permutation_is_a_seeded_derangement_and_stride_wraps():
    topo = fat_tree(4)
    a = pattern_pairs(topo, "permutation", seed=7)
    assert a == pattern_pairs(topo, "permutation", seed=7) != pattern_pairs(topo, "permutation",
                                                                            seed=8)
    assert _is_partial_permutation(a) and all(s != d for s, d in a) and len(a) == 16
    hosts = [h.name for h in topo.hosts]
    assert pattern_pairs(topo, "stride", stride=4)[-1] == (hosts[-1], hosts[3])
    with pytest.raises(ConfigError) as err:
        pattern_pairs(topo, "stride", stride=16, field="traffic.stride")
    assert err.value.path == "traffic.stride"
    with pytest.raises(ConfigError, match="unknown pattern 'shuffle'"):
        pattern_pairs(topo, "shuffle")


def test_max_min_fair_shares():
    cap = {("a", "b"): 10.0, ("b", "c"): 4.0, ("c", "d"): 10.0}
    # flow 0 crosses both links; flows 1 and 2 one each: the b-c link is the bottleneck of 0, 2
    rates = max_min_rates([(("a", "b"), ("b", "c")), (("a", "b"),), (("b", "c"),)], cap)
    assert rates == pytest.approx([2.0, 8.0, 2.0])
    assert max_min_rates([(("c", "d"),)], cap) == [10.0]
    assert max_min_rates([], cap) == []


def test_ecmp_expectation_is_one_when_nothing_can_collide_and_less_otherwise():
    topo = fat_tree(4)
    assert ecmp_expectation(topo, pattern_pairs(topo, "same_edge")) == pytest.approx(1.0)
    cross = ecmp_expectation(topo, pattern_pairs(topo, "cross_pod"), trials=200)
    assert 0.45 < cross < 0.75  # 16 flows hashed onto 4 cores: collisions are the rule


def test_capacities_are_per_direction_and_goodput_fraction():
    topo = fat_tree(4, host_rate_mbps=10, fabric_rate_mbps=40)
    cap = capacities(topo)
    assert cap[("h1_1_1", "edge1_1")] == cap[("edge1_1", "h1_1_1")] == 10
    assert cap[("edge1_1", "agg1_1")] == 40
    assert goodput_fraction(1500) == pytest.approx(1448 / 1514)
    assert goodput_fraction(9000) == pytest.approx(8948 / 9014)


def test_shards_keep_pods_together_and_cover_every_switch_once():
    topo = fat_tree(4)
    shards = shard_switches(topo, 5)
    assert [len(s) for s in shards] == [4] * 5
    assert sorted(n for s in shards for n in s) == sorted(s.name for s in topo.switches)
    assert set(shards[0]) == {"agg1_1", "agg1_2", "edge1_1", "edge1_2"}
    assert len(shard_switches(topo, 100)) == 20
    with pytest.raises(ConfigError):
        shard_switches(topo, 0)


def test_mean_hops_and_the_fidelity_verdict():
    from testbed.plan.fidelity import (
        HEADROOM,
        assess,
        mean_switch_hops,
        saturation_mbit_hops,
    )

    assert mean_switch_hops(fat_tree(4)) == pytest.approx((1 * 1 + 2 * 3 + 12 * 5) / 15)
    assert mean_switch_hops(leaf_spine(2, 1, 2)) == pytest.approx((1 * 1 + 2 * 3) / 3)
    table = {1500: 700.0, 9000: 1600.0}
    assert saturation_mbit_hops(1500, table) == 700 and saturation_mbit_hops(9000, table) == 1600
    assert saturation_mbit_hops(5250, table) == pytest.approx(1150)
    assert saturation_mbit_hops(576, table) == 700
    v = assess(fat_tree(4, 10, 10), 9000, table)
    assert v.offered_mbit_hops == pytest.approx(16 * 10 * 67 / 15)
    assert v.fits and not v.overloaded
    assert v.max_rate_mbps == pytest.approx(HEADROOM * 1600 / (16 * 67 / 15))
    fast = assess(fat_tree(4, 100, 100), 9000, table)
    assert fast.overloaded and "16 hosts x 100 Mbit/s x 4.47 switch hops" in fast.explain()


def _samples(idle, vsw, sent_per_s, backlog):
    from testbed.plan.fidelity import FidelitySample
    return [FidelitySample(float(t), idle, {"ovs0": vsw}, {"p1": (int(sent_per_s * t), backlog)})
            for t in range(6)]


def test_a_run_is_ok_when_idle_cpu_remains_and_queued_ports_send_at_their_rate():
    from testbed.plan.fidelity import judge_fidelity
    # 10 Mbit/s port with 30 KB queued at every reading, sending 1.2 MB/s: 0.96 of its rate
    ok = judge_fidelity(_samples(45.0, 60.0, 1_200_000, 30_000), {"p1": 10e6}, 9018)
    assert ok["verdict"] == "ok" and ok["reasons"] == []
    assert ok["backlogged_rate"]["median"] == pytest.approx(0.96)
    assert ok["idle_pct"]["median"] == 45.0 and ok["vswitchd_pct"] == {"ovs0": 60.0}


def test_a_starved_machine_a_saturated_vswitchd_and_slow_queued_ports_each_degrade_a_run():
    from testbed.plan.fidelity import judge_fidelity
    bad = judge_fidelity(_samples(4.0, 99.0, 700_000, 30_000), {"p1": 10e6}, 9018)
    assert bad["verdict"] == "degraded" and len(bad["reasons"]) == 3
    assert "4 % idle" in bad["reasons"][0] and "ovs0 used 99 %" in bad["reasons"][1]
    assert "sent 0.56 of their rate" in bad["reasons"][2]
    # an idle port (nothing queued) says nothing about the emulator's pace
    quiet = judge_fidelity(_samples(50.0, 10.0, 10_000, 0), {"p1": 10e6}, 9018)
    assert quiet["verdict"] == "ok" and "backlogged_rate" not in quiet


def test_a_port_pfc_paused_in_an_interval_does_not_count_against_the_emulator():
    from testbed.plan.fidelity import FidelitySample, judge_fidelity
    samples = [FidelitySample(float(t), 50.0, {}, {"p1": (300_000 * t, 30_000)},
                              {"p1": 0.7 * t}) for t in range(6)]  # paused 70 % of the time
    verdict = judge_fidelity(samples, {"p1": 10e6}, 9018)
    assert verdict["verdict"] == "ok" and "backlogged_rate" not in verdict


def test_a_queue_that_drained_between_two_readings_does_not_count_as_standing():
    """Queued at both readings of a second but empty in a 50 ms queue sample between them (a
    fast link drains its queue in milliseconds): the port was not backlogged throughout, so
    its low rate says nothing about the emulator; the same port queued in every sample does."""
    from testbed.plan.fidelity import FidelitySample, judge_fidelity

    def samples(least):
        return [FidelitySample(float(t), 50.0, {}, {"p1": (6_000_000 * t, 60_000)}, {},
                               {"p1": least} if t else {}) for t in range(6)]
    drained = judge_fidelity(samples(0), {"p1": 100e6}, 9018)  # 0.48 of the rate
    assert drained["verdict"] == "ok" and "backlogged_rate" not in drained
    standing = judge_fidelity(samples(40_000), {"p1": 100e6}, 9018)
    assert standing["verdict"] == "degraded"
    assert standing["backlogged_rate"]["median"] == pytest.approx(0.48)


def test_a_degraded_links_port_is_judged_against_its_rate_now():
    """A 10 Mbit/s port degraded to half at 2 s, queued throughout, sends 0.6 MB/s from
    then on: 0.96 of its rate now, not 0.48 of the configured one; the interval in which the
    rate changed is left out."""
    from testbed.plan.fidelity import FidelitySample, judge_fidelity
    sent = [0, 1_200_000, 2_400_000, 3_000_000, 3_600_000, 4_200_000, 4_800_000]
    samples = [FidelitySample(float(t), 50.0, {}, {"p1": (sent[t], 30_000)}, {}, {},
                              {"p1": 0.5} if t >= 2 else {}) for t in range(7)]
    verdict = judge_fidelity(samples, {"p1": 10e6}, 9018)
    assert verdict["verdict"] == "ok", verdict
    assert verdict["backlogged_rate"]["intervals"] == 5  # 0-1 and 2-3 ... 5-6; not 1-2
    assert verdict["backlogged_rate"]["median"] == pytest.approx(0.96)
    blind = [dataclasses.replace(s, rate_factor={}) for s in samples]  # as judged before
    assert judge_fidelity(blind, {"p1": 10e6}, 9018)["verdict"] == "degraded"
