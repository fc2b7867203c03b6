"""Pure PFC pause logic: what the PFC agent (:mod:`testbed.fabric.pfc`) decides from each sample of the
switches' lossless queues, and what it counts.

Terms. A *port* is a link end that sends: a switch port (its egress queue) or a host NIC. A
switch's lossless *queue* ``(port, priority)`` goes XOFF when its backlog reaches XOFF and XON
when it falls to XON. While XOFF it pauses, for that priority, every *upstream* port whose packets
of that priority arrived at the switch (by another port) since the previous sample: the device
that would receive a PFC frame on that ingress link. An upstream port stays paused while any
XOFF queue holds it. A pause held longer than the watchdog's limit is broken (the port resumes
and ignores pauses for as long again), as switches' PFC storm watchdogs do.

The pause graph (port -> the queues' ports that hold it paused) shows deadlocks: a cycle of
ports each paused by the next (:func:`testbed.model.congestion.pause_cycles`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from testbed.model.congestion import PfcThresholds, pause_cycles

Key = tuple[str, int]  # (port, priority)


@dataclass(frozen=True)
class Feeder:
    """A switch's ingress port, and the upstream port at the other end of its link."""

    ingress: str  # the switch's own port (where its rx counters are)
    upstream: str  # the port that sends into it
    upstream_host: str | None  # the host whose NIC ``upstream`` is (None: a switch port)


@dataclass
class PortPause:
    """What one (port, priority) went through."""

    pause_events: int = 0
    paused_s: float = 0.0
    watchdog_events: int = 0
    paused_since: float | None = None
    quarantine_until: float = 0.0


@dataclass(frozen=True)
class Action:
    """Pause or resume an upstream port's priority."""

    port: str
    priority: int
    pause: bool
    host: str | None  # the host whose NIC it is (None: a root-namespace switch port)


@dataclass
class PauseState:
    """The pause state of a fabric's lossless priorities.

    Args:
        thresholds: the resolved PFC settings.
        feeders: switch port -> the feeders of its queue (its switch's other ports).
    """

    thresholds: PfcThresholds
    feeders: dict[str, tuple[Feeder, ...]]
    xoff: dict[Key, float] = field(default_factory=dict)  # queue -> when it went XOFF
    holders: dict[Key, set[str]] = field(default_factory=lambda: defaultdict(set))
    ports: dict[Key, PortPause] = field(default_factory=lambda: defaultdict(PortPause))
    queue_xoff_events: dict[Key, int] = field(default_factory=lambda: defaultdict(int))
    cycles: dict[tuple[int, tuple[str, ...]], float] = field(default_factory=dict)
    hosts: dict[str, str | None] = field(default_factory=dict)  # upstream port -> its host

    def __post_init__(self) -> None:
        for feeds in self.feeders.values():
            for f in feeds:
                self.hosts[f.upstream] = f.upstream_host

    def paused(self, key: Key) -> bool:
        return self.ports[key].paused_since is not None if key in self.ports else False

    def step(self, now: float, backlog: dict[Key, int], arrived: set[Key]) -> list[Action]:
        """One sample.

        Args:
            now: the sample's time (seconds, monotonic).
            backlog: (switch port, lossless priority) -> backlog bytes now.
            arrived: (switch ingress port, priority) that received packets since the last
                sample.

        Returns:
            The pauses and resumes to apply, in order.
        """
        th = self.thresholds
        for key, level in backlog.items():
            if key not in self.xoff and level >= th.xoff_bytes:
                self.xoff[key] = now
                self.queue_xoff_events[key] += 1
            elif key in self.xoff and level <= th.xon_bytes:
                del self.xoff[key]
        wanted: dict[Key, set[str]] = defaultdict(set)
        for (port, prio) in self.xoff:
            held = {up for up, holders in self.holders.items() if port in holders
                    and up[1] == prio}
            for f in self.feeders.get(port, ()):
                if (f.ingress, prio) in arrived or (f.upstream, prio) in held:
                    wanted[(f.upstream, prio)].add(port)
        self.holders = wanted
        actions = []
        for key in sorted(set(wanted) | {k for k, p in self.ports.items()
                                         if p.paused_since is not None}):
            state = self.ports[key]
            want = key in wanted and now >= state.quarantine_until
            if want and state.paused_since is not None \
                    and now - state.paused_since > th.watchdog_s:
                state.watchdog_events += 1
                state.quarantine_until = now + th.watchdog_s
                want = False
            if want and state.paused_since is None:
                state.paused_since = now
                state.pause_events += 1
                actions.append(Action(key[0], key[1], True, self.hosts.get(key[0])))
            elif not want and state.paused_since is not None:
                state.paused_s += now - state.paused_since
                state.paused_since = None
                actions.append(Action(key[0], key[1], False, self.hosts.get(key[0])))
        self._find_cycles(now)
        return actions

    def _find_cycles(self, now: float) -> None:
        for prio in self.thresholds.priorities:
            graph = {port: holders for (port, p), holders in self.holders.items()
                     if p == prio and self.paused((port, p))}
            for cycle in pause_cycles(graph):
                self.cycles.setdefault((prio, tuple(cycle)), now)

    def close(self, now: float) -> list[Action]:
        """Release every pause (the agent stops); the paused time runs up to ``now``."""
        actions = []
        for key, state in sorted(self.ports.items()):
            if state.paused_since is not None:
                state.paused_s += now - state.paused_since
                state.paused_since = None
                actions.append(Action(key[0], key[1], False, self.hosts.get(key[0])))
        self.holders = defaultdict(set)
        self.xoff.clear()
        return actions

    def counters(self, now: float) -> dict[Key, dict]:
        """(port, priority) -> both directions: pauses received (``pause_events``: the port was
        paused, ``paused_s`` up to ``now``, ``watchdog_events``, ``paused`` now) and sent
        (``xoff_events``: its queue went XOFF and paused its feeders)."""
        out = {}
        for key in set(self.ports) | set(self.queue_xoff_events):
            state = self.ports.get(key, PortPause())
            running = now - state.paused_since if state.paused_since is not None else 0.0
            out[key] = {"pause_events": state.pause_events,
                        "paused_s": state.paused_s + running,
                        "watchdog_events": state.watchdog_events,
                        "paused": state.paused_since is not None,
                        "xoff_events": self.queue_xoff_events.get(key, 0)}
        return out

    def deadlocks(self) -> list[dict]:
        """Every pause cycle seen: its priority, ports, and when it was first seen."""
        return [{"priority": prio, "ports": list(ports), "first_seen": t}
                for (prio, ports), t in sorted(self.cycles.items(), key=lambda kv: kv[1])]
