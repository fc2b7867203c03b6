"""Switch-local adaptive routing as the eBPF datapath decides it (pure): the reference of
``progs/switch.c``'s ``account``, ``least_loaded`` and ``flowlet_port``, integer for integer.

Every switch port keeps a load: a virtual queue of the bytes sent out of it, drained at the
port's rate (whole microseconds at a time, the rest kept for the next packet; after a second
idle, empty). A SELECT group whose selection is switch-local compares its live ports by how
long their queues take to drain (ports of unlike rates, a degraded link among them, compare
fairly):

- ``packet``: every packet to the least-loaded live port (Spectrum-X's per-packet adaptive
  routing, behind a receiver that reorders); ties go to the ``h``-th of the least, modulo
  their number, ``h`` the packet's flow hash (:func:`testbed.plan.groups.flow_hash`);
- ``flowlet``: a flow (by its hash) keeps its port while its packets come closer than the
  group's gap and the port stays live and the group's; after a longer gap it takes the
  least-loaded port, remembered with the time of its last packet (CONGA's and Broadcom DLB's
  flowlets) -- but not the port it had, where a TCP acknowledgement of the flow passing the
  switch echoed congestion (ECE) more than :data:`ECHO_HOLD_GAPS` gaps after that port was
  chosen (FlowBender's and CLOVE-ECN's signal, read in the switch). A switch sees its own
  ports' load only; the echo is what it learns of the path beyond them (a collision further
  down, at a port no switch on the way up sees).

A selection that weighs the next switch (``flowlet_next``, ``packet_next``) compares each
port by the longest of its own queue, what is left of the path quality the next switch's
group towards the same destinations last published (:func:`beyond_ns`) and the queue of the
first link every way on takes (:func:`bucket_delay`; :mod:`testbed.plan.lookahead`), and
publishes the least it finds, at every packet, as its own group's path quality.

Reactive rebalancing (Juniper's, of DLB flowlets) moves a flowlet before its gap: every port
also keeps a rate estimate (the bytes sent to it lately, fading as its line time passes:
:func:`faded`), and every flowlet its own; past a hold of one gap since its port was chosen,
at a chance per packet, a flowlet moves to the path busy least of late when that path,
carrying it, would be lighter than its own by a quality delta (:func:`rebalanced`); its
bytes go with it, off the estimates of its old port (and link beyond) onto the new. A flow
held back beyond what one move mends walks its collision along its chain of flows, pushing
the flow it moves beside, which moves on (:class:`Rebalancing`); each move doubles a flow's
hold, up to :data:`MOVES_BACKOFF` times.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from testbed.plan.groups import flow_hash

NS_PER_US, US_PER_S, NS_PER_S = 1_000, 1_000_000, 1_000_000_000
U64 = (1 << 64) - 1
#: a port idle this long has drained, whatever it held (switch.c DRAIN_ALL_S)
DRAIN_ALL_S = 3600
#: echoes of congestion within this many gaps of a flowlet's choice speak of its port before
ECHO_HOLD_GAPS = 4
#: a rate estimate's window: a steady share u of the line holds u times this many bytes
RECENT_BYTES = 256 * 1024
#: a packet of no more bytes carries headers only (Ethernet, IPv4, TCP with options)
HEADERS_ONLY = 94
#: rebalancing: a flow is held back on its path below this share of the line (percent) ...
HELD_RATE_PCT = 60
#: ... where its path is busy above this share (percent) of the window's time
FULL_PCT = 80
#: a flow walks (moves beside another) at most once in this many gaps
WALK_HOLD_GAPS = 8
#: a flow's hold doubles with each move it made, up to 2 to this power gaps
MOVES_BACKOFF = 3


def faded(recent: int, gone: int) -> int:
    """A rate estimate after ``gone`` bytes of the port's line time: fading linearly, a whole
    :data:`RECENT_BYTES` of it taking all."""
    return 0 if gone >= RECENT_BYTES else recent * (RECENT_BYTES - gone) // RECENT_BYTES


@dataclass
class PortLoad:
    """One port's load (``struct port_load``)."""

    rate_bytes_s: int
    level: int = 0
    last_ns: int = 0
    recent: int = 0  # the bytes sent to it lately (its rate estimate)
    pushed_ns: int = 0  # when a rebalancing flow last moved onto it beside another

    def drained(self, now_ns: int) -> tuple[int, int]:
        """(bytes drained since ``last_ns``, the whole microseconds of it in ns), however
        long the port was idle (a time-scaled fabric's queue can take seconds to drain);
        everything after :data:`DRAIN_ALL_S`. Whole seconds and the rest apart, as the
        datapath computes it in 64 bits."""
        us = (now_ns - self.last_ns) // NS_PER_US if now_ns > self.last_ns else 0
        if us >= DRAIN_ALL_S * US_PER_S:
            return U64, now_ns - self.last_ns
        rate = self.rate_bytes_s
        return us // US_PER_S * rate + us % US_PER_S * rate // US_PER_S, us * NS_PER_US

    def queued(self, now_ns: int) -> int:
        """The bytes queued now, as the load estimates them."""
        gone, _ = self.drained(now_ns)
        return self.level - gone if self.level > gone else 0

    def account(self, now_ns: int, nbytes: int) -> None:
        """A packet of ``nbytes`` joins the queue."""
        gone, elapsed = self.drained(now_ns)
        self.level = (self.level - gone if self.level > gone else 0) + nbytes
        self.recent = faded(self.recent, gone) + nbytes
        self.last_ns += elapsed

    def busy_ns(self, now_ns: int) -> int:
        """How long its line took, of late, to send what it was sent: its share of the line
        times :data:`RECENT_BYTES`'s time at its rate (0 for a port of no rate)."""
        if not self.rate_bytes_s:
            return 0
        return faded(self.recent, self.drained(now_ns)[0]) * NS_PER_S // self.rate_bytes_s

    def delay_ns(self, now_ns: int) -> int:
        """How long the queue takes to drain (0 for a port of no rate)."""
        return self.queued(now_ns) * NS_PER_S // self.rate_bytes_s if self.rate_bytes_s else 0


