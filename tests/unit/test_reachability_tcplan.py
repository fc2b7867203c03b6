"""Reachability scoring from fping output, and link-shaping plans."""

import pytest

from testbed.plan.reachability import evaluate, fping_command, parse_fping, probe_interval_ms
from testbed.plan.tcplan import GSO_MAX_BYTES, plan_shaping

FPING = """10.0.1.2 : xmt/rcv/%loss = 2/2/0%, min/avg/max = 0.10/0.12/0.15
10.0.2.1 : xmt/rcv/%loss = 2/1/50%, min/avg/max = 0.10/0.10/0.10
10.0.2.2 : xmt/rcv/%loss = 2/0/100%
"""


def test_parse_and_evaluate():
    assert parse_fping(FPING) == {"10.0.1.2": (2, 2, 0.12), "10.0.2.1": (2, 1, 0.10),
                                  "10.0.2.2": (2, 0, None)}
    expected = {"a": {"10.0.1.2": "b", "10.0.2.1": "c", "10.0.2.2": "d", "10.0.3.3": "e"}}
    result = evaluate(expected, {"a": FPING})
    assert (result.pairs, result.ok, result.sent, result.received) == (4, 1, 6, 3)
    assert result.failed == [("a", "c"), ("a", "d"), ("a", "e")]
    assert not result.complete
    assert result.summary() == ("reachability: 1/4 pairs (3 of 6 probes lost); "
                                "RTT per pair min/median/max 0.10/0.12/0.12 ms")


def test_complete_needs_zero_loss():
    ok = "10.0.0.1 : xmt/rcv/%loss = 3/3/0%\n"
    assert evaluate({"a": {"10.0.0.1": "b"}}, {"a": ok}).complete
    assert not evaluate({}, {}).complete


def test_probe_pacing():
    assert probe_interval_ms(16, 20) == 2  # k=4: 10,000 probes/s in all
    assert probe_interval_ms(128, 80) == 51  # k=8: 2,500 probes/s in all
    cmd = fping_command(["10.0.0.1"], 2, 5)
    assert cmd[:2] == ["fping", "-q"] and "10.0.0.1" in cmd and cmd[cmd.index("-i") + 1] == "5"


@pytest.mark.parametrize("rate", [10, 100, 1000, 10000])
def test_shaping_plan(rate):
    plan = plan_shaping(rate, 1500, queue_kb=128)
    assert plan.rate_kbit == rate * 1000
    assert plan.burst_bytes >= GSO_MAX_BYTES + 1500  # one TSO super-packet always fits
    assert plan.burst_bytes >= rate * 1e6 / 8 * 0.001
    assert (plan.queue_kind, plan.queue_limit) == ("bfifo", 128 * 1024)
    assert plan_shaping(rate, 9000, queue_packets=64).queue_kind == "pfifo"


def test_delay_or_loss_puts_netem_at_the_leaf_with_room_for_the_delay_line():
    from testbed.plan.tcplan import plan_shaping

    plain = plan_shaping(10, 9000, queue_kb=256)
    assert (plain.queue_kind, plain.delay_us) == ("bfifo", 0.0)
    delayed = plan_shaping(10, 9000, queue_kb=256, delay_us=2000)
    # 256 KiB of 9014-byte frames, plus 10 Mbit/s x 2 ms in flight on the delay line
    assert delayed.queue_kind == "netem" and delayed.delay_us == 2000
    assert delayed.queue_limit == -(-256 * 1024 // 9014) + int(10e6 / 8 * 0.002 / 9014) + 1
    # a link's loss is the eBPF program's, not netem's: no netem leaf for it
    assert plan_shaping(10, 1500, queue_packets=100).queue_kind == "pfifo"
