"""Pure credit-based flow control (CBFC) for the lossless priorities: what the CBFC agent
(:mod:`testbed.fabric.cbfc`) decides from each sample, and what it counts.

Terms. A *link* is a switch's ingress port and the upstream port that sends into it (a
:class:`testbed.plan.pause.Feeder`). The downstream switch gives each link a buffer of
``credit_bytes`` per lossless priority; the bytes that came in on the link and still wait in
the switch's egress queues use it, and the rest is the link's *credit*: what its upstream port
may send. The switch returns credit as those bytes leave (a credit update), and the upstream
port sends only what its credit covers. Unlike PFC there is no threshold and no headroom: a
link never sends more than its buffer holds, so a lossless queue cannot overflow, and a link
waits only for its own buffer, not for a queue some other link filled.

Which link a queued byte came from: each egress queue is a FIFO, so of the bytes enqueued
there, the first ``enqueued - backlog`` have left. :class:`FifoShare` keeps, per queue, the
running count of bytes enqueued from each ingress at each sample, and finds at which ingress
counts the departed prefix ends (interpolated between samples).

A link whose credit is under one frame is *stalled* (counted as PFC counts pauses: events and
stalled time). Stalled links wait for queues that hold their bytes; when those queues' own
ports are stalled too, and round a cycle, nothing can move again: a credit deadlock, found as
PFC's pause cycles are (:func:`testbed.model.congestion.pause_cycles`).
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field

from testbed.model.congestion import pause_cycles
from testbed.plan.pause import Feeder

Key = tuple[str, int]  # (port, priority)


class FifoShare:
    """One FIFO egress queue: which ingress the bytes in it came from."""

    def __init__(self) -> None:
        self.history: deque[tuple[int, dict[str, int]]] = deque()  # (total, per ingress)

    def record(self, enqueued: dict[str, int]) -> None:
        """A sample of the running bytes enqueued from each ingress (never decreasing; a
        sample like the last one is not kept: a queue that stands still keeps no history)."""
        total = sum(enqueued.values())
        if not self.history or total != self.history[-1][0]:
            self.history.append((total, dict(enqueued)))

    def held(self, backlog: int) -> dict[str, int]:
        """Bytes from each ingress in the queue now, given its ``backlog``."""
        if not self.history:
            return {}
        total, now = self.history[-1]
        departed = max(0, total - backlog)
        while len(self.history) > 1 and self.history[1][0] <= departed:
            self.history.popleft()  # wholly departed: not needed again
        t0, at0 = self.history[0]
        if departed <= t0 or len(self.history) == 1:
            gone = at0 if departed >= t0 else {d: v * departed / t0 if t0 else 0
                                               for d, v in at0.items()}
        else:
            t1, at1 = self.history[1]
            f = (departed - t0) / (t1 - t0)
            gone = {d: at0.get(d, 0) + f * (at1.get(d, 0) - at0.get(d, 0)) for d in at1}
        return {d: max(0, round(v - gone.get(d, 0))) for d, v in now.items()
                if v - gone.get(d, 0) >= 0.5}


@dataclass
class LinkCredit:
    """What one link (its upstream port, a priority) went through."""

    stall_events: int = 0
    stalled_s: float = 0.0
    stalled_since: float | None = None
    applied: int | None = None  # the credit last given to the upstream port (None: running)
    arrived_at_grant: int = 0  # the link's bytes enqueued downstream when it was given


@dataclass(frozen=True)
class Grant:
    """Set an upstream port's lossless leaf: ``credit`` bytes may leave (None: run freely)."""

    port: str
    priority: int
    credit: int | None
    host: str | None  # the host whose NIC it is (None: a root-namespace switch port)

    @property
    def stalls(self) -> bool:
        return self.credit == 0