def beyond_ns(published: tuple[int, int] | None, now_ns: int) -> int:
    """What is left now of a path quality (delay, at) published by the next switch's group: a
    queue drains at least as fast as time passes while nothing joins it (None: 0)."""
    if published is None:
        return 0
    delay, at = published
    age = now_ns - at if now_ns > at else 0
    return delay - age if delay > age else 0


def bucket_delay(own_ns: int, next_ns: int | None = None) -> int:
    """A bucket's load as a choice weighing the next switch compares it: the longer of its
    port's queue and what lies beyond it (the longer of the next switch's path quality and
    the queue of the link every way on takes; None: nothing weighed beyond it)."""
    return own_ns if next_ns is None else max(own_ns, next_ns)


def path_quality(ports: Sequence[int], live: Callable[[int], bool],
                 delay: Callable[[int], int]) -> int | None:
    """The path quality a group weighing the next switch publishes: the least load over its
    live ports (None: none is live, nothing published)."""
    loads = [delay(p) for p in ports if live(p)]
    return min(loads) if loads else None


def least_loaded(ports: Sequence[int], live: Callable[[int], bool],
                 delay: Callable[[int], int], h: int, avoid: int | None = None) -> int | None:
    """The live port of least ``delay`` (ties: the ``h``-th of them modulo their number),
    other than ``avoid`` while another is live; None when no port is live."""
    delays = {p: delay(p) for p in ports if live(p) and p != avoid}
    if not delays and avoid is not None:
        return least_loaded(ports, live, delay, h)
    if not delays:
        return None
    best = min(delays.values())
    ties = [p for p in ports if p in delays and delays[p] == best]
    return ties[h % len(ties)]


@dataclass
class Flowlet:
    port: int
    last_ns: int
    decided_ns: int = 0  # when the port was chosen
    recent: int = 0  # the bytes it sent lately (its rate estimate, as a port's)
    data: bool = True  # it carried a packet of more than headers
    moves: int = 0  # how often rebalancing moved it
    walked_ns: int = 0  # when it last moved in a walk (rebalancing)


