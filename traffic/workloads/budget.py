"""What planning one experiment file may cost, over all its runs (pure).

A file's base, variants and sweep cells are each planned in full when it is validated: every
transfer of every collective's schedule (a training job's phases, a trace's entries) and every
MoE expert draw. The file's parse opens a :func:`planning` budget; schedules charge each
transfer as they make it and training jobs their expert draws before drawing them
(:func:`charge`), each unit at what it costs this machine to plan, so the whole file's
validation stays bounded however its runs multiply. Outside a budget nothing is counted."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

from testbed.errors import ConfigError

#: what one unit costs to plan here, ns: a transfer of a schedule (built, merged, checked)
#: and a MoE expert draw (a Gumbel key and its share of the top-k selection)
COST_NS = {"transfers": 3_000, "draws": 60}
#: the most planning a file's runs may cost together, ns
MOST_NS = 1_200_000_000

_spent: contextvars.ContextVar[dict[str, int] | None] = contextvars.ContextVar(
    "planning_budget", default=None)


@contextmanager
def planning() -> Iterator[dict[str, int]]:
    """One file's budget, for the duration of its parse; yields what was spent so far."""
    token = _spent.set(spent := {"ns": 0, **{unit: 0 for unit in COST_NS}})
    try:
        yield spent
    finally:
        _spent.reset(token)


def charge(field: str, unit: str, amount: int = 1, what: str = "") -> None:
    """Spend ``amount`` of ``unit`` (for ``what``, said when it is refused).

    Raises:
        ConfigError: naming ``field``, once the file's runs together would cost more than
            :data:`MOST_NS` to plan.
    """
    spent = _spent.get()
    if spent is None:
        return
    spent[unit] += amount
    spent["ns"] += amount * COST_NS[unit]
    if spent["ns"] > MOST_NS:
        raise ConfigError(field, (f"{what}: " if what else "")
                          + f"the file's runs together would take about "
                          f"{spent['ns'] / 1e9:.1f} s to plan ({spent['transfers']:,} "
                          f"transfers, {spent['draws']:,} MoE expert draws); at most "
                          f"{MOST_NS / 1e9:g} s: fewer variants, cells, iterations or ranks")
