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


def merge_flows(flows: Sequence[tuple[float, Path]],
                shares: Sequence[float] | None = None) -> list[tuple[float, Path, int, float]]:
    """Alike flows as one: (bytes, path, multiplicity, share)."""
    count: dict[tuple[float, Path, float], int] = {}
    for i, (nbytes, path) in enumerate(flows):
        key = (float(nbytes), tuple(sorted(path)), 1.0 if shares is None else float(shares[i]))
        count[key] = count.get(key, 0) + 1
    return [(nbytes, path, n, share) for (nbytes, path, share), n in count.items()]


def maxmin_rates(weights: np.ndarray, mult: np.ndarray, capacity: np.ndarray,
                 shares: np.ndarray | None = None) -> np.ndarray:
    """Each flow's max-min fair rate (progressive filling), weighted by ``shares``.

    Args:
        weights: flows x links, a flow's weight on each link.
        mult: flows, how many alike flows each row stands for.
        capacity: links, bytes per second.
        shares: flows, each one's claim where it shares a link (None: all 1): a flow with
            share 2 gets twice the rate of a flow with share 1 on a link both are bound by.
    """
    share = np.ones(len(weights)) if shares is None else shares
    rates = np.zeros(len(weights))
    free = capacity.astype(float).copy()
    open_ = np.ones(len(weights), dtype=bool)
    load = weights * (mult * share)[:, None]
    crosses = weights > 0
    demand = load.sum(axis=0)  # the open flows' claims on each link, kept as they freeze
    floor = demand * 1e-9  # under this a link's demand is what rounding left of a frozen one
    while open_.any():
        used = np.flatnonzero(demand > floor)
        if not len(used):  # flows that cross no link: unbounded
            rates[open_] = np.inf
            break
        level = np.maximum(free[used], 0.0) / demand[used]
        low = level.min()
        tight = used[level <= low * (1 + EPS) + 1e-300]
        frozen = open_ & crosses[:, tight].any(axis=1)
        rates[frozen] = low * share[frozen]
        taken = load[frozen].sum(axis=0)
        free -= taken * low
        demand -= taken
        open_ &= ~frozen
    return rates


def makespan(flows: Sequence[tuple[float, Path]], capacity: Sequence[float]) -> float:
    """Seconds until the last of ``flows`` (bytes, path) ends, all starting at 0.

    Raises:
        ValueError: a flow on a link of no capacity.
    """
    return max(finish_times(flows, capacity), default=0.0)


def finish_times(flows: Sequence[tuple[float, Path]], capacity: Sequence[float],
                 shares: Sequence[float] | None = None, together: float = 1e-6) -> list[float]:
    """When each of ``flows`` (bytes, path) ends, all starting at 0 (in their order);
    ``shares`` weight their claims on the links they share (:func:`maxmin_rates`). Flows
    due within ``together`` (relative to the time) of the next to end end with it, midway
    (fewer re-sharings for many flows of uneven shares, each at most that much early or
    late).

    Raises:
        ValueError: a flow on a link of no capacity.
    """
    merged = [f for f in merge_flows(flows, shares) if f[0] > 0]
    if not merged:
        return [0.0] * len(flows)
    links = sorted({link for _n, path, _m, _s in merged for link, _w in path})
    column = {link: i for i, link in enumerate(links)}
    cap = np.array([capacity[link] for link in links], dtype=float)
    if (cap <= 0).any():
        raise ValueError("a flow crosses a link of no capacity")
    weights = np.zeros((len(merged), len(links)))
    for row, (_n, path, _m, _s) in enumerate(merged):
        for link, w in path:
            weights[row, column[link]] += w
    left = np.array([n for n, _p, _m, _s in merged], dtype=float)
    mult = np.array([m for _n, _p, m, _s in merged], dtype=float)
    share = np.array([s for _n, _p, _m, s in merged], dtype=float)
    active = np.ones(len(merged), dtype=bool)
    ended = np.zeros(len(merged))
    now = 0.0
    while active.any():
        idx = np.flatnonzero(active)
        rates = maxmin_rates(weights[idx], mult[idx], cap, share[idx])
        finish = left[idx] / rates
        first = finish.min()
        done = finish <= first * (1 + together) + now * together
        step = (first + finish[done].max()) / 2  # a group ends midway: as much early as late
        now += step
        left[idx] -= rates * step
        left[idx[done]] = 0.0
        active[idx[done]] = False
        ended[idx[done]] = now
    at = {(nbytes, path, s): float(t) for (nbytes, path, _m, s), t in zip(merged, ended)}
    return [at.get((float(nbytes), tuple(sorted(path)),
                    1.0 if shares is None else float(shares[i])), 0.0)
            for i, (nbytes, path) in enumerate(flows)]
