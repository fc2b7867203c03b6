"""The run seed (pure): one ``seed`` (the file's top level, or ``fabriclab run --seed N``)
from which every random choice of a run derives.

Each feature keeps its own seed field, and one the file leaves out takes the run's: an
``op: flows`` pattern's permutation, a random placement of ranks or of a job's hosts, an
all-to-all's MoE token routing, a training workload's MoE routing and compute jitter. The
agents' TCP connections leave from source ports drawn from it
(:func:`traffic.agents.connect.source_ports`), so the
5-tuples an ECMP switch hashes, and so the paths, repeat from one run to the next. Without a
``seed`` every default is 1, as it was before the run seed existed.
"""

from __future__ import annotations

import copy

DEFAULT = 1


def run_seed(data: dict) -> int:
    """The run seed of an experiment's data."""
    seed = data.get("seed")
    return DEFAULT if seed is None else int(seed)


def apply(data: dict) -> dict:
    """``data`` with every seed of its workload it leaves out set to the run seed (a copy; the
    same object when it names no ``seed``)."""
    if data.get("seed") is None:
        return data
    seed = run_seed(data)
    out = copy.deepcopy(data)
    workload = out.get("workload")
    if isinstance(workload, dict):
        training = workload.get("training")
        if isinstance(training, dict):  # its own names for its seeds
            training.setdefault("moe_seed", seed)
            training.setdefault("jitter_seed", seed)
        _fill({k: v for k, v in workload.items() if k != "training"}, seed)
    return out


def _fill(node, seed: int) -> None:
    """Every mapping below ``node`` that takes a seed it does not give: a placement
    (``{count, placement}``), a pattern's permutation (``pattern``), MoE routing (``top_k``)."""
    if isinstance(node, dict):
        if "seed" not in node and ("placement" in node or "pattern" in node or "top_k" in node):
            node["seed"] = seed
        for value in node.values():
            _fill(value, seed)
    elif isinstance(node, list):
        for item in node:
            _fill(item, seed)
