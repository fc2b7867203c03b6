"""The agents' delay line and their timing, sans I/O.

A kernel without netem cannot hold a packet on a link for a while. The UDP transports' agents
can: every datagram an agent receives waits in its :class:`DelayLine` until its path's one-way
delay has passed since it arrived (the links' latency, summed along the path and added at the
receiving end; queueing at the switches happened on the way, at the emulated rates). Data and
acknowledgements alike: a round trip then carries both directions' delay.

Putting the whole path's latency at its end keeps what the end hosts see (every round trip,
the ACK clock, the delay a delay-based control measures) and every queue's service; what moves
is where in the round trip a flow's packets spend their latency: a switch sees a flow's packets
up to one path's latency earlier than with the latency spread over the hops, a constant shift
per flow that matters only to flows whose start times are within a path's latency of each
other's (a few microseconds of the real fabric).

:class:`Lateness` counts how late the agent did what it was due to do (a packet released, a
paced packet sent), in a histogram that sums over agents and differences over collectives.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

#: the histogram's upper edges, microseconds (the last bucket is everything above)
EDGES_US = (250, 500, 1000, 2000, 4000, 8000, 16000, 32000)
OVER = f"over_{EDGES_US[-1]}"


@dataclass
class DelayLine:
    """Packets held until their time."""

    heap: list = field(default_factory=list)
    seq: itertools.count = field(default_factory=itertools.count)

    def hold(self, due: float, item: object) -> None:
        """Keep ``item`` until ``due`` (the clock's seconds)."""
        heapq.heappush(self.heap, (due, next(self.seq), item))

    def next_time(self) -> float | None:
        """When the next item is due (None: nothing held)."""
        return self.heap[0][0] if self.heap else None

    def release(self, now: float) -> list[tuple[float, object]]:
        """Every item due by ``now``, in order, each with its due time."""
        out = []
        while self.heap and self.heap[0][0] <= now:
            due, _, item = heapq.heappop(self.heap)
            out.append((due, item))
        return out

    def __len__(self) -> int:
        return len(self.heap)


def bucket(late_s: float) -> str:
    """The histogram bucket of a lateness (``le_250``: at most 250 us)."""
    us = late_s * 1e6
    for edge in EDGES_US:
        if us <= edge:
            return f"le_{edge}"
    return OVER


def empty() -> dict[str, int]:
    return {**{f"le_{e}": 0 for e in EDGES_US}, OVER: 0}


def quantile_us(hist: dict[str, int], q: float) -> float | None:
    """The upper edge of the bucket that holds quantile ``q`` (an upper bound of it; the
    overflow bucket counts as twice the last edge). None: an empty histogram."""
    total = sum(hist.values())
    if not total:
        return None
    rank, seen = q * total, 0
    for edge in EDGES_US:
        seen += hist.get(f"le_{edge}", 0)
        if seen >= rank:
            return float(edge)
    return 2.0 * EDGES_US[-1]


@dataclass
class Lateness:
    """How late an agent was against its schedule: ``tx`` paced packets sent, ``rx`` packets
    released from its delay line."""

    tx: dict[str, int] = field(default_factory=empty)
    rx: dict[str, int] = field(default_factory=empty)

    def sent(self, late_s: float) -> None:
        self.tx[bucket(late_s)] += 1

    def released(self, late_s: float) -> None:
        self.rx[bucket(late_s)] += 1

    def summary(self) -> dict:
        """``{"tx": {...}, "rx": {...}}`` (copies: the caller differences them)."""
        return {"tx": dict(self.tx), "rx": dict(self.rx)}


class AgentTiming:
    """An agent's latency and timing: the delay line for what it receives (``delays_s``: the
    one-way delay from each rank; None: none), its lateness, the least round trip its senders
    measured (and the least against each path's unloaded one, ``rtts_s``), and its pings'
    round trips less the links' latency (what the emulation adds)."""

    def __init__(self, delays_s: list[float] | None, rtts_s: list[float] | None) -> None:
        self.delays_s = delays_s if delays_s and any(delays_s) else None
        self.rtts_s = rtts_s
        self.line = DelayLine()
        self.late = Lateness()
        self.rtt_min_s: float | None = None
        self.rtt_min_ratio: float | None = None
        self.probe_excess_s: list[float] = []
        self.pongs = 0

    def delay(self, peer: int) -> float:
        """How long a packet from rank ``peer`` waits (-1: not a rank of the job: none)."""
        return self.delays_s[peer] if self.delays_s and peer >= 0 else 0.0

    def released(self, now: float) -> list[object]:
        """The held items due by ``now``, their lateness counted."""
        out = []
        for due, item in self.line.release(now):
            self.late.released(now - due)
            out.append(item)
        return out

    def rtt(self, rtt: float, peer: int) -> None:
        """A round trip a sender measured to ``peer``."""
        if rtt <= 0:
            return
        if self.rtt_min_s is None or rtt < self.rtt_min_s:
            self.rtt_min_s = rtt
        unloaded = self.rtts_s[peer] if self.rtts_s and peer >= 0 else 0.0
        if unloaded > 0 and (self.rtt_min_ratio is None or rtt / unloaded < self.rtt_min_ratio):
            self.rtt_min_ratio = rtt / unloaded

    def pong(self, rtt: float, peer: int) -> None:
        """A ping's answer from ``peer``, ``rtt`` after it left."""
        self.probe_excess_s.append(max(0.0, rtt - 2 * self.delay(peer)))
        self.pongs += 1

    def summary(self) -> dict:
        """The counters the agent reports (see :class:`traffic.measure.rows.TransportCounters`)."""
        out: dict = {"lateness_us": self.late.summary()}
        if self.rtt_min_s is not None:
            out["rtt_min_us"] = round(self.rtt_min_s * 1e6, 1)
        if self.rtt_min_ratio is not None:
            out["rtt_min_ratio"] = round(self.rtt_min_ratio, 4)
        if self.probe_excess_s:
            out["probe_excess_min_us"] = round(min(self.probe_excess_s) * 1e6, 1)
            out["probe_excess_max_us"] = round(max(self.probe_excess_s) * 1e6, 1)
        return out
