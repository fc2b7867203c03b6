"""Switch-local adaptive routing in the eBPF switch (testbed/linux/progs/switch.c), checked
against its pure reference (testbed/plan/localroute.py) on one switch of three hosts: the
least-loaded choice per packet and per flowlet, flowlets leaving a port their flow's
acknowledgements echoed congestion on, reactive rebalancing and its walk, and the choice
weighing the next switch."""

from __future__ import annotations

import time

from controllers.routing.tables import FlowEntry
from testbed.plan import tss
from tests.integration.ebpfstar import (  # noqa: F401
    RATE_BYTES_S,
    route,
    send_tcp,
    send_udp,
    star,
    tx,
)


def test_a_flowlet_leaves_the_port_its_acknowledgements_echoed_congestion_on(star):
    """A TCP flow's flowlet on idle ports: after a gap it keeps its port (the tie's); after an
    acknowledgement of it passed the switch with ECE set, its next flowlet takes the other
    port (testbed/plan/localroute.py's echo)."""
    from testbed.plan.localroute import ECHO_HOLD_GAPS

    tag, switches = star
    gap_s = 0.1
    switches.set_group(7, 8, "select", [2, 3], selection="flowlet", gap_us=int(gap_s * 1e6))
    switches.set_table(7, tss.compile_table([route(3, (("group", 8),)),
                                             route(1, (("output", 1),)), FlowEntry(0, (), ())]))

    def sent(count: int, flags: int = 0x10) -> dict[int, int]:
        before = {p: tx(tag, p) for p in (2, 3)}
        send_tcp(tag, 1, 3, count, 40002, 5201, flags, payload=100)  # data segments
        return {p: tx(tag, p) - before[p] for p in (2, 3)}

    first = sent(3)
    port = max(first, key=first.get)
    assert first[port] >= 3 and first[5 - port] == 0, first
    time.sleep(gap_s * (ECHO_HOLD_GAPS + 1))  # a new flowlet, no echo: the same tie
    again = sent(3)
    assert again[port] >= 3 and again[5 - port] == 0, again
    time.sleep(gap_s * (ECHO_HOLD_GAPS + 1))  # past the hold after that choice
    # the receiver's acknowledgement with ECE, the other way through the switch
    send_tcp(tag, 3, 1, 1, 5201, 40002, 0x10 | 0x40)
    time.sleep(gap_s * 1.5)
    moved = sent(3)
    assert moved[5 - port] >= 3 and moved[port] == 0, (port, moved)


def test_local_adaptive_selection_follows_the_reference(star):
    """The datapath's switch-local choice against testbed/plan/localroute.py: with one port's
    queue loaded, every packet (``packet``) or a new flowlet takes the other; a flowlet keeps
    its port while its packets come within the gap, and moves after a longer one."""
    from testbed.plan.localroute import PortLoad, least_loaded

    tag, switches = star
    busy = RATE_BYTES_S  # a second's worth of queue: busy for the whole test step
    table = [route(3, (("group", 5),)), FlowEntry(0, (), ())]
    switches.set_table(7, tss.compile_table(table))

    def load(port_busy: int) -> None:
        now = time.monotonic_ns()
        for port in (2, 3):
            switches.set_port_load(7, port, RATE_BYTES_S, busy if port == port_busy else 0, now)

    def reference(port_busy: int) -> int:
        now = time.monotonic_ns()
        loads = {p: PortLoad(RATE_BYTES_S, busy if p == port_busy else 0, now) for p in (2, 3)}
        return least_loaded([2, 3], lambda p: True, lambda p: loads[p].delay_ns(now), h=0)

    def sent(count: int, **kw) -> dict[int, int]:
        before = {p: tx(tag, p) for p in (2, 3)}
        send_udp(tag, 1, 3, count, **kw)
        return {p: tx(tag, p) - before[p] for p in (2, 3)}

    switches.set_group(7, 5, "select", [2, 3], selection="packet")
    for port_busy in (2, 3):
        load(port_busy)
        want = reference(port_busy)
        got = sent(20)
        assert got[want] >= 20 and got[5 - want] == 0, (port_busy, got)
    # a flowlet: placed by load, then kept while its packets come closer than the gap
    switches.set_group(7, 6, "select", [2, 3], selection="flowlet", gap_us=200_000)
    switches.set_table(7, tss.compile_table([route(3, (("group", 6),)), FlowEntry(0, (), ())]))
    load(2)
    first = sent(5, sport=40001, gap_s=0.01)
    assert first[3] >= 5 and first[2] == 0, first
    load(3)  # the other port is now the less loaded: the flowlet stays (no gap yet)
    kept = sent(5, sport=40001, gap_s=0.01)
    assert kept[3] >= 5 and kept[2] == 0, kept
    time.sleep(0.3)  # longer than the gap: the next packet starts a new flowlet
    load(3)
    moved = sent(5, sport=40001, gap_s=0.01)
    assert moved[2] >= 5 and moved[3] == 0, moved
    state = switches.port_load(7, 2)
    assert state.rate_bytes_s == RATE_BYTES_S and state.level > 0  # its packets counted


