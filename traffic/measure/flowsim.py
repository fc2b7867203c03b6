"""Max-min fair sharing of links by flows that start together (pure): how long a set of
transfers takes when every link divides its capacity max-min fairly among the flows that
cross it, re-divided each time a flow ends (a fluid model of long-lived TCP or rate-controlled
flows, without queues, losses or slow start).

A flow crosses each of its links with a weight: 1 for a flow on one path; the share of its
bytes on that link for a flow sprayed over several paths (its rate then counts on each link
in proportion, as a packet spray with fixed per-path shares does). Flows that are alike
(same size, same links and weights) are one flow with a multiplicity, so that ``n``
connections per peer on one path cost what one does.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: relative tolerance under which two levels, or two finish times, are one
EPS = 1e-9

Path = tuple[tuple[int, float], ...]  # (link index, weight), sorted


def merge_flows(flows: Sequence[tuple[float, Path]]) -> list[tuple[float, Path, int]]:
    """Alike flows as one: (bytes, path, multiplicity)."""
    count: dict[tuple[float, Path], int] = {}
    for nbytes, path in flows:
        key = (float(nbytes), tuple(sorted(path)))
        count[key] = count.get(key, 0) + 1
    return [(nbytes, path, n) for (nbytes, path), n in count.items()]


def maxmin_rates(weights: np.ndarray, mult: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Each flow's max-min fair rate (progressive filling).

    Args:
        weights: flows x links, a flow's weight on each link.
        mult: flows, how many alike flows each row stands for.
        capacity: links, bytes per second.
    """
    rates = np.zeros(len(weights))
    free = capacity.astype(float).copy()
    open_ = np.ones(len(weights), dtype=bool)
    load = weights * mult[:, None]
    while open_.any():
        demand = load[open_].sum(axis=0)
        used = demand > 0
        if not used.any():  # flows that cross no link: unbounded
            rates[open_] = np.inf
            break
        level = np.full(len(free), np.inf)
        level[used] = np.maximum(free[used], 0.0) / demand[used]
        low = level.min()
        tight = level <= low * (1 + EPS) + 1e-300
        frozen = open_ & (weights[:, tight] > 0).any(axis=1)
        rates[frozen] = low
        free -= (load[frozen] * low).sum(axis=0)
        open_ &= ~frozen
    return rates


def makespan(flows: Sequence[tuple[float, Path]], capacity: Sequence[float]) -> float:
    """Seconds until the last of ``flows`` (bytes, path) ends, all starting at 0.

    Raises:
        ValueError: a flow on a link of no capacity.
    """
    return max(finish_times(flows, capacity), default=0.0)


def finish_times(flows: Sequence[tuple[float, Path]], capacity: Sequence[float]) -> list[float]:
    """When each of ``flows`` (bytes, path) ends, all starting at 0 (in their order).

    Raises:
        ValueError: a flow on a link of no capacity.
    """
    merged = [f for f in merge_flows(flows) if f[0] > 0]
    if not merged:
        return [0.0] * len(flows)
    links = sorted({link for _n, path, _m in merged for link, _w in path})
    column = {link: i for i, link in enumerate(links)}
    cap = np.array([capacity[link] for link in links], dtype=float)
    if (cap <= 0).any():
        raise ValueError("a flow crosses a link of no capacity")
    weights = np.zeros((len(merged), len(links)))
    for row, (_n, path, _m) in enumerate(merged):
        for link, w in path:
            weights[row, column[link]] += w
    left = np.array([n for n, _p, _m in merged], dtype=float)
    mult = np.array([m for _n, _p, m in merged], dtype=float)
    active = np.ones(len(merged), dtype=bool)
    ended = np.zeros(len(merged))
    now = 0.0
    while active.any():
        idx = np.flatnonzero(active)
        rates = maxmin_rates(weights[idx], mult[idx], cap)
        finish = left[idx] / rates
        step = finish.min()
        now += step
        left[idx] -= rates * step
        done = finish <= step * (1 + 1e-6)
        left[idx[done]] = 0.0
        active[idx[done]] = False
        ended[idx[done]] = now
    at = {(nbytes, path): float(t) for (nbytes, path, _m), t in zip(merged, ended)}
    return [at.get((float(nbytes), tuple(sorted(path))), 0.0) for nbytes, path in flows]
