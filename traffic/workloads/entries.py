"""Pure building blocks of a workload: its types (:class:`Collective`, :class:`Job`,
:class:`Workload`), sizes, and each entry's or training section's :class:`Job`
(:mod:`traffic.workloads.workload` parses the section with them, :mod:`traffic.workloads.named`
the named jobs). Errors are :class:`ConfigError` naming the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from testbed.errors import ConfigError, shown
from testbed.model.topology import Topology
from traffic.transports.options import PER_KIND, ROCE_CONGESTION_CONTROLS, TransportOptions
from traffic.workloads import hierarchical, moe
from traffic.workloads.jobs import place_ranks, rank_servers, whole_servers
from traffic.workloads import presets, training
from traffic.workloads.patterns import PATTERNS, pattern_pairs
from traffic.workloads.program import Program
from traffic.workloads.schedules import ALGORITHMS, Schedule, build, flows

UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20,
         "GIB": 2**30}
DEFAULT_CONNECTIONS = 1
DEFAULT_TIMEOUT_S = 600.0



@dataclass(frozen=True)
class Collective:
    """One collective to run: ``hosts[i]`` is rank i."""

    op: str
    hosts: tuple[str, ...]
    schedule: Schedule
    label: str = ""
    gap_s: float = 0.0  # compute time before it starts (after the barrier)
    iteration: int | None = None  # training workloads: the iteration it belongs to
    servers: tuple[int, ...] | None = None  # servers of GPUs: each rank's server
    gaps: tuple[float, ...] | None = None  # each rank's compute before it (None: gap_s)
    barrier: bool = True  # False: an overlapped bucket, released gap after the last barrier

    def moved_bytes(self) -> int:
        """Bytes the collective moves in all (every transfer)."""
        return sum(t.nbytes for t in self.schedule.transfers)

    def scale_out_bytes(self) -> int | None:
        """Bytes the collective moves between servers (None: the hosts are not GPUs)."""
        if self.servers is None:
            return None
        return hierarchical.bytes_between(self.schedule, self.servers)


@dataclass(frozen=True)
class Job:
    """One workload entry: its collectives (repetitions) and settings."""

    index: int
    collectives: tuple[Collective, ...]
    connections: int
    timeout_s: float
    concurrent: bool = False  # starts together with the previous job
    not_before_s: float = 0.0  # replay: earliest start, seconds after the workload began
    congestion_control: str | None = None  # TCP congestion control of its senders (None: the
    # kernel's default)
    dscp: int = 0  # DSCP of its packets (the fabric's traffic class)
    transport: str = "tcp"  # tcp, rocev2 or uet
    spray: bool | None = None  # UDP transports: spread packets over paths (None: default)
    dcqcn: str = "paper"  # rocev2: DCQCN's profile (traffic.transports.rocev2)
    transport_options: TransportOptions = TransportOptions()  # uet's and rocev2's further
    name: str = ""  # workload.jobs: the job's name
    offset_s: float = 0.0  # workload.jobs: its start after the batch's
    alone_of: str = ""  # the named job this one runs alone (its slowdown's baseline)
    seed: int = 1  # the run seed: its agents' source ports derive from it (with its index)


@dataclass(frozen=True)
class Workload:
    """A parsed workload: its jobs in issue order."""

    jobs: tuple[Job, ...]
    connections: int = DEFAULT_CONNECTIONS
    timeout_s: float = DEFAULT_TIMEOUT_S
    baseline: str = ""  # workload.jobs: alone, none, or a run directory
    replay: dict | None = None  # what a trace's or log's replay scaled (replay.scale_entries)
    program: Program | None = None  # the user's program, run after the jobs (workload.program)

    @property
    def collective_count(self) -> int:
        return sum(len(j.collectives) for j in self.jobs)

    def batches(self) -> list[list[Job]]:
        """Consecutive jobs grouped so that each ``concurrent`` job joins the batch before it."""
        return batches(list(self.jobs))


#: the largest collective size (a real job's largest are tens of GB; at emulated rates one
#: terabyte already takes days)
MAX_SIZE = 1 << 40


def parse_size(value: object, path: str) -> int:
    """Bytes from an integer or a string such as ``16MiB``, at most :data:`MAX_SIZE`."""
    quoted = shown(value, 40)
    if isinstance(value, bool):
        raise ConfigError(path, f"must be a size in bytes, got {quoted}")
    if isinstance(value, int):
        size = value
    elif isinstance(value, str):
        match = re.fullmatch(r"\s*(\d{1,20}(?:\.\d{1,20})?)\s*([A-Za-z]*)\s*", value)
        if not match or match[2].upper() not in UNITS:
            raise ConfigError(path, f"cannot read size {quoted}; use e.g. 4096, 64KiB, 16MiB, "
                                    "1GiB")
        size = int(float(match[1]) * UNITS[match[2].upper()])
    else:
        raise ConfigError(path, f"must be a size in bytes, got {quoted}")
    if size <= 0:
        raise ConfigError(path, f"must be > 0, got {quoted}")
    if size > MAX_SIZE:
        raise ConfigError(path, f"{quoted} is more than the {MAX_SIZE >> 40} TiB a collective "
                                "may move")
    return size


def batches(jobs: list[Job]) -> list[list[Job]]:
    """Consecutive jobs grouped so that each ``concurrent`` job joins the batch before it."""
    out: list[list[Job]] = []
    for job in jobs:
        if job.concurrent and out:
            out[-1].append(job)
        else:
            out.append([job])
    return out


def replay_algorithm(entries: list[tuple[dict, str]], algorithm: str | None,
                      replay: dict | None) -> list[tuple[dict, str]]:
    """``replay.algorithm``: the algorithm of every replayed collective that has it (a log
    does not say which NCCL chose)."""
    if not algorithm:
        return entries
    ops = {op for op, algos in ALGORITHMS.items() if algorithm in algos}
    ops |= {op for op, algo in hierarchical.BUILDERS if algo == algorithm}
    if not ops:
        raise ConfigError("workload.replay.algorithm", f"no collective has an algorithm "
                                                       f"{algorithm!r}")
    if replay is not None:
        replay["algorithm"] = algorithm
    return [({**e, "algorithm": algorithm} if e.get("op") in ops else e, where)
            for e, where in entries]


def json_value(text: str, field: str) -> object:
    try:
        return json.loads(text)
    except ValueError as err:
        raise ConfigError(field, f"not JSON: {err}") from None


def entry_job(topo: Topology, index: int, entry: dict, path: str, connections: int,
               timeout_s: float, read_json: Callable[[str, str], object]) -> Job:
    if entry.get("op") == "all_to_allv":
        if "size" in entry:
            raise ConfigError(f"{path}.size", "all_to_allv takes its sizes from moe or matrix, "
                                              "not size")
        ranks = place_ranks(topo, entry.get("ranks", len(topo.rank_hosts())), f"{path}.ranks")
        sched = moe.all_to_allv(moe.entry_matrix(entry, len(ranks), path, read_json), path)
    elif entry.get("op") == "flows":
        size = parse_size(entry.get("size"), f"{path}.size")
        ranks, sched = _pattern_flows(topo, entry, size, path)
    else:
        size = parse_size(entry.get("size"), f"{path}.size")
        ranks = place_ranks(topo, entry.get("ranks", len(topo.rank_hosts())), f"{path}.ranks")
        key = (entry.get("op"), entry.get("algorithm"))
        if key in hierarchical.BUILDERS:
            servers, gpus = whole_servers(topo, ranks, f"{path}.ranks", key[1])
            sched = hierarchical.BUILDERS[key](servers, gpus, size)
        else:
            sched = build(entry.get("op"), len(ranks), size, entry.get("algorithm"),
                          field_path=path)
    coll = Collective(sched.op, ranks, sched, entry.get("label", ""),
                      float(entry.get("gap_s", 0.0)), servers=rank_servers(topo, ranks))
    concurrent = bool(entry.get("concurrent", False))
    if concurrent and index == 0:
        raise ConfigError(f"{path}.concurrent", "the first entry has no previous one to "
                                                "run with")
    return Job(index, (coll,) * entry.get("repetitions", 1), connections, timeout_s,
               concurrent, float(entry.get("t_s", 0)), **job_settings(entry, path))


def job_settings(entry: dict, path: str) -> dict:
    """A workload entry's (or the workload's defaults') transport settings as :class:`Job`
    takes them: ``transport`` a kind (``uet``) or an object (``{kind: uet, rccc: true}``), and
    ``spray``, ``dcqcn`` beside it or in it."""
    value = entry.get("transport", "tcp")
    spray, dcqcn, options = entry.get("spray"), entry.get("dcqcn", "paper"), {}
    kind = value
    if isinstance(value, dict):
        kind = value.get("kind", "tcp")
        spray, dcqcn = value.get("spray", spray), value.get("dcqcn", dcqcn)
        for key, v in value.items():
            allowed = PER_KIND.get(kind, ())
            if key in ("kind", "spray") or key == "dcqcn" and kind == "rocev2":
                continue
            if key not in allowed:
                raise ConfigError(f"{path}.transport.{key}",
                                  f"{key} is not a setting of {kind} (its settings: "
                                  f"{', '.join(('kind', 'spray', *allowed)) if kind != 'tcp' else 'kind'})")
            options[key] = v
    cc = entry.get("congestion_control")
    if cc in ROCE_CONGESTION_CONTROLS:  # rocev2's, named as TCP's are
        if kind != "rocev2":
            raise ConfigError(f"{path}.congestion_control",
                              f"{cc} is a congestion control of rocev2, not of {kind}")
        options.setdefault("congestion_control", cc)
        cc = None
    try:
        opts = TransportOptions(**options)
    except ValueError as err:
        raise ConfigError(f"{path}.transport", str(err)) from None
    return {"congestion_control": cc, "dscp": entry.get("dscp", 0),
            "transport": kind, "spray": spray, "dcqcn": dcqcn, "transport_options": opts}


def training_spec(raw: dict) -> training.TrainingSpec:
    """The typed training settings of a ``workload.training`` section (schema-checked; a
    ``preset``'s model fields under the section's own)."""
    fields = {k: v for k, v in presets.resolve(raw).items() if k != "ranks"}
    fields["stragglers"] = tuple((s["rank"], float(s["slowdown"]))
                                 for s in fields.get("stragglers", ()))
    return training.TrainingSpec(**training.whole_counts(fields)).check()


def training_job(topo: Topology, raw: dict, index: int, connections: int,
                  timeout_s: float, defaults: dict, field: str = "workload.training") -> Job:
    """One job running every phase of the training iterations on one set of rank hosts."""
    spec = training_spec(raw)
    world = spec.world_size
    ranks = place_ranks(topo, raw.get("ranks", world), f"{field}.ranks")
    if len(ranks) != world:
        raise ConfigError(f"{field}.ranks", f"tp * pp * dp = {world} ranks, but "
                                            f"{len(ranks)} hosts were given")
    if topo.servers:  # rank order is NCCL's: tensor-parallel groups fill servers first
        gpus = len(topo.servers[0].gpus)
        if gpus % spec.tp:  # expert parallelism may span servers (one rail each, tp = gpus)
            raise ConfigError(f"{field}.tp", f"tp = {spec.tp} does not divide the {gpus} GPUs "
                                             "of a server: its groups would straddle servers "
                                             "(tensor parallelism stays inside the scale-up "
                                             "domain)")
    servers = rank_servers(topo, ranks)
    colls = tuple(Collective(ph.schedule.op, ranks, ph.schedule, ph.label, ph.gap_s,
                             ph.iteration, servers, ph.gaps, ph.barrier)
                  for ph in training.phases(spec))
    return Job(index, colls, connections, timeout_s, **job_settings(defaults, "workload"))


def _pattern_flows(topo: Topology, entry: dict, size: int,
                   path: str) -> tuple[tuple[str, ...], Schedule]:
    """Background traffic: the flows of a named pattern (or explicit pairs), ``size`` bytes
    each, all at once."""
    if "pairs" in entry:
        if "pattern" in entry:
            raise ConfigError(f"{path}.pairs", "give a pattern or pairs, not both")
        pairs = [tuple(p) for p in entry["pairs"]]
        for i, pair in enumerate(pairs):
            for j, host in enumerate(pair):
                if host not in topo.nodes or topo.nodes[host].is_switch:
                    raise ConfigError(f"{path}.pairs[{i}][{j}]", f"no host {host!r} in this "
                                                                 "fabric")
            if pair[0] == pair[1]:
                raise ConfigError(f"{path}.pairs[{i}]", "a host cannot send to itself")
    elif "pattern" not in entry:
        raise ConfigError(f"{path}.pattern", f"op flows needs a pattern ({', '.join(PATTERNS)}) "
                                             "or pairs")
    else:
        pairs = pattern_pairs(topo, entry["pattern"], seed=entry.get("seed", 1),
                              stride=entry.get("stride", 1), field=f"{path}.pattern",
                              fan_in=entry.get("fan_in"))
    hosts = tuple(dict.fromkeys(h for pair in pairs for h in pair))
    index = {h: i for i, h in enumerate(hosts)}
    return hosts, flows([(index[s], index[d]) for s, d in pairs], len(hosts), size, path)
