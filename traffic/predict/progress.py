"""How a collective's ranks progress each at its own pace (pure): an event-driven fluid
simulation of the agents' step engine for schedules whose every transfer has a connection to
itself (a pairwise all-to-all: rank ``r`` sends to ``r + s`` in step ``s``).

The step-by-step model (:mod:`traffic.predict.predictor`) starts a step when the slowest
transfer of the one before has ended. The agents do not wait for it: a rank hands its next
step's sends over once its own receives of the step are in, so a rank whose transfers drew
good paths moves on while others still wait for a congested link. What holds it back is the
peer: a receiver reads a connection only once it has reached that transfer's step, so a
sender ahead of its receiver gets a receive window's worth into the network
(:data:`RECEIVE_WINDOW`) and then waits. Flows share links max-min fairly throughout (a new
TCP flow takes its fair share of a bottleneck from an established one within a tenth of a
second: ``docs/measurements/workloads.md``).

Time moves from event to event (a flow's last byte delivered, a flow filling its window, a
rank handing its next step over); flows due within :data:`TOGETHER` of the next event reach
it with that event, midway, as :func:`traffic.predict.flowsim.finish_times` groups them.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from traffic.predict.flowsim import Path, maxmin_rates

#: what a sender gets into a receiver that has not reached its transfer's step: a fresh
#: connection's receive window (half of the 128 KiB ``tcp_rmem`` default buffer; autotuning
#: grows a buffer only while its application reads)
RECEIVE_WINDOW = 64 * 1024
#: events due within this share of the time to the next one happen with it
TOGETHER = 0.02


def own_connections(transfers: Sequence[tuple[int, int, int]]) -> bool:
    """Whether a schedule's transfers ``(step, src, dst)`` each have their own connection
    (no pair of ranks exchanges in two steps) over more than one step: where
    :func:`completion` applies."""
    pairs = {(src, dst) for _step, src, dst in transfers}
    return len(pairs) == len(transfers) and len({step for step, _s, _d in transfers}) > 1


def completion(flows: Sequence[tuple[int, int, int, float, Path]], capacity: Sequence[float],
               handoff: float, window: float = RECEIVE_WINDOW,
               shares: Sequence[float] | None = None) -> float:
    """Seconds from the first rank's first step until every rank's last receive is in and
    its hand-off (``handoff``) done.

    Args:
        flows: (step, sender rank, receiver rank, bytes, path) of every connection's
            transfer, each connection carrying one (:func:`own_connections`).
        capacity: bytes per second of every link a path names.
        handoff: seconds between a rank's last receive of a step and its next step's sends.
        window: bytes a transfer delivers before its receiver reaches its step.
        shares: each flow's claim where it shares a link (None: fair).

    Raises:
        ValueError: a flow on a link of no capacity.
    """
    if not flows:
        return 0.0
    return _Run(flows, capacity, handoff, window, shares).run()


class _Run:
    """One simulation: the flows' bytes, the ranks' places in their programs, the timers."""

    def __init__(self, flows: Sequence[tuple[int, int, int, float, Path]],
                 capacity: Sequence[float], handoff: float, window: float,
                 shares: Sequence[float] | None) -> None:
        links = sorted({link for *_rest, path in flows for link, _w in path})
        column = {link: i for i, link in enumerate(links)}
        self.cap = np.array([capacity[link] for link in links], dtype=float)
        if (self.cap <= 0).any():
            raise ValueError("a flow crosses a link of no capacity")
        count = len(flows)
        self.weights = np.zeros((count, len(links)))
        for row, (*_rest, path) in enumerate(flows):
            for link, w in path:
                self.weights[row, column[link]] += w
        self.size = np.array([f[3] for f in flows], dtype=float)
        self.share = np.ones(count) if shares is None else np.asarray(shares, dtype=float)
        self.receiver = [f[2] for f in flows]
        self.handoff, self.window = handoff, window
        self.delivered = np.zeros(count)
        self.sending = np.zeros(count, dtype=bool)  # the sender has handed it over
        self.posted = np.zeros(count, dtype=bool)  # the receiver has reached its step
        self.complete = self.size <= 0
        # rank -> step -> (its sends, its receives), and the steps in order
        self.program: dict[int, dict[int, tuple[list[int], list[int]]]] = {}
        for i, (step, src, dst, _n, _p) in enumerate(flows):
            self.program.setdefault(src, {}).setdefault(step, ([], []))[0].append(i)
            self.program.setdefault(dst, {}).setdefault(step, ([], []))[1].append(i)
        self.order = {rank: sorted(steps) for rank, steps in self.program.items()}
        self.at = dict.fromkeys(self.program, 0)  # each rank's place in its step order
        self.waiting: dict[int, int] = {}  # rank -> its step's receives not yet complete
        self.timers = [(0.0, rank) for rank in sorted(self.program)]  # (when, rank) hand-offs
        heapq.heapify(self.timers)
        self.now = self.last = 0.0

    def run(self) -> float:
        """Event after event until every receive is in."""
        while True:
            while self.timers and self.timers[0][0] <= self.now * (1 + 1e-12):
                self.dispatch(heapq.heappop(self.timers)[1])
            if self.complete.all():
                return self.last + self.handoff
            self.advance()

    def advance(self) -> None:
        """To the next event: the flows move at their max-min rates until one reaches its
        end or its window (those due within :data:`TOGETHER` with it) or a timer fires."""
        limit = np.where(self.posted, self.size, np.minimum(self.size, self.window))
        idx = np.flatnonzero(self.sending & (self.delivered < limit) & ~self.complete)
        next_timer = self.timers[0][0] - self.now if self.timers else np.inf
        if not len(idx):
            if not self.timers:
                raise RuntimeError("ranks wait for one another: the schedule deadlocks")
            self.now = self.timers[0][0]
            return
        rates = maxmin_rates(self.weights[idx], np.ones(len(idx)), self.cap, self.share[idx])
        due = (limit[idx] - self.delivered[idx]) / rates
        first = due.min()
        if next_timer < first:
            group = np.zeros(len(idx), dtype=bool)
            step = next_timer
        else:
            group = due <= first * (1 + TOGETHER)
            step = min((first + due[group].max()) / 2, next_timer)
        moved = self.delivered[idx] + rates * step
        reached = group | (moved >= limit[idx] * (1 - 1e-9))
        self.delivered[idx] = np.where(reached, limit[idx], np.minimum(moved, limit[idx]))
        self.now += step
        for i in idx[reached]:
            if self.posted[i] and self.delivered[i] >= self.size[i]:
                self.finish(int(i))

    def dispatch(self, rank: int) -> None:
        """``rank`` hands its next step over (and on through steps it only sends in)."""
        while self.at[rank] < len(self.order[rank]):
            sends, recvs = self.program[rank][self.order[rank][self.at[rank]]]
            self.at[rank] += 1
            self.sending[sends] = True
            self.posted[recvs] = True
            self.waiting[rank] = sum(1 for i in recvs if not self.complete[i])
            for i in recvs:
                if not self.complete[i] and self.delivered[i] >= self.size[i]:
                    self.finish(i)
            if recvs:
                return

    def finish(self, i: int) -> None:
        """Flow ``i`` is in and read: its receiver hands its next step over once its last
        receive of the step is."""
        self.complete[i] = True
        self.last = max(self.last, self.now)
        rank = self.receiver[i]
        self.waiting[rank] -= 1
        if not self.waiting[rank]:
            heapq.heappush(self.timers, (self.now + self.handoff, rank))
