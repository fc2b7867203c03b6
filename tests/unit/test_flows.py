"""Per-transfer records: a transfer's times alone on the idle fabric (as emulated, and at
line rate), slowdown, and the size bins of the slowdown tables (traffic/measure/flows.py)."""

from __future__ import annotations

import pytest

from testbed.model.builders import fat_tree, leaf_spine
from testbed.model.congestion import frame_bytes
from testbed.plan.tcplan import GSO_MAX_BYTES, htb_burst_bytes
from traffic.measure.flows import (FlowResult, IdealFct, ideal_fct_s, line_rate_fct_s,
                                   size_bin, slowdown_by_size)
from traffic.measure.transport import goodput_fraction

G = goodput_fraction(9000)


def test_at_line_rate_a_transfer_takes_its_wire_bytes_at_the_narrowest_rate_plus_one_frame_per_other_hop():
    frame = frame_bytes(9000)
    # 3 links of 100, 50 and 100 Mbit/s, 10 us each: 1 MB at 50 Mbit/s, one frame's
    # store-and-forward at each 100 Mbit/s link, 30 us of propagation
    got = line_rate_fct_s(1_000_000, [(100, 1, 10, 0), (50, 1, 10, 0), (100, 1, 10, 0)],
                          9000, G)
    assert got == pytest.approx(1_000_000 / G * 8 / 50e6 + 2 * frame * 8 / 100e6 + 30e-6)
    # a transfer shorter than a frame forwards its own bytes at every hop
    small = line_rate_fct_s(100, [(100, 1, 0, 0), (100, 1, 0, 0)], 9000, G)
    assert small == pytest.approx(2 * 100 / G * 8 / 100e6)
    assert line_rate_fct_s(0, [(100, 1, 5, 0)], 9000, G) == pytest.approx(5e-6)
    assert line_rate_fct_s(10, [], 9000, G) == 0.0


def test_alone_on_idle_emulated_links_each_link_passes_its_allowance_at_once_and_the_rest_at_its_rate():
    # 1 MB over 100 and 50 Mbit/s links passing 100 kB at once: the 50 Mbit/s one decides
    links = [(100, 1, 10, 100_000), (50, 1, 10, 100_000)]
    assert ideal_fct_s(1_000_000, links, G) == pytest.approx(
        (1_000_000 / G - 100_000) * 8 / 50e6 + 20e-6)
    # shorter than the allowance: the propagation alone
    assert ideal_fct_s(50_000, links, G) == pytest.approx(20e-6)
    # never above the line-rate time
    for n in (1, 10_000, 1 << 20, 1 << 26):
        assert ideal_fct_s(n, links, G) <= line_rate_fct_s(n, links, 9000, G)


def test_on_a_clos_the_mean_path_counts_and_equal_cost_links_never_make_the_bound_slower():
    topo = fat_tree(4, 100, 100)
    ideal = IdealFct(topo, {"host": 2.0, "fabric": 3.0}, 9000, G)
    hosts = [h.name for h in topo.hosts]
    n = 4 << 20
    line = n / G * 8 / 100e6  # the host link is the narrowest
    frame = frame_bytes(9000) * 8 / 100e6
    allowance = (htb_burst_bytes(100, 9000) + GSO_MAX_BYTES) * 8 / 100e6
    # h - edge - h: 2 host links; across pods: 2 host links and 4 fabric hops
    same_edge, other_pod = ideal(hosts[0], hosts[1], n), ideal(hosts[0], hosts[-1], n)
    assert same_edge == pytest.approx((line - allowance + 4e-6, line + frame + 4e-6))
    assert other_pod == pytest.approx((line - allowance + 16e-6, line + 5 * frame + 16e-6))
    # 2:1 oversubscribed leaf-spine: half the bytes over each spine's 50 Mbit/s links, so the
    # fluid bound's narrowest rate is still the host link's (one connection on one path
    # would take twice that: its slowdown says what the spread did not give it)
    ls = leaf_spine(2, 2, 4, 100, 50)
    lone = IdealFct(ls, {}, 1500, goodput_fraction(1500))
    a, b = ls.hosts[0].name, ls.hosts[-1].name
    f = frame_bytes(1500) * 8
    # store-and-forward: 2 host links (f/100) and 4 fabric links carrying half (0.5 f/50 each)
    # less the narrowest's own frame (f/100)
    assert lone(a, b, n)[1] == pytest.approx(n / goodput_fraction(1500) * 8 / 100e6
                                             + 2 * f / 100e6 + 4 * 0.5 * f / 50e6 - f / 100e6)


def test_slowdown_is_fct_over_ideal_and_bins_by_size():
    f = FlowResult("a", "b", 0, 4096, 0.5, 0.8, 0.1, 3)
    assert f.fct_s == pytest.approx(0.3) and f.slowdown == pytest.approx(3.0)
    assert FlowResult("a", "b", 0, 1, 0.0, 1.0).slowdown is None  # no ideal known
    assert [size_bin(n) for n in (1, 10 * 1024, 10 * 1024 + 1, 1 << 20, 5 << 20, 11 << 20)] == [
        "<=10KiB", "<=10KiB", "<=100KiB", "<=1MiB", "<=10MiB", ">10MiB"]
    table = slowdown_by_size([(100, 1.0), (200, 3.0), (50 << 20, 1.2)])
    assert list(table) == ["<=10KiB", ">10MiB"]  # in size order, empty bins left out
    assert table["<=10KiB"] == {"flows": 2, "p50": 1.0, "p99": 3.0, "max": 3.0}


def test_a_sender_that_paces_itself_gets_only_its_own_lead_and_a_frame_ahead_of_the_line():
    topo = fat_tree(4, 100, 100)
    hosts = [h.name for h in topo.hosts]
    n = 4 << 20
    unpaced = IdealFct(topo, {}, 9000, G)(hosts[0], hosts[1], n)[0]
    paced = IdealFct(topo, {}, 9000, G, ahead_bytes=20_000)(hosts[0], hosts[1], n)[0]
    assert paced == pytest.approx((n / G - 20_000 - frame_bytes(9000)) * 8 / 100e6)
    assert unpaced < paced
