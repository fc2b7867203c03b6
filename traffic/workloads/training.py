"""Pure training-iteration generator: the collectives one iteration of a parallel training job
issues, from its model and parallelism (Megatron-style), with the compute between them.

Ranks are ``tp * pp * dp`` hosts, tensor-parallel fastest: global rank
``t + tp * (d + dp * p)`` for tensor rank t, data-parallel rank d, pipeline stage p. Per
iteration, for each micro-batch, forward through the stages then backward through them:

* tensor parallelism: 2 all-reduces of the activations (``seq * micro_batch * hidden *
  dtype`` bytes) per layer of the stage, forward and backward, in every TP group at once;
* expert parallelism (``ep > 1``, ``moe_every`` > 0): per MoE layer a dispatch and a combine
  all-to-all, forward and backward, within groups of ``ep`` data-parallel ranks; uneven
  (``all_to_allv``): each rank's ``seq_len * micro_batch`` tokens go to ``top_k`` of
  ``experts`` experts drawn under a Zipf skew ``moe_skew`` (:mod:`traffic.workloads.moe`;
  the combine is the dispatch transposed; backward, the same two in reverse), a fresh
  seeded routing per layer, micro-batch and group;
* pipeline parallelism: a send/recv of the activations between consecutive stages;
* then the data-parallel gradient all-reduce of ``params / (tp * pp) * grad_dtype`` bytes in
  every DP group at once.

Each phase is one merged schedule (all groups at once) preceded by its compute gap, and carries
the number of the iteration it belongs to.
"""

from __future__ import annotations

import functools
import hashlib
import math
import random
import dataclasses
from dataclasses import dataclass, fields

from testbed.errors import ConfigError
from traffic.workloads import budget, moe
from traffic.workloads.schedules import Schedule, build, merge

FIELD = "workload.training"


#: the most of each count a training job may ask for (checked before anything is expanded)
MOST = {"iterations": 1_000, "layers": 1_024, "micro_batches": 1_024, "experts": 4_096,
        "seq_len": 1 << 20, "micro_batch": 1_024, "hidden": 1 << 20, "params": 10 ** 13,
        "tp": 8_192, "pp": 8_192, "dp": 8_192, "ep": 8_192, "top_k": 4_096,
        "dtype_bytes": 16, "grad_dtype_bytes": 16, "moe_every": 1_024}


def whole_counts(fields: dict) -> dict:
    """``fields`` with the counts that YAML gave as whole floats (``2.0``: the schema's
    integers allow them) as ints.

    Raises:
        ConfigError: a count that is not a whole number.
    """
    counts = {f.name for f in dataclasses.fields(TrainingSpec) if f.type in ("int", int)}
    out = dict(fields)
    for key in counts & set(fields):
        value = fields[key]
        if isinstance(value, float):
            if not value.is_integer():
                raise ConfigError(f"{FIELD}.{key}", f"a whole number, got {value}")
            out[key] = int(value)
    return out