@dataclass
class CreditState:
    """The credit state of a fabric's lossless priorities.

    Args:
        feeders: switch port -> the feeders of its queue (its switch's other ports).
        priorities: the lossless priorities.
        credit_bytes: each link's buffer per priority at its downstream switch.
        frame_bytes: a full frame: less credit than this stalls the link.
        run_bytes: with at least this much credit a link runs freely (it cannot send more
            before the next sample).
    """

    feeders: dict[str, tuple[Feeder, ...]]
    priorities: tuple[int, ...]
    credit_bytes: int
    frame_bytes: int
    run_bytes: int
    links: dict[Key, LinkCredit] = field(default_factory=lambda: defaultdict(LinkCredit))
    queues: dict[Key, FifoShare] = field(default_factory=lambda: defaultdict(FifoShare))
    waits_on: dict[Key, set[str]] = field(default_factory=dict)  # upstream -> queues holding it
    cycles: dict[tuple[int, tuple[str, ...]], float] = field(default_factory=dict)
    held_now: dict[Key, int] = field(default_factory=dict)  # ingress -> bytes held

    def __post_init__(self) -> None:
        self.upstream = {f.ingress: f for feeds in self.feeders.values() for f in feeds}

    def credit(self, ingress: str, priority: int) -> int:
        return self.credit_bytes - self.held_now.get((ingress, priority), 0)

    def step(self, now: float, enqueued: dict[tuple[str, str, int], int],
             backlog: dict[Key, int]) -> list[Grant]:
        """One sample.

        Args:
            now: the sample's time (seconds, monotonic).
            enqueued: (egress port, ingress port, priority) -> bytes enqueued there from that
                ingress so far (the switches' counters).
            backlog: (egress port, priority) -> its lossless leaf's backlog now.

        Returns:
            The credits to give, in order (only those that changed by a frame or more).
        """
        per_queue: dict[Key, dict[str, int]] = defaultdict(dict)
        arrived: dict[Key, int] = defaultdict(int)
        for (port, ingress, prio), n in enqueued.items():
            per_queue[(port, prio)][ingress] = n
            arrived[(ingress, prio)] += n
        held: dict[Key, int] = defaultdict(int)
        holders: dict[Key, set[str]] = defaultdict(set)
        for key, counts in per_queue.items():
            share = self.queues[key]
            share.record(counts)
            for ingress, n in share.held(backlog.get(key, 0)).items():
                if n > 0:
                    held[(ingress, key[1])] += n
                    holders[(ingress, key[1])].add(key[0])
        self.held_now = dict(held)
        grants = []
        for ingress, feeder in sorted(self.upstream.items()):
            for prio in self.priorities:
                grant = self._decide(now, feeder, prio, self.credit(ingress, prio),
                                     arrived.get((ingress, prio), 0))
                if grant is not None:
                    grants.append(grant)
        self.waits_on = {(self.upstream[i].upstream, p): ports for (i, p), ports in
                         holders.items() if i in self.upstream}
        self._find_cycles(now)
        return grants

    def _decide(self, now: float, feeder: Feeder, prio: int, credit: int,
                arrived: int) -> Grant | None:
        """The link's new credit, if it must be given: it stalls or resumes, its credit moved
        by a frame, or the port spent a frame of its bucket since it was given (the bucket
        is not topped up by itself)."""
        state = self.links[(feeder.upstream, prio)]
        if credit < self.frame_bytes:
            want = 0
            if state.stalled_since is None:
                state.stalled_since = now
                state.stall_events += 1
        else:
            want = None if credit >= self.run_bytes else credit
            if state.stalled_since is not None:
                state.stalled_s += now - state.stalled_since
                state.stalled_since = None
        spent = arrived - state.arrived_at_grant >= self.frame_bytes
        same = (want == state.applied and not (want and spent)
                or want is not None and state.applied is not None and want > 0
                and state.applied > 0 and abs(want - state.applied) < self.frame_bytes
                and not spent)
        if same:
            return None
        state.applied, state.arrived_at_grant = want, arrived
        return Grant(feeder.upstream, prio, want, feeder.upstream_host)

    def _find_cycles(self, now: float) -> None:
        for prio in self.priorities:
            stalled = {port for (port, p), s in self.links.items()
                       if p == prio and s.stalled_since is not None}
            graph = {port: {q for q in queues if q in stalled}
                     for (port, p), queues in self.waits_on.items()
                     if p == prio and port in stalled}
            for cycle in pause_cycles(graph):
                self.cycles.setdefault((prio, tuple(cycle)), now)

    def close(self, now: float) -> list[Grant]:
        """Let every link run (the agent stops); the stalled time runs up to ``now``."""
        grants = []
        for (port, prio), state in sorted(self.links.items()):
            if state.stalled_since is not None:
                state.stalled_s += now - state.stalled_since
                state.stalled_since = None
            if state.applied is not None:
                state.applied = None
                host = next((f.upstream_host for f in self.upstream.values()
                             if f.upstream == port), None)
                grants.append(Grant(port, prio, None, host))
        return grants

    def counters(self, now: float) -> dict[Key, dict]:
        """(upstream port, priority) -> credit stalls (``stall_events``, ``stalled_s`` up to
        ``now``, ``stalled`` now)."""
        out = {}
        for key, state in self.links.items():
            running = now - state.stalled_since if state.stalled_since is not None else 0.0
            out[key] = {"stall_events": state.stall_events,
                        "stalled_s": state.stalled_s + running,
                        "stalled": state.stalled_since is not None}
        return out

    def deadlocks(self) -> list[dict]:
        """Every credit cycle seen: its priority, ports, and when it was first seen."""
        return [{"priority": prio, "ports": list(ports), "first_seen": t}
                for (prio, ports), t in sorted(self.cycles.items(), key=lambda kv: kv[1])]