def test_a_rebalancing_flowlet_leaves_a_busy_path_after_its_hold_as_the_reference(star):
    """Reactive rebalancing (at a chance of 100 %): a flowlet on a port whose rate estimate
    says another flow fills it stays there while held (a gap since its choice), and moves to
    the idle port at its first packet past the hold, before any gap, as
    testbed/plan/localroute.py's Rebalancing decides on the datapath's estimates; its bytes
    move with it."""
    from testbed.plan.localroute import RECENT_BYTES, Flowlet, PortLoad, Rebalancing

    tag, switches = star
    gap_s, rate = 3.0, 256 * 1024  # a slow port: its rate window a second long
    switches.set_group(7, 9, "select", [2, 3], selection="flowlet", gap_us=int(gap_s * 1e6),
                       rebalance=(25, 100))
    switches.set_table(7, tss.compile_table([route(3, (("group", 9),)), FlowEntry(0, (), ())]))

    def fill(port: int) -> None:  # another flow's worth of bytes lately, as of now
        switches.set_port_load(7, port, rate, last_ns=time.monotonic_ns(),
                               recent=RECENT_BYTES)

    def sent(count: int = 1) -> dict[int, int]:
        before = {p: tx(tag, p) for p in (2, 3)}
        send_udp(tag, 1, 3, count, sport=40009)
        return {p: tx(tag, p) - before[p] for p in (2, 3)}

    switches.set_port_load(7, 3, rate, rate, time.monotonic_ns())  # queued
    switches.set_port_load(7, 2, rate)
    first = sent()
    assert first[2] == 1 and first[3] == 0, first  # placed by the queues: port 2
    switches.set_port_load(7, 3, rate)
    time.sleep(0.5)
    fill(2)
    held = sent()
    assert held[2] == 1 and held[3] == 0, held  # held: no move within a gap of its choice
    time.sleep(gap_s - 0.3)  # past the hold, within the gap
    fill(2)
    # the reference on the datapath's estimates as they are, its flowlet a datagram's bytes
    # sent lately: its path full, the other idle, it moves
    now = time.monotonic_ns()
    loads = {p: PortLoad(rate, last_ns=(got := switches.port_load(7, p)).last_ns,
                         recent=got.recent) for p in (2, 3)}
    reference = Rebalancing(25, 100, loads, {}, lambda: 0)
    assert reference.moved(Flowlet(2, now, 0, 300), [2, 3], lambda p: True, now,
                           int(gap_s * 1e9), None) == 3
    moved = sent()
    assert moved[3] == 1 and moved[2] == 0, moved
    state = {p: switches.port_load(7, p).recent for p in (2, 3)}
    assert state[3] >= 142, state  # its bytes went with it (and its next datagram's)
    kept = sent(3)  # held again from the move
    assert kept[3] == 3 and kept[2] == 0, kept


