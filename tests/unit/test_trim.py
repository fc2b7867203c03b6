"""Packet trimming's decision (testbed/plan/trim.py), the reference of the eBPF egress
program: a full queue or one over the threshold trims a trimmable packet to its headers, the
trimmed header itself is dropped only when even it does not fit; untrimmable packets and ports
without trimming drop as before."""

from __future__ import annotations

import pytest

from testbed.errors import ConfigError
from testbed.plan.trim import (ETH_IP_UDP_BYTES, TRANSPORT_HEADER_BYTES, Action, TrimSpec,
                               decide)
from traffic.transports.packet import HEADER

LIMIT, MTU = 64_000, 9000


@pytest.mark.parametrize("backlog, threshold, trimmable, expected", [
    (0, None, True, (Action.FORWARD, MTU)),              # no trimming: as before
    (60_000, None, True, (Action.DROP, 0)),
    (0, 32_000, True, (Action.FORWARD, MTU)),            # under the threshold
    (40_000, 32_000, True, (Action.TRIM, 128)),          # over it: trimmed, queued
    (60_000, 32_000, True, (Action.TRIM, 128)),          # full: trimmed instead of dropped
    (63_950, 32_000, True, (Action.DROP, 0)),            # not even the header fits
    (40_000, 32_000, False, (Action.FORWARD, MTU)),      # not trimmable: forwarded
    (60_000, 32_000, False, (Action.DROP, 0)),           # ... or dropped when full
])
def test_a_port_trims_what_it_would_drop_or_queue_past_the_threshold(backlog, threshold,
                                                                     trimmable, expected):
    assert decide(backlog, MTU, LIMIT, threshold, 128, trimmable) == expected


def test_a_packet_no_longer_than_the_trimmed_size_is_never_trimmed():
    assert decide(40_000, 100, LIMIT, 32_000, 128, True) == (Action.FORWARD, 100)
    assert decide(63_950, 100, LIMIT, 32_000, 128, True) == (Action.DROP, 0)


def test_the_trimmed_size_holds_every_header_and_settings_are_checked():
    assert TRANSPORT_HEADER_BYTES == HEADER.size  # the transports' own, kept whole
    TrimSpec(threshold_kb=32).check("fabric.host_link.trim", LIMIT)
    for spec, field in ((TrimSpec(size_b=ETH_IP_UDP_BYTES + 40), "size_b"),
                        (TrimSpec(dscp=64), "dscp"), (TrimSpec(threshold_kb=64), "threshold_kb"),
                        (TrimSpec(threshold_kb=0), "threshold_kb")):
        with pytest.raises(ConfigError) as err:
            spec.check("fabric.host_link.trim", LIMIT)
        assert err.value.path == f"fabric.host_link.trim.{field}", err.value
    assert TrimSpec().threshold_bytes(LIMIT) == LIMIT
    assert TrimSpec(threshold_kb=16).threshold_bytes(LIMIT) == 16 * 1024
    assert TrimSpec(priorities=(3,)).trims(3) and not TrimSpec(priorities=(3,)).trims(0)