@dataclass(frozen=True)
class TrainingSpec:
    """A training job's shape (the experiment file's ``workload.training``, minus ``ranks``).

    Types and ranges are checked by the experiment schema; :meth:`check` adds the rules that
    relate fields to each other.
    """

    layers: int = 4
    hidden: int = 1024
    seq_len: int = 512
    micro_batch: int = 1
    micro_batches: int = 2
    dtype_bytes: int = 2
    grad_dtype_bytes: int = 4
    params: int = 50_000_000
    tp: int = 2
    pp: int = 1
    dp: int = 2
    ep: int = 1
    moe_every: int = 0
    top_k: int = 2
    experts: int = 0  # experts per MoE layer (0: one per expert-parallel rank)
    moe_skew: float = 0.0  # Zipf exponent of the experts' popularity (0: uniform)
    moe_seed: int = 1
    compute_jitter: float = 0.0  # sigma of each rank's log-normal compute factor per phase
    stragglers: tuple[tuple[int, float], ...] = ()  # (rank, slowdown)
    jitter_seed: int = 1
    overlap: bool = False  # DDP: gradient buckets all-reduced beside the backward pass
    bucket_mb: float = 25.0  # DDP's default bucket (MB of gradients)
    bucket_order: str = "reverse"  # reverse (DDP: the last layers' first) or forward
    size_scale: float = 1.0  # every byte the iteration moves, times this
    compute_ms: float = 10.0
    iterations: int = 1

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    def scaled(self, nbytes: float) -> int:
        """Bytes times ``size_scale``, at least 1.

        Raises:
            ConfigError: (``size_scale``) a product past any size (no float holds it)."""
        try:
            return max(1, round(nbytes * self.size_scale))
        except (OverflowError, ValueError):
            raise ConfigError(f"{FIELD}.size_scale", f"scales {nbytes:.3g} bytes past any "
                                                     "size") from None

    @property
    def expert_count(self) -> int:
        return self.experts or self.ep

    def check(self) -> TrainingSpec:
        """Cross-field rules; returns self.

        Raises:
            ConfigError: naming the field (``workload.training.pp``).
        """
        self._check_bounds()
        if self.layers % self.pp:
            raise ConfigError(f"{FIELD}.pp", f"{self.layers} layers do not split into "
                                             f"{self.pp} stages")
        if self.dp % self.ep:
            raise ConfigError(f"{FIELD}.ep", f"ep {self.ep} must divide dp {self.dp}")
        if self.moe_every and self.ep > 1:
            if self.expert_count % self.ep:
                raise ConfigError(f"{FIELD}.experts", f"{self.expert_count} experts do not "
                                                      f"spread evenly over ep {self.ep} ranks")
            if self.top_k > self.expert_count:
                raise ConfigError(f"{FIELD}.top_k", f"top_k {self.top_k} is more than the "
                                                    f"{self.expert_count} experts")
        if self.world_size < 2:
            raise ConfigError(FIELD, "tp * pp * dp must be at least 2 ranks")
        for i, (rank, slowdown) in enumerate(self.stragglers):
            if not 0 <= rank < self.world_size:
                raise ConfigError(f"{FIELD}.stragglers[{i}].rank",
                                  f"no rank {rank} among tp * pp * dp = {self.world_size}")
        if self.overlap and (self.tp > 1 or self.pp > 1 or (self.ep > 1 and self.moe_every)):
            raise ConfigError(f"{FIELD}.overlap", "gradient buckets overlap a backward pass "
                                                  "without other collectives (tp 1, pp 1, no "
                                                  "MoE layers): a rank runs one collective at "
                                                  "a time")
        return self

    def _check_bounds(self) -> None:
        """Each count within :data:`MOST`."""
        for key, most in MOST.items():
            if getattr(self, key) > most:
                raise ConfigError(f"{FIELD}.{key}", f"at most {most:,}, got "
                                                    f"{getattr(self, key):,}")

    def charge(self) -> None:
        """Charge the file's planning budget (:mod:`traffic.workloads.budget`) with the MoE
        layers' expert draws, before they are drawn (each schedule's transfers are charged
        as they are made)."""
        pp = max(1, self.pp)
        moe_layers = self.layers // pp // self.moe_every if self.moe_every and self.ep > 1 \
            else 0
        routings = (self.iterations * self.micro_batches * pp * moe_layers
                    * self.tp * max(1, self.dp // max(1, self.ep)))
        draws = routings * self.ep * self.seq_len * self.micro_batch * self.expert_count
        budget.charge(f"{FIELD}.experts", "draws", draws,
                      f"routing {routings:,} MoE layers' tokens to {self.expert_count:,} "
                      "experts")


@dataclass(frozen=True)
class Phase:
    """One communication phase of an iteration. ``gaps``: each global rank's compute before
    it (None: ``gap_s`` on every rank); ``barrier`` False: an overlapped gradient bucket,
    whose gap counts from the last barrier (its release), not from the previous phase."""

    label: str
    schedule: Schedule
    gap_s: float
    iteration: int
    gaps: tuple[float, ...] | None = None
    barrier: bool = True


class _Iteration:
    """Phases in issue order; compute that no phase of its own carries (tensor parallelism
    off: no all-reduce between the layers) waits for the next phase."""

    def __init__(self, c: TrainingSpec) -> None:
        self.c = c
        self.out: list[Phase] = []
        self.pending = 0.0
        self.factors = _rank_factors(c)

    def add(self, op: str, size: int, members: list[list[int]], label: str, gap_s: float,
            it: int) -> None:
        self.pending += gap_s
        if len(members[0]) < 2 or size <= 0:
            return
        parts = [(build(op, len(m), size), m) for m in members]
        self.phase(Phase(label, merge(parts, self.c.world_size), 0.0, it))

    def phase(self, ph: Phase, release_s: float | None = None) -> None:
        """Append ``ph`` with the pending compute before it (or, overlapped, released at
        ``release_s`` after the last barrier), per rank as the stragglers and jitter say."""
        gap = self.pending if release_s is None else release_s
        self.pending = 0.0 if release_s is None or ph.barrier else self.pending
        gaps = None
        if self.factors is not None:
            draw = self.factors(len(self.out))
            gaps = tuple(round(gap * f, 9) for f in draw)
        self.out.append(Phase(ph.label, ph.schedule, gap, ph.iteration, gaps, ph.barrier))


def _rank_factors(c: TrainingSpec):
    """Each rank's compute factor for phase ``n`` (stragglers' slowdown times a seeded
    log-normal jitter of mean 1), or None when every rank computes alike."""
    slow = [1.0] * c.world_size
    for rank, slowdown in c.stragglers:
        slow[rank] = slowdown
    if not c.compute_jitter and all(f == 1.0 for f in slow):
        return None
    sigma = c.compute_jitter

    def factors(n: int) -> list[float]:
        rng = random.Random(c.jitter_seed * 1_000_003 + n)
        return [s * (math.exp(rng.gauss(0.0, sigma) - sigma * sigma / 2) if sigma else 1.0)
                for s in slow]
    return factors


def phases(spec: TrainingSpec) -> list[Phase]:
    """The phases of ``spec.iterations`` iterations."""
    c = spec.check()
    c.charge()
    tp, pp, dp, ep = c.tp, c.pp, c.dp, c.ep
    world = c.world_size
    rank = lambda t, d, p: t + tp * (d + dp * p)  # noqa: E731
    act = c.scaled(c.seq_len * c.micro_batch * c.hidden * c.dtype_bytes)
    layers = c.layers // pp
    gap = c.compute_ms / 1e3
    b = _Iteration(c)
    moe_layers = layers // c.moe_every if c.moe_every else 0
    for it in range(c.iterations):
        for mb in range(c.micro_batches):
            for direction, stages in (("fwd", range(pp)), ("bwd", reversed(range(pp)))):
                for p in stages:
                    tp_groups = [[rank(t, d, p) for t in range(tp)] for d in range(dp)]
                    tag = f"iter {it} mb {mb} {direction} stage {p}"
                    for _ in range(2 * layers):
                        b.add("all_reduce", act, tp_groups, f"{tag} tp all_reduce",
                              gap / (2 * layers), it)
                    ep_groups = [[rank(t, g * ep + e, p) for e in range(ep)]
                                 for t in range(tp) for g in range(dp // ep)]
                    for layer in range(moe_layers if ep > 1 else 0):
                        seed = (c.moe_seed, it, mb, p, layer)
                        for ph in _moe_layer(c, ep_groups, world, f"{tag} ep", it, seed,
                                             direction == "bwd"):
                            b.phase(ph)
                    nxt = p + 1 if direction == "fwd" else p - 1
                    if 0 <= nxt < pp:
                        b.add("send_recv", act, [[rank(t, d, p), rank(t, d, nxt)]
                                                 for t in range(tp) for d in range(dp)],
                              f"{tag} pp send_recv", 0.0, it)
        grad = c.scaled(c.params // (tp * pp) * c.grad_dtype_bytes)
        dp_groups = [[rank(t, d, p) for d in range(dp)] for t in range(tp) for p in range(pp)]
        if c.overlap:
            _buckets(b, c, grad, dp_groups, it)
        else:
            b.add("all_reduce", grad, dp_groups, f"iter {it} dp all_reduce", 0.0, it)
    return b.out


def _buckets(b: _Iteration, c: TrainingSpec, grad: int, dp_groups: list[list[int]],
             it: int) -> None:
    """DDP's gradient buckets: each all-reduced once the backward pass has produced its
    layers' gradients (``bucket_order`` reverse: the last layers' first, as DDP registers
    them), beside the rest of the backward pass. The iteration's compute so far is pending;
    the last micro-batch's backward (``compute_ms``) produces a layer's gradients every
    ``compute_ms / layers``."""
    layers = c.layers
    per_layer = grad / layers
    backward = c.compute_ms / 1e3
    before = b.pending - backward  # the forward passes and the earlier backward passes
    order = list(range(layers))  # backward order: the last layer's gradients come first
    if c.bucket_order == "forward":
        order = list(reversed(order))
    bucket_bytes = c.scaled(c.bucket_mb * 1e6)  # scaled as the gradients are
    buckets: list[list[int]] = [[]]
    for i in order:  # i: the i-th layer the backward reaches
        if buckets[-1] and len(buckets[-1]) * per_layer >= bucket_bytes:
            buckets.append([])
        buckets[-1].append(i)
    ready = 0.0
    for k, members in enumerate(buckets):  # launched in order: none before the one ahead
        ready = max(ready, before + backward * (max(members) + 1) / layers)
        size = max(1, round(per_layer * len(members)))
        parts = [(build("all_reduce", len(m), size), m) for m in dp_groups]
        b.phase(Phase(f"iter {it} dp bucket {k} all_reduce", merge(parts, c.world_size), 0.0,
                      it, barrier=k == 0), release_s=ready)
    b.pending = 0.0


@functools.lru_cache(maxsize=4096)
def _routing(ranks: int, tokens: int, experts: int, top_k: int, token_bytes: int, skew: float,
             draw: int) -> tuple[tuple[int, ...], ...]:
    """A layer's routing, drawn once for its forward and its backward pass."""
    return tuple(tuple(row) for row in moe.token_routing(ranks, tokens, experts, top_k,
                                                         token_bytes, skew, draw, FIELD))


def _moe_layer(c: TrainingSpec, ep_groups: list[list[int]], world: int, tag: str, it: int,
               seed: tuple, backward: bool) -> list[Phase]:
    """One MoE layer's two all_to_allv phases (every expert-parallel group at once, each
    with its own routing): dispatch then combine, or backward their gradients (combine's
    first: the dispatch matrix again, then its transpose)."""
    tokens = c.seq_len * c.micro_batch
    token_bytes = c.scaled(c.hidden * c.dtype_bytes)
    dispatch = []
    for g, members in enumerate(ep_groups):
        draw = int.from_bytes(hashlib.sha256(repr((*seed, g)).encode()).digest()[:8], "big")
        dispatch.append((_routing(len(members), tokens, c.expert_count, c.top_k, token_bytes,
                                  c.moe_skew, draw), members))
    names = ("combine grad", "dispatch grad") if backward else ("dispatch", "combine")
    out = []
    for name, flip in zip(names, (backward, not backward)):
        parts = [(moe.all_to_allv(moe.transpose(m) if flip else [list(r) for r in m]),
                  members)
                 for m, members in dispatch]
        out.append(Phase(f"{tag} {name} all_to_allv", merge(parts, world), 0.0, it))
    return out