def test_a_flowlet_pushed_beside_it_moves_within_its_hold_and_pushes_on_as_the_reference(star):
    """Rebalancing's walk (at a chance of 100 %): a flowlet whose path another flow was moved
    onto after its choice (pushed) moves at once, within its hold, to a path no busier though
    a flow is on it, and marks that path pushed; the reference decides the same on the
    datapath's estimates."""
    from testbed.plan.localroute import RECENT_BYTES, Flowlet, PortLoad, Rebalancing

    tag, switches = star
    gap_s, rate = 3.0, 256 * 1024  # a slow port: its rate window a second long
    switches.set_group(7, 9, "select", [2, 3], selection="flowlet", gap_us=int(gap_s * 1e6),
                       rebalance=(25, 100))
    switches.set_table(7, tss.compile_table([route(3, (("group", 9),)), FlowEntry(0, (), ())]))

    def sent() -> dict[int, int]:
        before = {p: tx(tag, p) for p in (2, 3)}
        send_udp(tag, 1, 3, 1, sport=40011)
        return {p: tx(tag, p) - before[p] for p in (2, 3)}

    switches.set_port_load(7, 3, rate, rate, time.monotonic_ns())  # queued
    switches.set_port_load(7, 2, rate)
    first = sent()
    assert first[2] == 1 and first[3] == 0, first  # placed by the queues: port 2
    now = time.monotonic_ns()
    switches.set_port_load(7, 2, rate, last_ns=now, recent=RECENT_BYTES * 3 // 2,
                           pushed_ns=now)  # a flow moved onto it beside this one
    switches.set_port_load(7, 3, rate, last_ns=now, recent=RECENT_BYTES)  # a flow of its own
    loads = {p: PortLoad(rate, last_ns=(got := switches.port_load(7, p)).last_ns,
                         recent=got.recent, pushed_ns=got.pushed_ns) for p in (2, 3)}
    reference = Rebalancing(25, 100, loads, {}, lambda: 0)
    assert reference.moved(Flowlet(2, now, now - 1_000_000, 300), [2, 3], lambda p: True,
                           now, int(gap_s * 1e9), None) == 3
    assert loads[3].pushed_ns == now
    moved = sent()  # well within its hold (3 s)
    assert moved[3] == 1 and moved[2] == 0, moved
    assert switches.port_load(7, 3).pushed_ns > now  # pushed on: the flow there may move


def test_a_choice_weighing_the_next_switch_follows_the_reference(star):
    """``packet_next``: each port weighed by the longest of its queue, what is left of the path
    quality the next switch's group published and the queue of the link every way on takes
    (here groups and ports of a switch 9 whose qualities and loads alone exist): the packets
    go where the reference's path is the less loaded, whichever part makes it; the group
    publishes the least it found as its own quality."""
    from testbed.plan.localroute import (
        PortLoad,
        beyond_ns,
        bucket_delay,
        least_loaded,
        path_quality,
    )

    tag, switches = star
    ahead = {2: (9, 1, 9, 5), 3: (9, 2, 9, 6)}  # (switch, group, link's switch, its port)
    second = 1_000_000_000
    switches.set_group(7, 5, "select", [2, 3], selection="packet_next",
                       beyond=[ahead[2], ahead[3]])
    switches.set_table(7, tss.compile_table([route(3, (("group", 5),)), FlowEntry(0, (), ())]))
    half = RATE_BYTES_S // 2
    cases = (({2: 0, 3: 0, 5: 0, 6: 0}, {1: second, 2: 0}),  # beyond port 2: a busy path
             ({2: 0, 3: 0, 5: 0, 6: 0}, {1: 0, 2: second}),  # beyond port 3
             # port 2 half a second, beyond port 3 a second: port 2's path is the shorter
             ({2: half, 3: 0, 5: 0, 6: 0}, {1: 0, 2: second}),
             # the link beyond port 3 half a second, beyond port 2 a quarter: port 2's
             ({2: 0, 3: 0, 5: half // 2, 6: half}, {1: 0, 2: 0}))
    for levels, published in cases:
        now = time.monotonic_ns()
        loads = {p: PortLoad(RATE_BYTES_S, level, now) for p, level in levels.items()}
        for port, level in levels.items():
            switches.set_port_load(7 if port < 5 else 9, port, RATE_BYTES_S, level, now)
        for gid, delay in published.items():
            switches.set_quality(9, gid, delay, now)

        def load(p: int, at: int) -> int:
            _, gid, _, link = ahead[p]
            return bucket_delay(loads[p].delay_ns(at), max(
                beyond_ns((published[gid], now), at), loads[link].delay_ns(at)))

        want = least_loaded([2, 3], lambda p: True, lambda p: load(p, now), h=0)
        before = {p: tx(tag, p) for p in (2, 3)}
        send_udp(tag, 1, 3, 20)
        got = {p: tx(tag, p) - before[p] for p in (2, 3)}
        assert got[want] >= 20 and got[5 - want] == 0, (levels, published, want, got)
        quality = switches.quality(7, 5)  # published at the last packet's choice
        best = path_quality([2, 3], lambda p: True, lambda p: load(p, quality.at_ns))
        # within a packet's worth of the reference (its own bytes joined the queue since)
        assert abs(quality.delay_ns - best) <= 1_000_000, (quality.delay_ns, best)
    # without the next switch, the same loads leave the choice to the local queues
    switches.set_group(7, 5, "select", [2, 3], selection="packet")
    before = {p: tx(tag, p) for p in (2, 3)}
    send_udp(tag, 1, 3, 20)
    got = {p: tx(tag, p) - before[p] for p in (2, 3)}
    assert got[3] >= 20 and got[2] == 0, got
