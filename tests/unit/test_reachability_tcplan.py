"""Reachability scoring from fping output, and link-shaping plans."""

import pytest

from testbed.reachability import evaluate, fping_command, parse_fping, probe_interval_ms
from testbed.tcplan import GSO_MAX_BYTES, plan_shaping

FPING = """10.0.1.2 : xmt/rcv/%loss = 2/2/0%, min/avg/max = 0.10/0.12/0.15
10.0.2.1 : xmt/rcv/%loss = 2/1/50%, min/avg/max = 0.10/0.10/0.10
10.0.2.2 : xmt/rcv/%loss = 2/0/100%
"""


def test_parse_and_evaluate():
    assert parse_fping(FPING) == {"10.0.1.2": (2, 2), "10.0.2.1": (2, 1), "10.0.2.2": (2, 0)}
    expected = {"a": {"10.0.1.2": "b", "10.0.2.1": "c", "10.0.2.2": "d", "10.0.3.3": "e"}}
    result = evaluate(expected, {"a": FPING})
    assert (result.pairs, result.ok, result.sent, result.received) == (4, 1, 6, 3)
    assert result.failed == [("a", "c"), ("a", "d"), ("a", "e")]
    assert not result.complete
    assert result.summary().startswith("reachability: 1/4 pairs")


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
