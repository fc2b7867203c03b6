"""MoE expert parallelism's all-to-all as it is: uneven (pure; the first piece of uneven
all-to-alls, ``all_to_allv``).

A mixture-of-experts layer routes each token to ``top_k`` of ``experts`` experts (top-k
gating); the experts are spread evenly over the ranks (expert ``e`` on rank
``e // (experts / ranks)``). The dispatch all-to-all sends each token's hidden state to the
ranks of its experts, the combine all-to-all brings the results back (the same matrix,
transposed). Gating is rarely uniform: a few experts draw most tokens. :func:`token_routing`
draws each token's experts from a Zipf law over the experts (``skew`` 0: uniform; 1: the
classic 1/rank popularity), seeded, so a run is repeatable; which experts are popular is a
seeded permutation too (not always the first rank's).

:func:`all_to_allv` turns a bytes matrix (from the model, or given as a file's rows) into a
schedule: every pair at once, as NCCL's grouped sends run. What bounds it is the most loaded
rank, not the mean (:func:`most_loaded`).
"""

from __future__ import annotations

import numpy as np

from testbed.errors import ConfigError
from traffic.workloads.schedules import Schedule

Matrix = list[list[int]]


def token_routing(ranks: int, tokens_per_rank: int, experts: int, top_k: int,
                  token_bytes: int, skew: float = 0.0, seed: int = 0,
                  field_path: str = "moe") -> Matrix:
    """The dispatch matrix: bytes rank ``src`` sends rank ``dst`` (``[src][dst]``; the
    diagonal stays on the rank).

    Raises:
        ConfigError: naming the field, for counts that cannot place experts on ranks.
    """
    if ranks < 1 or experts < ranks or experts % ranks:
        raise ConfigError(f"{field_path}.experts", f"{experts} experts do not spread evenly "
                                                   f"over {ranks} ranks")
    if not 1 <= top_k <= experts:
        raise ConfigError(f"{field_path}.top_k", f"must be 1..{experts}, got {top_k}")
    if tokens_per_rank < 0 or token_bytes <= 0:
        raise ConfigError(f"{field_path}.tokens", "tokens must be >= 0 and their size > 0")
    if skew < 0:
        raise ConfigError(f"{field_path}.skew", f"must be >= 0, got {skew:g}")
    rng = np.random.default_rng(seed)
    popularity = rng.permutation(experts)  # the most popular expert: seeded, not always 0
    log_weight = -skew * np.log(popularity + 1.0)
    per_rank = experts // ranks
    out = [[0] * ranks for _ in range(ranks)]
    for src in range(ranks):
        if not tokens_per_rank:
            continue
        # top-k distinct experts per token, each drawn in proportion to its weight among the
        # experts not yet drawn: the k largest of log weight + Gumbel noise (the Gumbel top-k
        # trick), every token at once
        keys = log_weight + rng.gumbel(size=(tokens_per_rank, experts))
        chosen = np.argpartition(-keys, top_k - 1, axis=1)[:, :top_k]
        counts = np.bincount(chosen.ravel() // per_rank, minlength=ranks)
        out[src] = [int(c) * token_bytes for c in counts]
    return out


def transpose(matrix: Matrix) -> Matrix:
    """The combine all-to-all's matrix: every token's result goes back where it came from."""
    return [list(col) for col in zip(*matrix)]


def check_matrix(rows: object, field_path: str) -> Matrix:
    """A matrix given as rows (a file's): square, non-negative integers.

    Raises:
        ConfigError: naming the row and column of the first bad entry.
    """
    if not isinstance(rows, list) or not rows:
        raise ConfigError(field_path, "a matrix is a non-empty list of rows")
    n = len(rows)
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != n:
            raise ConfigError(f"{field_path}[{i}]", f"row {i} must have {n} entries (a square "
                                                   "matrix: one per rank)")
        for j, v in enumerate(row):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"{field_path}[{i}][{j}]",
                                  f"bytes must be a non-negative integer, got {v!r}")
    return [list(r) for r in rows]


def all_to_allv(matrix: Matrix, field_path: str = "all_to_allv") -> Schedule:
    """Every off-diagonal entry as one transfer, all in one step. ``size_bytes`` is what the
    most loaded rank moves over the network (:func:`most_loaded`): the bytes its link must
    carry, so that busbw (factor 1) and the ideal time follow it, not the mean."""
    n = len(matrix)
    sched = Schedule("all_to_allv", "direct", n, max(1, most_loaded(matrix)[1]),
                     field_path=field_path)
    for src, row in enumerate(matrix):
        for dst, nbytes in enumerate(row):
            sched.add(0, src, dst, nbytes)
    return sched


def most_loaded(matrix: Matrix) -> tuple[int, int]:
    """The rank that moves the most bytes over the network (what it sends or what it
    receives, whichever is more; the diagonal stays home), and that many bytes."""
    n = len(matrix)
    loads = [max(sum(matrix[r][d] for d in range(n) if d != r),
                 sum(matrix[s][r] for s in range(n) if s != r)) for r in range(n)]
    rank = max(range(n), key=lambda r: (loads[r], -r))
    return rank, loads[rank]


#: the keys of an all_to_allv entry's ``moe`` object, with their defaults
MOE_DEFAULTS = {"experts": None, "top_k": 2, "tokens": 1024, "token_bytes": 4096, "skew": 0.0,
                "seed": 1}


def entry_matrix(entry: dict, ranks: int, path: str, read_json) -> Matrix:
    """An ``all_to_allv`` workload entry's dispatch matrix: from ``moe`` (token routing:
    experts default one per rank) or ``matrix`` (rows inline, or a JSON file of rows read by
    ``read_json(path, field)``).

    Raises:
        ConfigError: naming the field.
    """
    if ("moe" in entry) == ("matrix" in entry):
        raise ConfigError(f"{path}.moe", "all_to_allv takes its sizes from moe (a token-routing "
                                         "model) or from matrix (bytes per rank pair): one of "
                                         "them")
    if "moe" in entry:
        m = {**MOE_DEFAULTS, **entry["moe"]}
        return token_routing(ranks, m["tokens"], m["experts"] or ranks, m["top_k"],
                             m["token_bytes"], float(m["skew"]), m["seed"], f"{path}.moe")
    rows = entry["matrix"]
    where = f"{path}.matrix"
    if isinstance(rows, str):
        rows = read_json(rows, where)
    matrix = check_matrix(rows, where)
    if len(matrix) != ranks:
        raise ConfigError(where, f"a {len(matrix)} x {len(matrix)} matrix for {ranks} ranks: "
                                 "one row and one column per rank")
    return matrix
