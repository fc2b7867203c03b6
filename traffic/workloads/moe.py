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

import bisect
import random

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
    rng = random.Random(seed)
    popularity = list(range(experts))
    rng.shuffle(popularity)  # which expert is the most popular: seeded, not always expert 0
    weights = [1.0 / (popularity[e] + 1) ** skew for e in range(experts)]
    cumulative, total = [], 0.0
    for w in weights:
        total += w
        cumulative.append(total)
    per_rank = experts // ranks
    out = [[0] * ranks for _ in range(ranks)]
    for src in range(ranks):
        for _ in range(tokens_per_rank):
            chosen: set[int] = set()
            while len(chosen) < top_k:  # top-k distinct experts
                chosen.add(bisect.bisect_left(cumulative, rng.random() * total))
            for e in chosen:
                out[src][min(e, experts - 1) // per_rank] += token_bytes
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
    """Every off-diagonal entry as one transfer, all in one step. ``size_bytes`` is the most
    any rank sends (NCCL-tests' size of an uneven all-to-all: the largest send buffer)."""
    n = len(matrix)
    sched = Schedule("all_to_allv", "direct", n, max(sum(r) for r in matrix),
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
