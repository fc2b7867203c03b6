"""Switch-local adaptive routing's reference (testbed/plan/localroute.py): the ports' loads,
the least-loaded choice and its ties, and flowlets."""

from __future__ import annotations

from testbed.plan.localroute import (
    DRAIN_ALL_S,
    NS_PER_S,
    U64,
    PortLoad,
    flowlet_port,
    least_loaded,
)

RATE = 1_250_000  # 10 Mbit/s in bytes per second: 1.25 bytes per microsecond


def test_a_ports_load_drains_at_its_rate_in_whole_microseconds():
    load = PortLoad(RATE, last_ns=10_000)
    load.account(10_000, 1500)
    assert load.queued(10_000) == 1500
    # 1 ms later, 1,250 bytes gone; 999 ns more drain nothing (whole microseconds only)
    assert load.queued(1_010_000) == 250 and load.queued(1_010_999) == 250
    load.account(1_010_999, 100)  # the unfinished microsecond is kept for the next packet
    assert load.level == 350 and load.last_ns == 1_010_000
    assert load.queued(1_011_001) == 349
    assert load.delay_ns(1_010_000) == 350 * NS_PER_S // RATE  # 280 us
    # seconds idle drain seconds' worth (a time-scaled queue holds seconds), exactly
    slow = PortLoad(RATE, level=10 * RATE, last_ns=0)
    assert slow.drained(2_500_000_999) == (2 * RATE + RATE // 2, 2_500_000_000)
    assert slow.queued(2_500_000_000) == 10 * RATE - 2 * RATE - RATE // 2
    assert slow.queued(10 * NS_PER_S) == 0
    # an hour idle empties it, whatever its rate
    assert load.drained(load.last_ns + DRAIN_ALL_S * NS_PER_S)[0] == U64
    assert load.queued(load.last_ns + DRAIN_ALL_S * NS_PER_S) == 0
    assert PortLoad(0, level=10).delay_ns(5) == 0


def test_the_least_loaded_live_port_wins_and_the_hash_breaks_ties():
    delays = {1: 50, 2: 10, 3: 10, 4: 0}
    live = lambda p: p != 4  # noqa: E731 - the idle port is down
    assert least_loaded([1, 2, 3, 4], live, delays.get, h=0) == 2
    assert least_loaded([1, 2, 3, 4], live, delays.get, h=1) == 3
    assert least_loaded([1, 2, 3, 4], live, delays.get, h=7) == 3  # 7 % 2
    assert least_loaded([1, 2, 3, 4], lambda p: True, delays.get, h=5) == 4
    assert least_loaded([1, 2], lambda p: False, delays.get, h=0) is None
    # idle ports all tie: the hash spreads flows as ECMP would
    idle = {p: 0 for p in range(1, 5)}
    assert {least_loaded([1, 2, 3, 4], live, idle.get, h) for h in range(12)} == {1, 2, 3}


def test_a_flowlet_keeps_its_port_until_a_gap_then_takes_the_least_loaded():
    table: dict = {}
    delays = {1: 0, 2: 100}
    ports, gap = [1, 2], 500_000
    pick = lambda now, live=lambda p: True: flowlet_port(  # noqa: E731
        table, (7, 3, 99), now, gap, ports, live, delays.get, h=99)
    assert pick(1_000_000) == 1
    delays.update({1: 400, 2: 0})  # port 1 got busy: the flowlet stays (no reordering)
    assert pick(1_400_000) == 1 and pick(1_800_000) == 1  # each packet renews the gap
    assert pick(2_300_000) == 2  # a gap of 500 us: the flow moves to the least-loaded
    assert table[(7, 3, 99)].port == 2 and table[(7, 3, 99)].last_ns == 2_300_000
    delays.update({1: 0, 2: 400})
    assert pick(2_300_001, live=lambda p: p != 2) == 1  # its port went down: moved at once
    ports.remove(1)  # the group no longer holds the remembered port (the controller's update)
    assert pick(2_300_002) == 2
    assert flowlet_port({}, (1, 1, 1), 0, gap, [1], lambda p: False, delays.get, 1) is None


def test_a_flowlet_whose_acknowledgements_echoed_congestion_leaves_its_port():
    from testbed.plan.localroute import ECHO_HOLD_GAPS, echo_hash, flowlet_port

    table: dict = {}
    idle = {1: 0, 2: 0, 3: 0}
    ports, gap = [1, 2, 3], 500_000
    pick = lambda now, echoed=None: flowlet_port(  # noqa: E731
        table, (7, 3, 99), now, gap, ports, lambda p: True, idle.get, h=0, echoed_ns=echoed)
    assert pick(1_000_000) == 1  # idle ports tie: the hash's
    hold = 1_000_000 + ECHO_HOLD_GAPS * gap
    # an echo within the hold speaks of the port before: the next flowlet may keep port 1
    assert pick(hold, echoed=hold - 1) == 1
    decided = table[(7, 3, 99)].decided_ns
    assert decided == hold
    # while packets come closer than the gap, an echo moves nothing (no reordering)
    assert pick(hold + 100, echoed=hold + 50) == 1
    # a new flowlet after an echo well after the choice: another port, the least-loaded
    later = decided + (ECHO_HOLD_GAPS + 1) * gap
    idle.update({2: 30, 3: 10})
    assert pick(later + gap, echoed=later) == 3
    # the only live port is kept, echo or not
    only = flowlet_port(table, (7, 3, 99), later + 10 * gap, gap, [3], lambda p: True,
                        idle.get, h=0, echoed_ns=later + 9 * gap)
    assert only == 3
    # the key is the data's own tuple (an acknowledgement reverses its tuple first)
    from testbed.plan.groups import flow_hash
    assert echo_hash("10.1.1.1", "10.2.1.1", 6, 40000, 5201) == \
        flow_hash(0, "10.1.1.1", "10.2.1.1", 6, 40000, 5201) != \
        flow_hash(0, "10.2.1.1", "10.1.1.1", 6, 5201, 40000)
