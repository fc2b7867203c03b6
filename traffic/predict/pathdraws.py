"""Many ECMP hash draws at once (pure): each collective's busiest-link bound, averaged over
hundreds of draws of every connection's path, as the control variate that makes a few full
simulations' mean precise (:class:`traffic.predict.predictor.Predictor`).

Under ECMP a connection's path is a draw (:meth:`~traffic.predict.router.Router.path`): at
every switch with a choice, a next hop uniformly (``per_switch`` hash bases) or one draw that
every switch reduces the same way (``shared``). A step of a collective takes at least its
busiest link's bytes over that link's capacity, and on a fabric where hashing decides the
time it takes about that bound plus what little the sharing adds. So the bound, summed over a
collective's steps, follows the full simulation draw for draw (a correlation of 0.99 for a
16-rank all-to-all on a leaf-spine), and costs a vector operation per connection instead of a
max-min simulation: its mean over :data:`PATH_DRAWS` draws, and the few full simulations'
excess over it, give the collective's expectation to a few tenths of a percent where the full
simulations alone give it to a few percent.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

#: draws of the paths for the bound's mean (fewer where a batch has many distinct steps)
PATH_DRAWS = 1024
#: the work (flows x links x draws summed over a batch's distinct steps) above which the
#: draws are cut to fit, and under :data:`MIN_DRAWS` the bound is left out
WORK_BUDGET = 4e7
MIN_DRAWS = 64

Path = tuple[tuple[int, float], ...]  # (link index, weight), sorted


def choices(router, src: str, dst: str, channel: int) -> tuple[list[Path], list[float]]:
    """The paths a connection may take and the probability of each under ``router``'s ECMP
    draw: the product of ``1/fan-out`` over a walk's switches (per-switch hashing), or the
    share of draws modulo the fan-outs' least common multiple that lead along it (shared)."""
    walks = router.candidates(src, dst, channel)
    if len(walks) == 1:
        return walks, [1.0]
    s, d, a, b = router.ends(src, dst, channel)
    if router.shared_hash:
        fans = {len(router.hops(n, b)) for n in _switches(router, a, b)}
        period = math.lcm(*fans)
        count: dict[Path, int] = {}
        for draw in range(period):
            path = _walk(router, s, d, a, b, lambda nxt, draw=draw: nxt[draw % len(nxt)])
            count[path] = count.get(path, 0) + 1
        paths = sorted(count)
        return paths, [count[p] / period for p in paths]
    prob: dict[Path, float] = {}
    stack = [(a, 1.0, [])]
    while stack:
        node, p, hops = stack.pop()
        if node == b:
            path = tuple(sorted((router.index[link], 1.0)
                                for link in [(s, a), (b, d)] + hops))
            prob[path] = prob.get(path, 0.0) + p
            continue
        nxt = router.hops(node, b)
        stack += [(peer, p / len(nxt), hops + [(node, peer)]) for peer in nxt]
    paths = sorted(prob)
    return paths, [prob[p] for p in paths]


def _switches(router, a: str, b: str) -> set[str]:
    """Every switch on a shortest walk from ``a`` to ``b``, ``b`` left out (the switches
    whose fan-outs a shared draw is reduced by)."""
    seen, todo = set(), [a]
    while todo:
        node = todo.pop()
        if node != b and node not in seen:
            seen.add(node)
            todo += list(router.hops(node, b))
    return seen


def _walk(router, s: str, d: str, a: str, b: str, pick) -> Path:
    """The links from NIC ``s`` through switches ``a`` .. ``b`` to NIC ``d``, ``pick``
    choosing each switch's next hop among its equal-cost ones."""
    hops = [(s, a), (b, d)]
    node = a
    while node != b:
        nxt = router.hops(node, b)
        peer = pick(nxt)
        hops.append((node, peer))
        node = peer
    return tuple(sorted((router.index[link], 1.0) for link in hops))


