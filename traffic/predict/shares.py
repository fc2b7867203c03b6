"""TCP's uneven shares of a link (pure): each connection's claim where several flows share
the links that bound a step, drawn per connection around the fair share."""

from __future__ import annotations

import math
import random


class Shares:
    """Each connection's claim on the links it shares, drawn once per draw: TCP's flows do
    not split a link evenly (per-connection rates vary by ``cv`` around the fair share,
    log-normally). Where one link bounds a step, that costs nothing (the link stays busy
    whoever sends); where several shared links bound it at once (an all-to-all with every
    link loaded alike), some flows end early and the last ones leave links idle: the step
    waits for the unluckiest link. Only such steps are drawn."""

    def __init__(self, cv: float, seed: int) -> None:
        self.sigma = math.sqrt(math.log(1 + cv * cv)) if cv > 0 else 0.0
        self.rng = random.Random(seed)
        self.claims: dict[tuple, float] = {}

    def of(self, keys: list[tuple], flows: list[tuple[int, tuple]],
           fair: list[float]) -> list[float] | None:
        """The flows' claims (mean 1), or None unless two links that carry several of
        ``flows`` are busy until the step's end at fair shares (``fair``: when each ends)."""
        if not self.sigma or critical_shared_links(flows, fair) < 2:
            return None
        for key in keys:
            if key not in self.claims:
                self.claims[key] = round(self.rng.lognormvariate(-self.sigma ** 2 / 2,
                                                                 self.sigma), 4)
        return [self.claims[key] for key in keys]


def critical_shared_links(flows: list[tuple[int, tuple]], ends: list[float]) -> int:
    """How many links carry two or more of ``flows`` and are busy until the last ends (within
    1 %)."""
    makespan = max(ends, default=0.0)
    count: dict[int, int] = {}
    busy: dict[int, float] = {}
    for (_n, path), end in zip(flows, ends):
        for link, _w in path:
            count[link] = count.get(link, 0) + 1
            busy[link] = max(busy.get(link, 0.0), end)
    return sum(1 for link, n in count.items() if n > 1 and busy[link] >= 0.99 * makespan)
