"""Pure workload parsing: the experiment file's ``workload`` section -> a typed :class:`Workload`.

```yaml
workload:
  connections: 2          # connections per peer (NCCL channels); default 1 (a
                          # multi-plane fabric: one per plane, a multiple of the planes)
  timeout_s: 600          # hard limit per job
  collectives:
    - op: all_reduce      # all_reduce, reduce_scatter, all_gather, all_to_all, broadcast, send_recv
      algorithm: ring     # optional; see traffic.workloads.schedules
      size: 16MiB         # bytes as an integer, or with a unit: KiB MiB GiB KB MB GB
      ranks: 8            # the first N hosts; or a list of host names;
                          # or {count: 8, placement: contiguous | strided | random, seed: 1}
      repetitions: 3
    - op: all_to_all      # concurrent: true starts this entry together with the previous one
      size: 4MiB          # (several jobs at once, each with its own ranks, which may share hosts)
      ranks: {count: 8, placement: random, seed: 2}
      concurrent: true
    - op: flows           # background traffic through the same engine: a pattern's flows,
      pattern: permutation  # size bytes each, all at once (same_edge, same_pod, cross_pod,
      size: 8MiB          # permutation, stride, incast; with seed, stride, fan_in)
      concurrent: true
  trace: job.jsonl        # replayed after the collectives (one entry per line, plus t_s)
  nccl_log: rank0.log     # an NCCL_DEBUG=INFO log's collectives, replayed after those
  training: {tp: 2, pp: 2, dp: 2, layers: 4}   # one job: a training iteration's phases
```

The section's shape (keys and types) is checked by the experiment schema before this module
sees it; here each entry becomes one :class:`Job` (its repetitions back to back on the same
ranks) and consecutive entries marked ``concurrent`` form one batch that runs at once. All
errors are :class:`ConfigError` naming the field, raised before anything is built. The
experiment is parsed once: trace and NCCL log files are read here and never again.
"""

from __future__ import annotations

import dataclasses
import os
import stat

from testbed.errors import ConfigError
from testbed.model.topology import Topology
from traffic.workloads import chakra
from traffic.workloads.entries import (DEFAULT_CONNECTIONS, DEFAULT_TIMEOUT_S, MAX_SIZE, UNITS,
                                       Collective, Job, Workload, batches, entry_job,
                                       job_settings, json_value, parse_size, replay_algorithm,
                                       training_job, training_spec)
from traffic.workloads.jobs import place_ranks
from traffic.workloads.named import named_jobs
from traffic.workloads.nccl_log import import_log
from traffic.workloads.program import parse_program
from traffic.workloads.replay import EntryCheck, nccl_entries, parse_trace, scale_entries

#: what other modules take from here (the workload's types and parsers)
__all__ = ["DEFAULT_CONNECTIONS", "DEFAULT_TIMEOUT_S", "MAX_INPUT_BYTES", "MAX_SIZE", "UNITS",
           "Collective", "Job", "Workload", "batches", "job_settings", "parse_size",
           "parse_workload", "place_ranks", "training_spec"]


def parse_workload(topo: Topology, raw: dict, base_dir: str = ".",
                   check_entry: EntryCheck | None = None,
                   real_rate_gbps: float | None = None) -> Workload:
    """The typed workload of a ``workload`` section (already schema-checked for shape).

    Args:
        topo: the fabric the ranks are placed on.
        raw: the section.
        base_dir: ``trace`` and ``nccl_log`` paths are relative to it (the experiment's folder).
        check_entry: checks each trace line's object as the schema checks an entry.
        real_rate_gbps: the real fabric's rate (``scale``), for ``replay.size_scale: real``.

    Returns:
        The workload.

    Raises:
        ConfigError: naming the field (or the trace line) of the first problem.
    """
    planes = len(topo.nics(topo.rank_hosts()[0])) if topo.hosts else 1
    # a multi-plane fabric: one connection per plane at least, and as many on each plane
    connections = raw.get("connections", max(DEFAULT_CONNECTIONS, planes))
    if connections % planes:
        raise ConfigError("workload.connections",
                          f"{connections} connections per peer do not spread evenly over the "
                          f"fabric's {planes} planes (connection c takes plane c % {planes} + "
                          f"1): give a multiple of {planes}")
    timeout_s = float(raw.get("timeout_s", DEFAULT_TIMEOUT_S))
    defaults = {"congestion_control": raw.get("congestion_control"), "dscp": raw.get("dscp", 0),
                "transport": raw.get("transport", "tcp"), "spray": raw.get("spray"),
                "dcqcn": raw.get("dcqcn", "paper")}
    job_settings(defaults, "workload")  # its errors named there, not in the first entry
    if raw.get("jobs"):
        named = named_jobs(topo, raw, base_dir, connections, timeout_s, defaults, _read,
                           check_entry, real_rate_gbps)
        return dataclasses.replace(named, program=parse_program(topo, raw["program"], base_dir)
                                   ) if raw.get("program") else named
    entries = [(entry, f"workload.collectives[{i}]")
               for i, entry in enumerate(raw.get("collectives", []))]
    replayed: list[tuple[dict, str]] = []
    if raw.get("trace"):
        replayed += parse_trace(_read(base_dir, raw["trace"], "workload.trace"),
                                str(raw["trace"]), check_entry)
    if raw.get("nccl_log"):
        replayed += nccl_entries(import_log(_read(base_dir, raw["nccl_log"],
                                                  "workload.nccl_log")))
    if raw.get("chakra"):
        replayed += _chakra(topo, base_dir, raw["chakra"])
    host_rate = min((lk.rate_mbps for lk in topo.links if lk.tier == "host"), default=1.0)
    replayed, replay = scale_entries(replayed, raw.get("replay"), host_rate, real_rate_gbps,
                                     parse_size)
    replayed = replay_algorithm(replayed, (raw.get("replay") or {}).get("algorithm"), replay)
    entries += replayed
    read_json = lambda name, field: json_value(_read(base_dir, name, field), field)  # noqa: E731
    jobs = [entry_job(topo, i, {**defaults, **entry}, path, connections, timeout_s, read_json)
            for i, (entry, path) in enumerate(entries)]
    if raw.get("training"):
        jobs.append(training_job(topo, raw["training"], len(jobs), connections, timeout_s,
                                  defaults))
    program = parse_program(topo, raw["program"], base_dir) if raw.get("program") else None
    if not jobs and program is None:
        raise ConfigError("workload.collectives", "the workload lists no collectives (nor a "
                                                  "program)")
    return Workload(tuple(jobs), connections, timeout_s, replay=replay, program=program)


