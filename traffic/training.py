"""Pure training-iteration generator: the collectives one iteration of a parallel training job
issues, from its model and parallelism (Megatron-style), with the compute between them.

Ranks are ``tp * pp * dp`` hosts, tensor-parallel fastest: global rank
``t + tp * (d + dp * p)`` for tensor rank t, data-parallel rank d, pipeline stage p. Per
iteration, for each micro-batch, forward through the stages then backward through them:

* tensor parallelism: 2 all-reduces of the activations (``seq * micro_batch * hidden *
  dtype`` bytes) per layer of the stage, forward and backward, in every TP group at once;
* expert parallelism (``ep > 1``, ``moe_every`` > 0): 2 all-to-alls of ``top_k`` times the
  activations per MoE layer, forward and backward, within groups of ``ep`` data-parallel ranks;
* pipeline parallelism: a send/recv of the activations between consecutive stages;
* then the data-parallel gradient all-reduce of ``params / (tp * pp) * grad_dtype`` bytes in
  every DP group at once.

Each phase is one merged schedule (all groups at once) preceded by its compute gap.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.errors import ConfigError
from traffic.schedules import Schedule, build, merge

KEYS = {"layers": 4, "hidden": 1024, "seq_len": 512, "micro_batch": 1, "micro_batches": 2,
        "dtype_bytes": 2, "grad_dtype_bytes": 4, "params": 50_000_000, "tp": 2, "pp": 1,
        "dp": 2, "ep": 1, "moe_every": 0, "top_k": 2, "compute_ms": 10.0, "iterations": 1}


@dataclass(frozen=True)
class Phase:
    """One communication phase of an iteration."""

    label: str
    schedule: Schedule
    gap_s: float


def _settings(raw: dict) -> dict:
    unknown = sorted(set(raw) - set(KEYS) - {"ranks"})
    if unknown:
        raise ConfigError(f"workload.training.{unknown[0]}",
                          f"unknown key (allowed: {', '.join(sorted(KEYS))}, ranks)")
    cfg = {**KEYS, **raw}
    for key, default in KEYS.items():
        value = cfg[key]
        kind = float if isinstance(default, float) else int
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (
                kind is int and int(value) != value):
            raise ConfigError(f"workload.training.{key}", f"must be a number >= 0, got {value!r}")
        cfg[key] = kind(value)
    for key in ("layers", "hidden", "seq_len", "micro_batch", "micro_batches", "dtype_bytes",
                "tp", "pp", "dp", "ep", "iterations", "params", "grad_dtype_bytes"):
        if cfg[key] < 1:
            raise ConfigError(f"workload.training.{key}", f"must be >= 1, got {cfg[key]}")
    if cfg["layers"] % cfg["pp"]:
        raise ConfigError("workload.training.pp",
                          f"{cfg['layers']} layers do not split into {cfg['pp']} stages")
    if cfg["dp"] % cfg["ep"]:
        raise ConfigError("workload.training.ep", f"ep {cfg['ep']} must divide dp {cfg['dp']}")
    return cfg


def world_size(raw: dict) -> int:
    cfg = _settings(raw)
    return cfg["tp"] * cfg["pp"] * cfg["dp"]


def phases(raw: dict) -> list[Phase]:
    """The phases of ``iterations`` iterations (ConfigError naming the field when wrong)."""
    c = _settings(raw)
    tp, pp, dp, ep = c["tp"], c["pp"], c["dp"], c["ep"]
    world = tp * pp * dp
    if world < 2:
        raise ConfigError("workload.training", "tp * pp * dp must be at least 2 ranks")
    rank = lambda t, d, p: t + tp * (d + dp * p)
    act = c["seq_len"] * c["micro_batch"] * c["hidden"] * c["dtype_bytes"]
    layers = c["layers"] // pp
    gap = c["compute_ms"] / 1e3
    out: list[Phase] = []

    def groups(op: str, size: int, members: list[list[int]], label: str, gap_s: float) -> None:
        if len(members[0]) < 2 or size <= 0:
            return
        parts = [(build(op, len(m), size), m) for m in members]
        out.append(Phase(label, merge(parts, world), gap_s))

    moe_layers = layers // c["moe_every"] if c["moe_every"] else 0
    for it in range(c["iterations"]):
        for mb in range(c["micro_batches"]):
            for direction, stages in (("fwd", range(pp)), ("bwd", reversed(range(pp)))):
                for p in stages:
                    tp_groups = [[rank(t, d, p) for t in range(tp)] for d in range(dp)]
                    tag = f"iter {it} mb {mb} {direction} stage {p}"
                    for _ in range(2 * layers):
                        groups("all_reduce", act, tp_groups, f"{tag} tp all_reduce",
                               gap / (2 * layers))
                    ep_groups = [[rank(t, g * ep + e, p) for e in range(ep)]
                                 for t in range(tp) for g in range(dp // ep)]
                    for _ in range(2 * moe_layers):
                        groups("all_to_all", act * c["top_k"], ep_groups,
                               f"{tag} ep all_to_all", 0.0)
                    nxt = p + 1 if direction == "fwd" else p - 1
                    if 0 <= nxt < pp:
                        groups("send_recv", act,
                               [[rank(t, d, p), rank(t, d, nxt)] for t in range(tp)
                                for d in range(dp)], f"{tag} pp send_recv", 0.0)
        grad = c["params"] // (tp * pp) * c["grad_dtype_bytes"]
        dp_groups = [[rank(t, d, p) for d in range(dp)] for t in range(tp) for p in range(pp)]
        groups("all_reduce", grad, dp_groups, f"iter {it} dp all_reduce", 0.0)
    return out
