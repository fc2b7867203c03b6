"""Sweeps (pure): the cells of an experiment's ``sweep`` section, their names, which of them an
interrupted sweep still has to run, and the summary over repetitions.

``sweep: {axes: {FIELD.PATH: [values...], ...}, repetitions: N}``: every combination of the
axes' values is a cell (for each variant, when the experiment has variants), run ``N`` times.
A cell is a whole experiment: the base (or the variant) with the axes' fields set, validated
like a variant before anything runs. Running them is :mod:`fabriclab.modes`'s; which
cells can share a fabric is :func:`fabric_key`'s.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass, field

from testbed.errors import ConfigError
from traffic.measure.results import row_label

_INDEX = re.compile(r"\[\d+\]")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.=+,#-]")


@dataclass(frozen=True)
class CellPlan:
    """One cell before parsing: where it runs and what it sets."""

    name: str  # also its directory under the sweep's output (``variant/cell`` with variants)
    variant: str | None
    values: dict[str, object] = field(default_factory=dict)  # field path -> value
    repetition: int = 1
    group: str = ""  # the name without the repetition (the summary's line)


def axis_labels(paths: list[str]) -> dict[str, str]:
    """Short labels for the axes: a path's last field (``controller.routing`` -> ``routing``),
    the whole path where two axes would share one."""
    short = {p: _INDEX.sub("", p.split(".")[-1]) or p for p in paths}
    counts: dict[str, int] = {}
    for label in short.values():
        counts[label] = counts.get(label, 0) + 1
    return {p: (label if counts[label] == 1 else p) for p, label in short.items()}


def value_label(value: object, index: int) -> str:
    """A value as it appears in a cell's name: scalars as written, an object by its scalar
    values (``{mode: local_adaptive, granularity: packet}`` -> ``local_adaptive-packet``), a
    list of events by their actions (``[]`` -> ``none``, a failure and its repair ->
    ``down-up``), anything else by its position in the axis (``#2``)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float, str)) and value != "":
        return str(value)
    if value == []:
        return "none"
    if isinstance(value, list) and all(isinstance(v, dict) and "action" in v for v in value):
        return "-".join(dict.fromkeys(str(v["action"]) for v in value))
    if isinstance(value, dict):
        words = [str(v) for v in value.values() if isinstance(v, (int, float, str))]
        if words:
            return "-".join(words)
    return f"#{index}"


#: the most cells a sweep may plan (variants x every combination of the axes x repetitions),
#: and the most of them that differ (each is validated as a whole experiment, a few ms each):
#: checked before any is made (a few lines of axes multiply into millions)
MOST_CELLS = 10_000
MOST_DISTINCT_CELLS = 200


def plan_cells(sweep: dict, variants: list[str | None]) -> list[CellPlan]:
    """The cells of a ``sweep`` section, in order: variants outermost, then the axes in the
    order written (the last one fastest), then the repetitions.

    Raises:
        ConfigError: ``sweep.axes.PATH`` for an empty axis or a value listed twice.
    """
    axes: dict[str, list] = sweep.get("axes") or {}
    if not axes:
        raise ConfigError("sweep.axes", "a sweep needs at least one axis")
    for path, values in axes.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"sweep.axes.{path}", "an axis needs at least one value")
        seen = [repr(v) for v in values]
        if len(set(seen)) != len(seen):
            raise ConfigError(f"sweep.axes.{path}", "a value is listed twice")
    repetitions = int(sweep.get("repetitions", 1))
    distinct = len(variants) * math.prod(len(v) for v in axes.values())
    if distinct * repetitions > MOST_CELLS or distinct > MOST_DISTINCT_CELLS:
        raise ConfigError("sweep", f"plans {distinct * repetitions:,} cells, {distinct:,} of "
                                   "them different (variants x the axes' values, x "
                                   f"repetitions); at most {MOST_CELLS:,} and "
                                   f"{MOST_DISTINCT_CELLS:,} different")
    labels = axis_labels(list(axes))
    cells = []
    for variant in variants:
        for combo in itertools.product(*(list(enumerate(v)) for v in axes.values())):
            name = ",".join(f"{labels[p]}={value_label(v, i)}" for p, (i, v) in zip(axes, combo))
            name = _UNSAFE.sub("_", name)
            for rep in range(1, repetitions + 1):
                cell = name + (f",r{rep}" if repetitions > 1 else "")
                group = f"{variant}/{name}" if variant else name
                cells.append(CellPlan(f"{variant}/{cell}" if variant else cell, variant,
                                      {p: v for p, (_, v) in zip(axes, combo)}, rep, group))
    names = [c.name for c in cells]
    if len(set(names)) != len(names):  # two values cleaned into one folder name
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ConfigError("sweep.axes", f"two cells would share the folder {twice[0]!r}: "
                                        "give values that differ in letters or digits")
    return cells


# what a run reads but the fabric's build does not: a cell that differs from the previous one
# only here runs on the previous cell's fabric (with a fresh controller: ``controller`` too)
RUN_ONLY = ("version", "name", "description", "controller", "scale", "workload", "variants",
            "sweep")


def fabric_key(raw: dict) -> str:
    """What of an experiment (as expanded, :attr:`Experiment.raw`) its fabric's build reads:
    two experiments with the same key build the same fabric."""
    return json.dumps({k: v for k, v in raw.items() if k not in RUN_ONLY}, sort_keys=True,
                      default=str)


def pending(cells: list, finished: set[str]) -> list:
    """The cells an interrupted sweep still has to run: those without a complete result
    (``finished``: the names of the cells whose ``results.json`` says complete)."""
    return [c for c in cells if c.name not in finished]


def summarize(rows: list[dict]) -> list[dict]:
    """One line per cell over its repetitions: each job's busbw and efficiency as mean and
    standard deviation (of the complete repetitions), and how many failed.

    ``rows``: per run, ``{"cell": name without the repetition, "values": {...}, "complete":
    bool, "error": str|None, "jobs": [{"label", "op", "busbw_GBps", "efficiency"}, ...]}``.
    """
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["cell"], []).append(row)
    out = []
    for cell, runs in groups.items():
        done = [r for r in runs if r["complete"]]
        jobs = []
        labels = [row_label(j) for j in (done[0]["jobs"] if done else [])]
        for i, label in enumerate(labels):
            eff = [r["jobs"][i]["efficiency"] for r in done if i < len(r["jobs"])]
            bw = [r["jobs"][i]["busbw_GBps"] for r in done if i < len(r["jobs"])]
            jobs.append({"label": label, "efficiency": _mean_sd(eff), "busbw_GBps": _mean_sd(bw)})
        out.append({"cell": cell, "values": runs[0]["values"], "runs": len(runs),
                    "failed": len(runs) - len(done),
                    "errors": [r["error"] for r in runs if r.get("error")], "jobs": jobs})
    return out


def total_timings(rows: list[dict]) -> dict[str, float]:
    """Each phase's seconds (bring-up, measurement, teardown, total) summed over the runs'
    ``timings_s``."""
    phases: dict[str, float] = {}
    for row in rows:
        for phase, seconds in (row.get("timings_s") or {}).items():
            phases[phase] = round(phases.get(phase, 0.0) + seconds, 1)
    return phases


def _mean_sd(values: list[float]) -> dict:
    if not values:
        return {"mean": None, "sd": None, "n": 0}
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) \
        if len(values) > 1 else 0.0
    return {"mean": mean, "sd": sd, "n": len(values)}
