"""What planning one experiment file may expand to, over all its runs (pure).

A file's base, variants and sweep cells are each planned in full when it is validated; a
training job's phases and its MoE layers' expert draws are the costly part. The file's parse
opens a :func:`planning` budget; each training job charges what it will expand to
(:func:`charge`) before expanding it, so the whole file's validation stays bounded however its
runs multiply. Outside a budget nothing is counted."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

from testbed.errors import ConfigError

#: the most of each unit a file's runs expand to together: communication phases (each a
#: collective the agents run; about 5 us each to plan here) and MoE expert draws (tokens x
#: experts; about 60 ns each here): a quarter and half a second of this machine's planning
MOST = {"phases": 50_000, "draws": 10_000_000}

_spent: contextvars.ContextVar[dict[str, int] | None] = contextvars.ContextVar(
    "planning_budget", default=None)


@contextmanager
def planning() -> Iterator[dict[str, int]]:
    """One file's budget, for the duration of its parse; yields what was spent so far."""
    token = _spent.set(spent := {unit: 0 for unit in MOST})
    try:
        yield spent
    finally:
        _spent.reset(token)


def charge(field: str, unit: str, amount: int, what: str) -> None:
    """Spend ``amount`` of ``unit`` for one run's ``what`` (``plans N phases``).

    Raises:
        ConfigError: naming ``field``, once a run alone, or the file's runs together, would
            expand to more than :data:`MOST` allows.
    """
    spent = _spent.get()
    total = amount + (spent[unit] if spent is not None else 0)
    if total > MOST[unit]:
        together = "" if total == amount else f" ({total:,} over all the file's runs)"
        raise ConfigError(field, f"{what}{together}; at most {MOST[unit]:,} {unit}")
    if spent is not None:
        spent[unit] = total