def _chakra(topo: Topology, base_dir: str, prefix: str) -> list[tuple[dict, str]]:
    """A Chakra trace set's entries (``PREFIX.0.et``, ``PREFIX.1.et``, ...: rank r on the
    r-th rank host, as NCCL numbers GPUs)."""
    traces, rank = [], 0
    while os.path.isfile(os.path.join(base_dir, f"{prefix}.{rank}.et")):
        name = f"{prefix}.{rank}.et"
        traces.append(chakra.read_trace(_read_bytes(base_dir, name, "workload.chakra"), name))
        rank += 1
    if not traces:
        raise ConfigError("workload.chakra", f"no {prefix}.0.et (a Chakra trace is one file "
                                             "per rank: PREFIX.0.et, PREFIX.1.et, ...)")
    hosts = topo.rank_hosts()
    if len(traces) > len(hosts):
        raise ConfigError("workload.chakra", f"{len(traces)} ranks, but the fabric has "
                                             f"{len(hosts)} hosts")
    out = []
    for entry, where in chakra.entries(traces, prefix):
        if "rank_ids" in entry:
            entry = {**{k: v for k, v in entry.items() if k != "rank_ids"},
                     "ranks": [hosts[r] for r in entry["rank_ids"]]}
        out.append((entry, where))
    return out


#: the largest trace or NCCL log read (``fabriclab --max-input-mb`` raises it): a file larger
#: than this is more likely a mistake (a device, a core dump) than a workload
MAX_INPUT_BYTES = 64 << 20


def _read(base_dir: str, path: str, field: str) -> str:
    """A trace's or log's text (see :func:`_read_bytes`)."""
    data = _read_bytes(base_dir, path, field)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(field, f"{path} is not UTF-8 text (byte {err.start})") from None


def _read_bytes(base_dir: str, path: str, field: str) -> bytes:
    """A workload file's bytes (:func:`read_regular`, at most :data:`MAX_INPUT_BYTES`)."""
    return read_regular(os.path.join(base_dir, path), field, MAX_INPUT_BYTES, path,
                        "a workload file may have (fabriclab --max-input-mb N raises it)")


def read_regular(full: str, field: str, most: int, shown_as: str | None = None,
                 limit_note: str = "such a file may have") -> bytes:
    """A regular file's bytes (a FIFO or a device would block or never end; a folder is
    not a file), at most ``most``.

    Raises:
        ConfigError: naming ``field``, the file (as ``shown_as``) and why it was not read.
    """
    shown_as = shown_as or full
    try:  # non-blocking: opening a FIFO with no writer would wait forever
        fd = os.open(full, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as err:
        raise ConfigError(field, f"cannot read {shown_as}: {err.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):  # (before fdopen, which refuses a folder by itself)
        os.close(fd)
        raise ConfigError(field, f"{shown_as} is not a regular file")
    with os.fdopen(fd, "rb") as fh:
        if st.st_size > most:
            raise ConfigError(field, f"{shown_as} is {st.st_size / 2**20:,.1f} MiB, over the "
                                     f"{most / 2**20:g} MiB {limit_note}")
        try:
            data = fh.read(most + 1)
        except OSError as err:
            raise ConfigError(field, f"cannot read {shown_as}: {err.strerror}") from None
    if len(data) > most:  # grew while read
        raise ConfigError(field, f"{shown_as} is over the {most / 2**20:g} MiB {limit_note}")
    return data
