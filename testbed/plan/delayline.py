"""A delay line and a lateness histogram, sans I/O: packets held until their time, and how
late whoever holds them was in letting them go.

A kernel without netem cannot hold a packet on a link for a while; a program can. Two do: the
UDP transports' agents (:mod:`traffic.transports.delayline`) hold what they receive, and the
hosts' delay relay (:mod:`testbed.linux.tunrelay`) holds every IPv4 packet a host receives,
each for its path's one-way delay. Both count their lateness in the same histogram, which sums
over holders and differences over collectives.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

#: the histogram's upper edges, microseconds (the last bucket is everything above); the
#: compiled agent engine counts in the same (traffic/native/src/host_io.c)
EDGES_US = (25, 50, 100, 250, 500, 1000, 2000, 4000, 8000, 16000, 32000)
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


def difference(before: dict[str, int] | None, after: dict[str, int] | None) -> dict[str, int]:
    """A histogram's counts between two readings of it (None: nothing counted)."""
    hist = empty()
    for bucket, count in (after or {}).items():
        hist[bucket] = count - (before or {}).get(bucket, 0)
    return hist


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
    """How late a holder was against its schedule: ``tx`` paced packets sent (an agent's),
    ``rx`` packets released from its delay line."""

    tx: dict[str, int] = field(default_factory=empty)
    rx: dict[str, int] = field(default_factory=empty)

    def sent(self, late_s: float) -> None:
        self.tx[bucket(late_s)] += 1

    def released(self, late_s: float) -> None:
        self.rx[bucket(late_s)] += 1

    def summary(self) -> dict:
        """``{"tx": {...}, "rx": {...}}`` (copies: the caller differences them)."""
        return {"tx": dict(self.tx), "rx": dict(self.rx)}
