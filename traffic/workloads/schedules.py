"""Pure collective schedules: which rank sends how many bytes to which, in which order.

A schedule is a list of steps per rank. Within a step a rank's sends and receives run at once; a
rank starts the sends of step ``s`` only when every receive of its step ``s - 1`` has completed.
That is the data dependency of the algorithms below (a ring rank forwards the chunk it has just
received; a tree node sends up once its children's data is in), without pipelining inside a step.

Sizes follow NCCL-tests: ``size_bytes`` is the per-rank buffer of all-reduce and broadcast, the
total (all ranks' chunks together) of all-gather and reduce-scatter, and the per-rank send buffer
of all-to-all (``size / n`` to every rank, itself included).

Algorithms:

* all_reduce ``ring``: reduce-scatter then all-gather around the ring, ``2(n-1)`` steps of
  ``size/n`` each: every rank sends ``2(n-1)/n * size``.
* all_reduce ``rhd``: recursive halving (reduce-scatter) then doubling (all-gather), ``2 log2 n``
  steps; with ``n`` not a power of two, the extra ranks first hand their data to a partner and get
  the result back at the end (Rabenseifner).
* all_reduce ``tree``: reduce to rank 0 up a binary tree, then broadcast down it (``size`` per
  tree edge each way).
* reduce_scatter, all_gather ``ring``: ``n - 1`` steps of ``size/n``.
* all_to_all ``pairwise``: step ``s`` sends to rank ``r + s`` and receives from ``r - s``
  (MPI's pairwise exchange: a step waits for the previous one's data).
* all_to_all ``direct``: every rank sends to every other at once, in one step (NCCL's: the
  sends and receives of a group progress together).
* broadcast ``ring``: a chain from the root, pipelined in ``chunks`` pieces.
* send_recv: one transfer from rank 0 to rank 1 (a pipeline-parallel stage boundary).
* flows: independent point-to-point flows of ``size`` bytes each, all at once (background
  traffic patterns: permutation, incast, stride; see :func:`flows`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from testbed.errors import ConfigError
from traffic.workloads import budget

OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "send_recv")
ALGORITHMS = {"all_reduce": ("ring", "rhd", "tree"), "reduce_scatter": ("ring",),
              "all_gather": ("ring",), "all_to_all": ("pairwise", "direct"), "broadcast": ("ring",),
              "send_recv": ("direct",)}


#: transfers in one collective's schedule at most (memory and time: a million took 2 s to
#: build; a fabric of 8,192 hosts runs an all-to-all over 512 of them, not all)
MAX_TRANSFERS = 262_144


@dataclass(frozen=True)
class Transfer:
    """``nbytes`` from rank ``src`` to rank ``dst`` in ``step``."""

    step: int
    src: int
    dst: int
    nbytes: int


@dataclass
class Schedule:
    """The transfers of one collective over ``ranks`` ranks (numbered 0..ranks-1)."""

    op: str
    algorithm: str
    ranks: int
    size_bytes: int
    transfers: list[Transfer] = field(default_factory=list)
    group_ranks: int | None = None  # set by merge(): the size of each communicator
    field_path: str = "collective"  # the config path named in errors

    @property
    def communicator_size(self) -> int:
        """Ranks per communicator (NCCL-tests' n): the groups' size for a merged schedule."""
        return self.group_ranks or self.ranks

    def add(self, step: int, src: int, dst: int, nbytes: int) -> None:
        """One transfer more.

        Raises:
            ConfigError: past :data:`MAX_TRANSFERS` (naming the collective, before the
                schedule of a collective too large to emulate fills the memory).
        """
        if nbytes > 0 and src != dst:
            if len(self.transfers) >= MAX_TRANSFERS:
                raise ConfigError(self.field_path, f"{self.op} over {self.ranks} ranks: more "
                                  f"than {MAX_TRANSFERS:,} transfers (an all-to-all over 512 "
                                  "ranks has 261,632); use fewer ranks")
            budget.charge(self.field_path, "transfers")
            self.transfers.append(Transfer(step, src, dst, nbytes))

    @property
    def steps(self) -> int:
        return 1 + max((t.step for t in self.transfers), default=-1)

    def sent_by(self, rank: int) -> int:
        return sum(t.nbytes for t in self.transfers if t.src == rank)

    def received_by(self, rank: int) -> int:
        return sum(t.nbytes for t in self.transfers if t.dst == rank)

    def per_rank(self, rank: int) -> list[tuple[int, str, int, int]]:
        """Rank ``rank``'s program: (step, "send"|"recv", peer, bytes), in step order."""
        out = []
        for t in sorted(self.transfers, key=lambda t: (t.step, t.src, t.dst)):
            if t.src == rank:
                out.append((t.step, "send", t.dst, t.nbytes))
            if t.dst == rank:
                out.append((t.step, "recv", t.src, t.nbytes))
        return out


def chunk_sizes(total: int, parts: int) -> list[int]:
    """``total`` bytes split into ``parts`` near-equal chunks (the first ones one byte larger)."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def build(op: str, ranks: int, size_bytes: int, algorithm: str | None = None,
          chunks: int = 4, field_path: str = "collective") -> Schedule:
    """The schedule of one collective.

    Args:
        op: one of :data:`OPS`.
        ranks: communicator size (>= 2).
        size_bytes: NCCL-tests size (see the module docstring), > 0.
        algorithm: one of ``ALGORITHMS[op]``; default the first.
        chunks: pipeline depth of broadcast.
        field_path: the config path named in errors.

    Returns:
        The schedule.

    Raises:
        ConfigError: for an unknown op or algorithm, fewer than 2 ranks, or a size <= 0.
    """
    if op not in ALGORITHMS:
        raise ConfigError(f"{field_path}.op",
                          f"unknown op {op!r}; expected one of {', '.join(OPS)}")
    algorithm = algorithm or ALGORITHMS[op][0]
    if algorithm not in ALGORITHMS[op]:
        raise ConfigError(f"{field_path}.algorithm", f"{op} has no algorithm {algorithm!r}; "
                          f"expected one of {', '.join(ALGORITHMS[op])}")
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 2:
        raise ConfigError(f"{field_path}.ranks", f"a collective needs at least 2 ranks, got {ranks}")
    if op == "send_recv" and ranks != 2:
        raise ConfigError(f"{field_path}.ranks", f"send_recv is between 2 ranks, got {ranks}")
    if isinstance(size_bytes, bool) or not isinstance(size_bytes, int) or size_bytes <= 0:
        raise ConfigError(f"{field_path}.size_bytes", f"must be a positive integer, got {size_bytes!r}")
    sched = Schedule(op, algorithm, ranks, size_bytes, field_path=field_path)
    BUILDERS[(op, algorithm)](sched, chunks)
    return sched


def _ring_phase(sched: Schedule, chunks: list[int], first_step: int, offset: int) -> int:
    """``n - 1`` ring steps: at step s rank r sends chunk (r - s + offset) mod n to r + 1."""
    n = sched.ranks
    for s in range(n - 1):
        for r in range(n):
            sched.add(first_step + s, r, (r + 1) % n, chunks[(r - s + offset) % n])
    return first_step + n - 1


def _all_reduce_ring(sched: Schedule, _chunks: int) -> None:
    chunks = chunk_sizes(sched.size_bytes, sched.ranks)
    step = _ring_phase(sched, chunks, 0, 0)  # reduce-scatter: rank r ends owning chunk r+1
    _ring_phase(sched, chunks, step, 1)  # all-gather of the reduced chunks


def _ring_only(sched: Schedule, _chunks: int) -> None:
    _ring_phase(sched, chunk_sizes(sched.size_bytes, sched.ranks), 0, 0)


def _all_reduce_rhd(sched: Schedule, _chunks: int) -> None:
    n = sched.ranks
    p2 = 1 << (n.bit_length() - 1)
    extra = n - p2
    step = 0
    if extra:  # fold: rank p2+i hands everything to rank i
        for i in range(extra):
            sched.add(step, p2 + i, i, sched.size_bytes)
        step += 1
    # recursive halving over the p2 ranks: at distance d exchange half of the current block
    block = {r: (0, sched.size_bytes) for r in range(p2)}
    distance = p2 // 2
    history = []
    while distance >= 1:
        for r in range(p2):
            partner = r ^ distance
            lo, size = block[r]
            keep_low = r < partner
            half = size // 2
            send = size - half if keep_low else half
            sched.add(step, r, partner, send)
        for r in range(p2):
            lo, size = block[r]
            half = size // 2
            block[r] = (lo, half) if r < (r ^ distance) else (lo + half, size - half)
        history.append(distance)
        step += 1
        distance //= 2
    for distance in reversed(history):  # recursive doubling: give back what was kept
        for r in range(p2):
            sched.add(step, r, r ^ distance, block[r][1])
        block = {r: (min(block[r][0], block[r ^ distance][0]),
                     block[r][1] + block[r ^ distance][1]) for r in range(p2)}
        step += 1
    if extra:  # unfold: the result goes back to the extra ranks
        for i in range(extra):
            sched.add(step, i, p2 + i, sched.size_bytes)


def _all_reduce_tree(sched: Schedule, _chunks: int) -> None:
    n = sched.ranks
    depth = [0] * n
    for r in range(1, n):
        depth[r] = depth[(r - 1) // 2] + 1
    deepest = max(depth)
    for r in range(1, n):  # reduce: deeper levels first
        sched.add(deepest - depth[r], r, (r - 1) // 2, sched.size_bytes)
    for r in range(1, n):  # broadcast: shallower levels first
        sched.add(deepest + depth[r] - 1, (r - 1) // 2, r, sched.size_bytes)


def _all_to_all(sched: Schedule, _chunks: int, stepped: bool = True) -> None:
    """Shift ``s`` sends to rank ``r + s``: in step ``s - 1`` (pairwise), or all in step 0."""
    n = sched.ranks
    per_peer = chunk_sizes(sched.size_bytes, n)
    for s in range(1, n):
        for r in range(n):
            sched.add(s - 1 if stepped else 0, r, (r + s) % n, per_peer[(r + s) % n])


def _broadcast_ring(sched: Schedule, chunks: int) -> None:
    n = sched.ranks
    pieces = chunk_sizes(sched.size_bytes, max(1, min(chunks, sched.size_bytes)))
    for i in range(n - 1):  # chain position i (rank i, the root is rank 0) forwards to i + 1
        for c, nbytes in enumerate(pieces):
            sched.add(i + c, i, i + 1, nbytes)


def _send_recv(sched: Schedule, _chunks: int) -> None:
    sched.add(0, 0, 1, sched.size_bytes)


BUILDERS: dict[tuple[str, str], Callable[[Schedule, int], None]] = {
    ("all_reduce", "ring"): _all_reduce_ring,
    ("all_reduce", "rhd"): _all_reduce_rhd,
    ("all_reduce", "tree"): _all_reduce_tree,
    ("reduce_scatter", "ring"): _ring_only,
    ("all_gather", "ring"): _ring_only,
    ("all_to_all", "pairwise"): _all_to_all,
    ("all_to_all", "direct"): lambda sched, chunks: _all_to_all(sched, chunks, stepped=False),
    ("broadcast", "ring"): _broadcast_ring,
    ("send_recv", "direct"): _send_recv,
}


def flows(pairs: list[tuple[int, int]], ranks: int, size_bytes: int,
          field_path: str = "flows") -> Schedule:
    """A schedule of concurrent flows, ``size_bytes`` each, between rank pairs (one step).

    Raises:
        ConfigError: for a size <= 0 or no pairs.
    """
    if isinstance(size_bytes, bool) or not isinstance(size_bytes, int) or size_bytes <= 0:
        raise ConfigError(f"{field_path}.size_bytes",
                          f"must be a positive integer, got {size_bytes!r}")
    if not pairs:
        raise ConfigError(field_path, "the pattern gives no flows on this fabric")
    sched = Schedule("flows", "direct", ranks, size_bytes, field_path=field_path)
    for src, dst in pairs:
        sched.add(0, src, dst, size_bytes)
    return sched


def merge(parts: list[tuple[Schedule, list[int]]], ranks: int) -> Schedule:
    """Several communicators running the same collective at once (e.g. every tensor-parallel
    group's all-reduce), as one schedule over ``ranks`` global ranks.

    Args:
        parts: (schedule of one communicator, the global rank of each of its ranks).
        ranks: the global rank count.
    """
    first = parts[0][0]  # uneven parts (all_to_allv): the largest's size
    merged = Schedule(first.op, first.algorithm, ranks, max(s.size_bytes for s, _m in parts),
                      group_ranks=first.ranks)
    for sched, members in parts:
        for t in sched.transfers:
            merged.add(t.step, members[t.src], members[t.dst], t.nbytes)
    return merged
