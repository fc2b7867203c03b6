"""Pure parsing of ``workload.jobs``: several named jobs on one fabric, each one workload on
hosts of its own, run together (each from its ``start_s``) and then each alone.

```yaml
workload:
  jobs:
    - {name: train, training: {preset: llama3-8b, size_scale: 0.01}, ranks: {count: 8}}
    - name: infer                      # several collectives, one after another
      collectives:
        - {op: all_gather, size: 4MiB, repetitions: 2}
        - {op: all_to_all, size: 1MiB, ranks: 4, gap_s: 0.05}
      ranks: {count: 8, placement: spread}
    - {name: replay, trace: other.jsonl, ranks: {count: 4, placement: random, seed: 3}}
    - {name: logged, nccl_log: rank0.log, start_s: 2}
```

A job is one :class:`~traffic.workloads.workload.Job`: its collectives run in order on its
hosts, an entry of fewer ranks on the first of them. Inside a job the entries follow each
other, so a trace's ``t_s`` and ``concurrent`` (which order separate jobs) are refused, and
the transport settings are the job's (``dscp``, ``transport``, ``congestion_control``).
``workload.replay`` scales the traces and logs of named jobs as it scales a workload's.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

from testbed.errors import ConfigError
from testbed.model.topology import Topology
from traffic.workloads import jobs
from traffic.workloads.nccl_log import import_log
from traffic.workloads.replay import EntryCheck, nccl_entries, parse_trace, scale_entries
from traffic.workloads.schedules import merge
from traffic.workloads.entries import (Collective, Job, Workload, entry_job, job_settings,
                                       json_value, parse_size, rank_servers, replay_algorithm,
                                       training_job, training_spec)

#: a workload file's text: (the experiment's folder, the file, the field naming it)
Reader = Callable[[str, str, str], str]

#: what a named job runs: exactly one of these
KINDS = ("training", "collective", "collectives", "trace", "nccl_log")
#: transport settings a named job sets for all its entries (an entry's own would be ignored)
JOB_SETTINGS = ("dscp", "transport", "congestion_control", "spray", "dcqcn")


def named_jobs(topo: Topology, raw: dict, base_dir: str, connections: int, timeout_s: float,
               defaults: dict, read: Reader, check_entry: EntryCheck | None = None,
               real_rate_gbps: float | None = None) -> Workload:
    """``workload.jobs``: each named job on its own hosts, all at once (each at its
    ``start_s``), then (baseline ``alone``) each alone; ``read`` reads a trace or a log (the
    workload's reader, with its size cap)."""
    for key in ("collectives", "training", "trace", "nccl_log", "chakra"):
        if key in raw:
            raise ConfigError(f"workload.{key}", "give jobs, or collectives, training, trace "
                                                 "and nccl_log: not both")
    baseline = raw.get("baseline", "alone")
    if baseline not in jobs.BASELINES:  # a run directory, relative to the experiment's
        baseline = os.path.join(base_dir, baseline)
        if not os.path.isfile(os.path.join(baseline, "results.json")):
            raise ConfigError("workload.baseline", f"{raw['baseline']!r} is neither alone, "
                                                   "none, nor a run directory (no "
                                                   "results.json in it)")
    out: list[Job] = []
    taken: set[str] = set()
    replays: list[dict] = []
    for i, spec in enumerate(raw["jobs"]):
        path = f"workload.jobs[{i}]"
        kinds = [k for k in KINDS if k in spec]
        if len(kinds) != 1:
            raise ConfigError(path, f"a job is one workload: {', '.join(KINDS[:-1])} or "
                                    f"{KINDS[-1]}")
        settings = {**defaults, **{k: spec[k] for k in ("dscp", "transport",
                                                        "congestion_control") if k in spec}}
        ctx = _Context(topo, base_dir, connections, timeout_s, check_entry, real_rate_gbps,
                       raw.get("replay"), replays, read)
        job = _named_job(ctx, spec, kinds[0], path, len(out), taken,
                         job_settings(settings, path), settings)
        taken |= set(job.collectives[0].hosts)
        out.append(dataclasses.replace(job, name=spec["name"], concurrent=i > 0,
                                       offset_s=float(spec.get("start_s", 0.0))))
    names = [j.name for j in out]
    if len(set(names)) != len(names):
        raise ConfigError("workload.jobs", f"job names repeat: {', '.join(names)}")
    if baseline == "alone":
        out += [dataclasses.replace(j, index=len(out) + k, concurrent=False, offset_s=0.0,
                                    alone_of=j.name) for k, j in enumerate(list(out))]
    return Workload(tuple(out), connections, timeout_s, baseline, _replay_report(replays))


@dataclasses.dataclass
class _Context:
    topo: Topology
    base_dir: str
    connections: int
    timeout_s: float
    check_entry: EntryCheck | None
    real_rate_gbps: float | None
    replay: dict | None
    replays: list[dict]  # what each scaled trace or log reported
    read: Reader


def _named_job(ctx: _Context, spec: dict, kind: str, path: str, index: int, taken: set[str],
               typed: dict, settings: dict) -> Job:
    """One named job of ``workload.jobs`` on the hosts its placement gives."""
    topo = ctx.topo
    if kind == "training":
        world = training_spec(spec["training"]).world_size
        hosts = jobs.job_hosts(topo, spec.get("ranks"), world, taken, f"{path}.ranks")
        if len(hosts) != world:
            raise ConfigError(f"{path}.ranks", f"tp * pp * dp = {world} ranks, but "
                                               f"{len(hosts)} hosts were given")
        return training_job(topo, {**spec["training"], "ranks": list(hosts)}, index,
                             ctx.connections, ctx.timeout_s, settings, f"{path}.training")
    if kind == "collective":  # one entry (repetitions): its ranks may place the job
        entry = spec["collective"]
        need = entry.get("ranks", 2) if isinstance(entry.get("ranks", 2), int) else 2
        hosts = jobs.job_hosts(topo, spec.get("ranks", entry.get("ranks")), need, taken,
                               f"{path}.ranks")
        return entry_job(topo, index, {**settings, **entry, "ranks": list(hosts)},
                          f"{path}.collective", ctx.connections, ctx.timeout_s,
                          _reader(ctx))
    entries = _entries(ctx, spec, kind, path)
    counts = [_rank_count(entry, where) for entry, where in entries]
    need = max((n for n in counts if n is not None), default=None)
    if need is None and spec.get("ranks") is None:
        raise ConfigError(f"{path}.ranks", "give the job's ranks (its entries name no count)")
    hosts = jobs.job_hosts(topo, spec.get("ranks"), need or 0, taken, f"{path}.ranks")
    colls: list[Collective] = []
    for (entry, where), n in zip(entries, counts):
        n = len(hosts) if n is None else n
        if n > len(hosts):
            raise ConfigError(f"{where}.ranks", f"a collective of {n} ranks in a job of "
                                                f"{len(hosts)}")
        one = entry_job(topo, index, {**settings, **entry, "ranks": list(hosts[:n])}, where,
                         ctx.connections, ctx.timeout_s, _reader(ctx))
        colls += [_widen(topo, c, hosts) for c in one.collectives]
    return Job(index, tuple(colls), ctx.connections, ctx.timeout_s, **typed)


def _entries(ctx: _Context, spec: dict, kind: str, path: str) -> list[tuple[dict, str]]:
    """A job's entries in order, each with its field path; a trace's or log's scaled by
    ``workload.replay``."""
    if kind == "collectives":
        entries = [(e, f"{path}.collectives[{k}]") for k, e in enumerate(spec["collectives"])]
        if not entries:
            raise ConfigError(f"{path}.collectives", "the job lists no collectives")
    elif kind == "trace":
        entries = parse_trace(ctx.read(ctx.base_dir, spec["trace"], f"{path}.trace"),
                              f"{path}.trace {spec['trace']}", ctx.check_entry)
    else:
        entries = nccl_entries(import_log(ctx.read(ctx.base_dir, spec["nccl_log"],
                                                   f"{path}.nccl_log")))
    for entry, where in entries:
        for key in ("t_s", "concurrent"):
            if key in entry:
                raise ConfigError(f"{where}.{key}", f"{key} orders separate jobs; a named "
                                                    "job's collectives run one after another "
                                                    "(gap_s: compute before one)")
        for key in JOB_SETTINGS:
            if key in entry:
                raise ConfigError(f"{where}.{key}", f"{key} is the job's: set it on "
                                                    f"{path}")
    if kind != "collectives":
        host_rate = min((lk.rate_mbps for lk in ctx.topo.links if lk.tier == "host"),
                        default=1.0)
        entries, report = scale_entries(entries, ctx.replay, host_rate, ctx.real_rate_gbps,
                                        parse_size)
        entries = replay_algorithm(entries, (ctx.replay or {}).get("algorithm"), report)
        if report is not None:
            ctx.replays.append(report)
    return entries


def _rank_count(entry: dict, where: str) -> int | None:
    """An entry's rank count inside its job (None: all the job's ranks)."""
    ranks = entry.get("ranks")
    if ranks is None or isinstance(ranks, int) and not isinstance(ranks, bool):
        return ranks
    raise ConfigError(f"{where}.ranks", "inside a named job an entry gives a rank count (the "
                                        "first N of the job's hosts); the job's ranks place "
                                        "them")


def _widen(topo: Topology, coll: Collective, hosts: tuple[str, ...]) -> Collective:
    """A collective of the job's first ranks over all of them (the others idle in it)."""
    n = len(coll.hosts)
    if n == len(hosts):
        return coll
    sched = merge([(coll.schedule, list(range(n)))], len(hosts))
    return dataclasses.replace(coll, hosts=tuple(hosts), schedule=sched,
                               servers=rank_servers(topo, hosts))


def _reader(ctx: _Context) -> Callable[[str, str], object]:
    """A JSON file's value (a matrix), read relative to the experiment's folder."""
    return lambda name, field: json_value(ctx.read(ctx.base_dir, name, field), field)


def _replay_report(reports: list[dict]) -> dict | None:
    """What the named jobs' replays scaled, summed over their traces and logs."""
    if not reports:
        return None
    first = reports[0]
    return {**first, "entries": sum(r["entries"] for r in reports),
            "bytes_as_logged": sum(r["bytes_as_logged"] for r in reports),
            "bytes_replayed": sum(r["bytes_replayed"] for r in reports)}