def step_bound(flows: Sequence[tuple[float, Path]], capacity: Sequence[float],
               mine: Sequence[bool]) -> float:
    """One draw of a step: the busiest link's bytes over its capacity among the links that
    ``mine`` flows cross (all flows' bytes count on them)."""
    load: dict[int, float] = {}
    for nbytes, path in flows:
        for link, w in path:
            load[link] = load.get(link, 0.0) + w * nbytes
    links = {link for (_n, path), m in zip(flows, mine) if m for link, _w in path}
    return max((load[link] / capacity[link] for link in links), default=0.0)


Flow = tuple[tuple, int, float]  # (connection key: job, src, dst, channel), job, bytes


class BoundDraws:
    """The mean over many path draws of each collective's summed step bounds
    (:func:`step_bound` on every draw's paths).

    Args:
        router: the fabric's paths (:class:`~traffic.predict.router.Router`).
        seed: the draws' seed.
    """

    def __init__(self, router, seed: int) -> None:
        self.router = router
        self.seed = seed
        self.capacity = np.asarray(router.capacity, dtype=float)
        self._choices: dict[tuple, tuple[list[Path], list[float]]] = {}

    def means(self, steps: list[tuple[int, list[Flow]]]
              ) -> tuple[dict[tuple[int, int], float], int] | None:
        """``steps``: every step of a batch as (its collective's place in the jobs, its
        flows). Returns per (job, collective place) the mean over the draws of its steps'
        summed bounds, and how many draws; None when the batch has too many distinct steps
        to draw :data:`MIN_DRAWS` times within :data:`WORK_BUDGET`."""
        shapes: dict[tuple, list[Flow]] = {}
        for _k, flows in steps:
            shapes.setdefault(tuple(flows), flows)
        work = sum(len(flows) * len(self._links(flows)) for flows in shapes.values()) or 1
        draws = min(PATH_DRAWS, int(WORK_BUDGET / work))
        if draws < MIN_DRAWS:
            return None
        rng = np.random.default_rng(self.seed)
        pick: dict[tuple, np.ndarray] = {}
        for key in dict.fromkeys(key for flows in shapes.values() for key, _j, _n in flows):
            paths, probs = self.choice(key)
            pick[key] = (np.zeros(draws, dtype=np.int64) if len(paths) == 1 else
                         np.minimum(np.searchsorted(np.cumsum(probs), rng.random(draws),
                                                    side="right"), len(paths) - 1))
        bounds = {shape: self._bounds(flows, pick, draws) for shape, flows in shapes.items()}
        total: dict[tuple[int, int], np.ndarray] = {}
        for k, flows in steps:
            for job, per_draw in bounds[tuple(flows)].items():
                total[(job, k)] = total.get((job, k), 0.0) + per_draw
        return {key: float(np.mean(v)) for key, v in total.items()}, draws

    def choice(self, key: tuple) -> tuple[list[Path], list[float]]:
        """A connection's paths and their probabilities (``key``: job, src, dst, channel)."""
        if key not in self._choices:
            self._choices[key] = choices(self.router, key[1], key[2], key[3])
        return self._choices[key]

    def _links(self, flows: list[Flow]) -> list[int]:
        return sorted({link for key, _j, _n in flows for path in self.choice(key)[0]
                       for link, _w in path})

    def _bounds(self, flows: list[Flow], pick: dict, draws: int) -> dict[int, np.ndarray]:
        """Per job of a step (``flows``), its bound on each draw."""
        links = self._links(flows)
        column = {link: i for i, link in enumerate(links)}
        load = np.zeros((draws, len(links)))
        crossed: dict[int, np.ndarray] = {}
        for key, job, nbytes in flows:
            paths, _p = self.choice(key)
            inc = np.zeros((len(paths), len(links)))
            for row, path in enumerate(paths):
                for link, w in path:
                    inc[row, column[link]] += w
            chosen = inc[pick[key]]
            load += nbytes * chosen
            crossed[job] = crossed.get(job, False) | (chosen > 0)
        ratio = load / self.capacity[links]
        return {job: np.where(mask, ratio, 0.0).max(axis=1) for job, mask in crossed.items()}