def rebalanced(cur_ns: int, mine_ns: int, best_ns: int, delta_ns: int,
               echoed: bool = False) -> bool:
    """Reactive rebalancing's test, at a flowlet's packet past its hold (a gap since its port
    was chosen) and the group's chance: whether it moves now to the path busy least of late
    (``best_ns``, its rate estimate in line time) from its own (``cur_ns``), its own bytes
    lately ``mine_ns``: when that path, carrying it, would be lighter by the quality delta
    ``delta_ns`` -- or no heavier by it, while its acknowledgements echoed congestion within
    the last gap (``echoed``). A flow alone on its path stays: another path carrying it would
    be as busy as its own."""
    if best_ns + mine_ns + delta_ns <= cur_ns:
        return True
    return echoed and best_ns + mine_ns <= cur_ns + delta_ns


def chance_of(pct: int) -> int:
    """A chance in percent as the datapath draws it: of 2^32 (100 %: every draw but one in
    2^32, the largest that fits)."""
    return min(int(pct) * (1 << 32) // 100, (1 << 32) - 1)


def flow_recent(flowlet: Flowlet, now_ns: int, nbytes: int, rate_bytes_s: int) -> None:
    """A flowlet's rate estimate at a packet of ``nbytes`` more: faded by its port's line
    time since its last packet (``rate_bytes_s``: its port's rate)."""
    gone = (now_ns - flowlet.last_ns) * rate_bytes_s // NS_PER_S \
        if now_ns > flowlet.last_ns else 0
    flowlet.recent = faded(flowlet.recent, gone) + nbytes


@dataclass
class Rebalancing:
    """A group's reactive rebalancing as the datapath runs it: the test
    (:func:`rebalanced`) on the group's ports' rate estimates, the walk of collisions no such
    move mends (:meth:`moved`), and the flow's bytes carried when it moves. ``loads``: each
    port's :class:`PortLoad`; ``beyond``: per port, the load of the link every way on from
    the next switch takes (``load: next_switch``), whose estimate a path's is where it is the
    longer; ``draw``: the datapath's random draw, a 32-bit number, against
    :func:`chance_of` the chance."""

    delta_pct: int
    chance_pct: int
    loads: dict[int, PortLoad]
    beyond: dict[int, PortLoad]
    draw: Callable[[], int]

    def _path(self, port: int) -> list[PortLoad]:
        return [load for load in (self.loads[port], self.beyond.get(port)) if load is not None]

    def busy_ns(self, port: int, now_ns: int) -> int:
        """A path's estimate: its port's, or the link's beyond it where longer."""
        return max(load.busy_ns(now_ns) for load in self._path(port))

    def pushed_ns(self, port: int) -> int:
        """When a flow last moved onto the path beside another (0: never)."""
        return max(load.pushed_ns for load in self._path(port))

    def carry(self, port: int, to: int, nbytes: int, push_ns: int = 0) -> None:
        """A flow's recent bytes off ``port``'s estimates (and its link beyond) onto ``to``'s
        (the raw estimates, as the datapath updates them between packets); ``push_ns``: the
        new path marked pushed then (0: not)."""
        for gone in self._path(port):
            gone.recent = gone.recent - nbytes if gone.recent > nbytes else 0
        for came in self._path(to):
            came.recent += nbytes
            if push_ns:
                came.pushed_ns = push_ns

    def moved(self, seen: Flowlet, ports: Sequence[int], live: Callable[[int], bool],
              now_ns: int, gap_ns: int, echoed_ns: int | None) -> int | None:
        """Where a flowlet within its gap moves now (its bytes carried), None: it stays.
        Drawn at the group's chance; held from its choice a gap, doubled for each move it
        made (up to :data:`MOVES_BACKOFF` times), unless its path was pushed since (within a
        gap); the path busy least of late among the other live ports (the first of them where
        several are). It moves to a path lighter by the delta, carrying it; while its
        acknowledgements echo congestion (within the last gap, later than a gap after its
        choice), to one no heavier by the delta carrying it. It walks, at most once in
        :data:`WALK_HOLD_GAPS` gaps: pushed, to a path no busier by the delta; echoed and held
        back on a full path (:data:`HELD_RATE_PCT`, :data:`FULL_PCT`), at a quarter of the
        chance to one no busier. A move onto a path carrying half a line or more marks it
        pushed."""
        if not self.chance_pct or self.draw() >= chance_of(self.chance_pct):
            return None
        pushed_ns = self.pushed_ns(seen.port)
        pushed = pushed_ns > seen.decided_ns and pushed_ns + gap_ns > now_ns
        hold = gap_ns << min(seen.moves, MOVES_BACKOFF)
        load = self.loads[seen.port]
        if now_ns - seen.decided_ns < hold and not pushed or not load.rate_bytes_s:
            return None
        others = [p for p in ports if p != seen.port and live(p)]
        if not others:
            return None
        window = RECENT_BYTES * NS_PER_S // load.rate_bytes_s
        mine, delta = seen.recent * NS_PER_S // load.rate_bytes_s, window * self.delta_pct // 100
        cur = self.busy_ns(seen.port, now_ns)
        to = min(others, key=lambda p: self.busy_ns(p, now_ns))
        best = self.busy_ns(to, now_ns)
        echoed = echoed_ns is not None and echoed_ns > seen.decided_ns + gap_ns \
            and echoed_ns + gap_ns > now_ns
        walk = now_ns - seen.walked_ns >= WALK_HOLD_GAPS * gap_ns and best <= cur + delta
        if best + mine + delta <= cur:
            pass
        elif walk and pushed:
            seen.walked_ns = now_ns
        elif echoed and best + mine <= cur + delta:
            pass
        elif echoed and walk and mine * 100 <= window * HELD_RATE_PCT \
                and cur * 100 >= window * FULL_PCT \
                and self.draw() < chance_of(self.chance_pct) // 4:
            seen.walked_ns = now_ns
        else:
            return None
        self.carry(seen.port, to, seen.recent, now_ns if best * 2 >= window else 0)
        return to


def flowlet_port(flowlets: dict, key: tuple, now_ns: int, gap_ns: int, ports: Sequence[int],
                 live: Callable[[int], bool], delay: Callable[[int], int],
                 h: int, echoed_ns: int | None = None, nbytes: int = 1500,
                 rebalance: Rebalancing | None = None) -> int | None:
    """A flowlet's port (``flowlets``: the datapath's table, (switch, group, hash) ->
    :class:`Flowlet`, updated as the datapath updates it; ``echoed_ns``: when the switch last
    saw an acknowledgement of the flow echo congestion, None: never; ``nbytes``: the packet's
    length). A flow that has sent headers alone (its handshake) is placed anew at each packet.
    ``rebalance``: the group's reactive rebalancing (None: none), which a flowlet weighs at
    each packet within the gap (:meth:`Rebalancing.moved`), its rate estimate counting the
    packet."""
    seen = flowlets.get(key)
    avoid = None
    if seen is not None and live(seen.port) and seen.port in ports:
        if now_ns - seen.last_ns < gap_ns and seen.data:
            if rebalance is not None:
                flow_recent(seen, now_ns, nbytes, rebalance.loads[seen.port].rate_bytes_s)
            seen.last_ns = now_ns
            to = rebalance.moved(seen, ports, live, now_ns, gap_ns, echoed_ns) \
                if rebalance is not None else None
            if to is not None:
                seen.port, seen.decided_ns, seen.moves = to, now_ns, seen.moves + 1
            return seen.port
        if echoed_ns is not None and echoed_ns > seen.decided_ns + ECHO_HOLD_GAPS * gap_ns:
            avoid = seen.port
    port = least_loaded(ports, live, delay, h, avoid)
    if port is not None:
        flowlets[key] = Flowlet(port, now_ns, now_ns, nbytes, nbytes > HEADERS_ONLY)
    return port


def echo_hash(src: str, dst: str, proto: int, sport: int, dport: int) -> int:
    """The key of a flow's echoes: its forward 5-tuple's hash of basis 0 (an acknowledgement
    passing the other way gives its own tuple reversed)."""
    return flow_hash(0, src, dst, proto, sport, dport)
