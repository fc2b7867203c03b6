"""Switch-local adaptive routing's reference (testbed/plan/localroute.py): the ports' loads,
the least-loaded choice and its ties, and flowlets."""

from __future__ import annotations

from testbed.plan.localroute import (
    DRAIN_ALL_S,
    MOVES_BACKOFF,
    NS_PER_S,
    RECENT_BYTES,
    U64,
    WALK_HOLD_GAPS,
    Flowlet,
    PortLoad,
    Rebalancing,
    chance_of,
    faded,
    flow_recent,
    flowlet_port,
    least_loaded,
    rebalanced,
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


def test_a_ports_rate_estimate_holds_its_share_of_the_window():
    """The bytes sent lately fade as line time passes: a port sent a steady half of its line
    settles at half the window, whatever the packets' size; idle a window's time, nothing."""
    for size in (1500, 9000, 65536):
        load, now = PortLoad(RATE), 0
        for _ in range(2000):
            now += 2 * size * NS_PER_S // RATE  # every other packet time: half the line
            load.account(now, size)
        share = load.recent / RECENT_BYTES
        assert 0.45 <= share <= 0.55 + size / RECENT_BYTES, (size, share)
        window_ns = RECENT_BYTES * NS_PER_S // RATE
        assert abs(load.busy_ns(now) - load.recent * NS_PER_S // RATE) <= 1
        assert load.busy_ns(now + window_ns + 1_000) == 0
    assert faded(1000, RECENT_BYTES // 2) == 500 and faded(1000, RECENT_BYTES) == 0


def test_rebalancing_moves_a_flow_that_shares_its_path_and_leaves_one_alone():
    window = 100  # the rate window's time, in any unit; the quality delta a quarter of it
    delta = window // 4
    # two flows on one path (full), an idle one beside it: moving, the path carries one
    assert rebalanced(cur_ns=window, mine_ns=window // 2, best_ns=0, delta_ns=delta)
    # alone on its path at the full line: another path carrying it would be as busy
    assert not rebalanced(cur_ns=window, mine_ns=window, best_ns=0, delta_ns=delta)
    # the other path carries a flow of its own: no lighter by the delta
    assert not rebalanced(cur_ns=window, mine_ns=window // 2, best_ns=window, delta_ns=delta)
    # alone locally at half the line, its acknowledgements echoing congestion further on:
    # an idle path is no heavier, and it moves; one carrying a flow is, and it stays
    assert rebalanced(cur_ns=window // 2, mine_ns=window // 2, best_ns=0, delta_ns=delta,
                      echoed=True)
    assert not rebalanced(cur_ns=window // 2, mine_ns=window // 2, best_ns=window,
                          delta_ns=delta, echoed=True)


def test_a_flowlet_is_placed_anew_until_it_carries_data_and_rebalances_after_a_hold():
    flowlets, gap = {}, 1_000_000
    loads = {1: 0, 2: 5}

    def port(now: int, nbytes: int, rebalance: Rebalancing | None = None) -> int | None:
        return flowlet_port(flowlets, ("sw", 1, 7), now, gap, [1, 2], lambda p: True,
                            lambda p: loads[p], h=0, nbytes=nbytes, rebalance=rebalance)

    assert port(0, 74) == 1  # a SYN: headers alone
    loads.update({1: 5, 2: 0})
    assert port(100, 66) == 2  # its handshake's last packet, placed anew
    assert port(200, 9000) == 2 and flowlets[("sw", 1, 7)].data  # its first data: kept now
    loads.update({1: 0, 2: 5})
    assert port(300, 9000) == 2  # within the gap, data carried: kept
    # the path it is on full of late, the other idle: it moves once held a gap
    rebalance = Rebalancing(25, 100, {1: PortLoad(RATE), 2: PortLoad(RATE)}, {}, lambda: 0)
    rebalance.loads[2].recent = RECENT_BYTES
    rebalance.loads[2].last_ns = rebalance.loads[1].last_ns = 400_000
    assert port(400_000, 9000, rebalance) == 2  # held: a gap since its choice
    assert port(1_200_000, 9000, rebalance) == 1  # past the hold: moved
    assert flowlets[("sw", 1, 7)].decided_ns == 1_200_000  # and held again from there
    assert port(1_300_000, 9000, rebalance) == 1


def test_a_rebalancing_flow_takes_its_bytes_along_and_leaves_its_partner_alone():
    """Two flows share port 1 at half the line each (the port full), port 2 idle: the first
    weighed moves, its own estimate going with it; the second then sees its path its own and
    stays. Drawn above the chance, nothing moves."""
    gap, now = 1_000_000, 5_000_000
    loads = {1: PortLoad(RATE, last_ns=now), 2: PortLoad(RATE, last_ns=now)}
    loads[1].recent = RECENT_BYTES
    flowlets = {("sw", 1, h): Flowlet(1, now - 1_000, 0, RECENT_BYTES // 2) for h in (7, 8)}
    draws = [chance_of(25), chance_of(25) - 1, chance_of(25) - 1]
    rebalance = Rebalancing(25, 25, loads, {}, draws.pop)

    def port(h: int) -> int | None:
        return flowlet_port(flowlets, ("sw", 1, h), now, gap, [1, 2], lambda p: True,
                            lambda p: 0, h=h, nbytes=1500, rebalance=rebalance)

    assert port(8) == 2 and flowlets[("sw", 1, 8)].recent > RECENT_BYTES // 2
    carried = flowlets[("sw", 1, 8)].recent
    assert loads[2].recent == carried and loads[1].recent == RECENT_BYTES - carried
    assert port(7) == 1  # alone on port 1 now: another path carrying it is as busy
    assert port(7) == 1 and not draws  # drawn at the chance's edge: not weighed


def test_a_path_weighs_the_link_beyond_its_port_and_carries_a_flow_onto_it():
    """Weighing the next switch, a path's estimate is the longer of its port's and the link
    every way on takes: an idle port before a full link is no way out."""
    now = 5_000_000
    loads = {p: PortLoad(RATE, last_ns=now) for p in (1, 2, 3)}
    beyond = {1: PortLoad(RATE, last_ns=now), 2: PortLoad(RATE, last_ns=now)}
    loads[1].recent, beyond[1].recent = RECENT_BYTES, RECENT_BYTES // 2
    beyond[2].recent = RECENT_BYTES
    rebalance = Rebalancing(25, 100, loads, beyond, lambda: 0)
    assert rebalance.busy_ns(2, now) == RECENT_BYTES * NS_PER_S // RATE
    seen = Flowlet(1, now, 0, RECENT_BYTES // 2)
    assert rebalance.moved(seen, [1, 2, 3], lambda p: True, now, 1_000, None) == 3
    assert beyond[1].recent == 0 and loads[3].recent == RECENT_BYTES // 2
    seen = Flowlet(1, now, 0, RECENT_BYTES // 2)  # the third port down: nowhere to go
    assert rebalance.moved(seen, [1, 2, 3], lambda p: p != 3, now, 1_000, None) is None


def test_a_flowlets_rate_estimate_fades_with_its_ports_line_time():
    seen = Flowlet(1, last_ns=0, recent=RECENT_BYTES)
    flow_recent(seen, RECENT_BYTES // 2 * NS_PER_S // RATE, 100, RATE)
    assert seen.recent == RECENT_BYTES // 2 + 100
    flow_recent(seen, 10 * NS_PER_S, 100, RATE)  # long idle: its own packet only
    assert seen.recent == 100


def _walk(now: int, draws: list[int]) -> Rebalancing:
    """Ports 1 and 2 of one switch, each carrying a flow at the full line of late."""
    loads = {p: PortLoad(RATE, last_ns=now, recent=RECENT_BYTES) for p in (1, 2)}
    return Rebalancing(25, 25, loads, {}, draws.pop)


def test_a_flow_pushed_onto_its_path_moves_at_once_to_one_no_busier_and_pushes_on():
    """A collision carried along its chain: a flow that another moved onto its path beside it
    (pushed, after its own choice) moves within its hold to a path no busier, though another
    flow is on that one; its move marks that path pushed. The flow that moved is not moved by
    its own push."""
    gap, now = 1_000_000, 50_000_000
    rebalance = _walk(now, [0, 0])
    rebalance.loads[1].recent += RECENT_BYTES // 2  # the pushed flow's, carried onto it
    rebalance.loads[1].pushed_ns = now - 1_000
    seen = Flowlet(1, now, decided_ns=now - 10_000, recent=RECENT_BYTES // 2)
    assert rebalance.moved(seen, [1, 2], lambda p: True, now, gap, None) == 2
    assert rebalance.loads[2].pushed_ns == now  # onto a busy path: pushed on
    seen = Flowlet(2, now, decided_ns=now, recent=RECENT_BYTES // 2)  # pushed by itself
    assert rebalance.moved(seen, [1, 2], lambda p: True, now + 1_000, gap, None) is None


def test_a_held_back_flow_starts_a_walk_at_a_quarter_of_the_chance():
    """Echoed, at half the line on a full path, the other path as busy: no move mends it;
    the flow moves there anyway at a quarter of the chance (a second draw), pushing it; a
    flow at its full rate does not."""
    gap, now = 1_000_000, 50_000_000
    echoed = now - 1_000
    for second, moves in ((chance_of(25) // 4 - 1, 2), (chance_of(25) // 4, None)):
        rebalance = _walk(now, [second, 0])
        seen = Flowlet(1, now, decided_ns=now - 2 * gap, recent=RECENT_BYTES // 2)
        assert rebalance.moved(seen, [1, 2], lambda p: True, now, gap, echoed) == moves
        assert rebalance.loads[2].pushed_ns == (now if moves else 0)
    rebalance = _walk(now, [0, 0])
    seen = Flowlet(1, now, decided_ns=now - 2 * gap, recent=RECENT_BYTES)
    assert rebalance.moved(seen, [1, 2], lambda p: True, now, gap, echoed) is None


def test_a_plain_move_to_an_idle_path_pushes_nothing():
    gap, now = 1_000_000, 5_000_000
    rebalance = _walk(now, [0])
    rebalance.loads[2].recent = 0
    seen = Flowlet(1, now, decided_ns=now - 2 * gap, recent=RECENT_BYTES // 2)
    assert rebalance.moved(seen, [1, 2], lambda p: True, now, gap, None) == 2
    assert rebalance.loads[2].pushed_ns == 0


def test_a_flow_walks_at_most_once_in_its_walk_hold():
    """Pushed again within :data:`WALK_HOLD_GAPS` gaps of its last walk, a flow stays: a
    collision no placement mends is not walked round and round."""
    gap, now = 1_000_000, 50_000_000
    rebalance = _walk(now, [0, 0])
    rebalance.loads[1].recent += RECENT_BYTES // 2
    rebalance.loads[1].pushed_ns = now - 1_000
    seen = Flowlet(1, now, decided_ns=now - 10_000, recent=RECENT_BYTES // 2,
                   walked_ns=now - (WALK_HOLD_GAPS - 1) * gap)
    assert rebalance.moved(seen, [1, 2], lambda p: True, now, gap, None) is None
    seen.walked_ns = now - WALK_HOLD_GAPS * gap
    assert rebalance.moved(seen, [1, 2], lambda p: True, now, gap, None) == 2
    assert seen.walked_ns == now


def test_a_flows_hold_doubles_with_each_move_it_made():
    flowlets, gap = {}, 1_000_000
    loads = {1: PortLoad(RATE), 2: PortLoad(RATE)}
    rebalance = Rebalancing(25, 100, loads, {}, lambda: 0)

    def port(now: int) -> int | None:
        for p, load in loads.items():  # the flow's path two flows' of late, the other idle
            load.last_ns, load.recent = now, 2 * RECENT_BYTES if p == seen.port else 0
        return flowlet_port(flowlets, ("sw", 1, 7), now, gap, [1, 2], lambda p: True,
                            lambda p: 0, h=0, nbytes=500, rebalance=rebalance)

    flowlets[("sw", 1, 7)] = seen = Flowlet(1, 0, 0, 500)
    now = 0
    for moves in range(MOVES_BACKOFF + 2):
        hold = gap << min(moves, MOVES_BACKOFF)
        for t in range(now + gap // 2, now + hold, gap // 2):  # within the gap, held
            assert port(t) == seen.port and seen.moves == moves
        was, now = seen.port, now + hold
        assert port(now) != was and seen.moves == moves + 1
