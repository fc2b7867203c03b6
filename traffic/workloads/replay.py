"""Replayed workloads (pure): a JSON-lines trace's entries and an NCCL log's collectives as
workload entries (:mod:`traffic.workloads.workload` turns entries into jobs).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from testbed.errors import ConfigError
from traffic.workloads.nccl_log import ImportedCollective

#: Checks one workload entry (a trace line's object) against the experiment schema; raises
#: ConfigError under the given field path. Supplied by the experiment layer.
EntryCheck = Callable[[dict, str], None]


# -- traces -------------------------------------------------------------------------------------
#
# A trace is JSON lines, one collective per line, replayed in file order:
#
#   {"op": "all_reduce", "size": "16MiB", "ranks": 8, "algorithm": "ring"}
#   {"op": "all_to_all", "size": 4194304, "ranks": [...], "concurrent": true, "t_s": 1.5}
#
# A line is a workload entry (its keys and types are the experiment schema's), whose ``t_s``
# says: do not start before t_s seconds after the replay began (the runner waits; a collective
# still follows the one before it, as NCCL's stream order does). Blank lines and lines starting
# with # are skipped.

def parse_trace(text: str, source: str = "trace",
                check_entry: EntryCheck | None = None) -> list[tuple[dict, str]]:
    """Workload entries from a JSON-lines trace, each with its field path (``source line N``).

    Raises:
        ConfigError: ``<source> line N`` for malformed JSON or an entry the schema refuses.
    """
    entries = []
    for no, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{source} line {no}"
        try:
            entry = json.loads(line)
        except ValueError as err:
            raise ConfigError(where, f"not JSON: {err}") from err
        if not isinstance(entry, dict):
            raise ConfigError(where, "each line is one JSON object")
        if check_entry is not None:
            check_entry(entry, where)
        entries.append((entry, where))
    if not entries:
        raise ConfigError(source, "the trace has no collectives")
    return entries


def nccl_entries(collectives: list[ImportedCollective]) -> list[tuple[dict, str]]:
    """Workload entries replaying imported NCCL collectives on the first ``nranks`` hosts.

    Send/Recv pairs of one opCount become one ``send_recv``; collectives keep NCCL's order.
    """
    entries = []
    seen_p2p = set()
    for coll in collectives:
        where = f"workload.nccl_log line {coll.first_line}"
        if coll.op in ("send", "recv"):
            if coll.op_count in seen_p2p:
                continue
            seen_p2p.add(coll.op_count)
            entry = {"op": "send_recv", "size": coll.size_bytes, "ranks": 2,
                     "label": f"nccl opCount {coll.op_count:x}"}
        elif coll.op == "reduce":
            entry = {"op": "all_reduce", "size": coll.size_bytes, "ranks": coll.nranks,
                     "label": f"nccl Reduce opCount {coll.op_count:x} (as all_reduce)"}
        else:
            entry = {"op": coll.op, "size": coll.size_bytes, "ranks": coll.nranks,
                     "label": f"nccl opCount {coll.op_count:x}"}
        entries.append((entry, where))
    return entries


def scale_entries(entries: list[tuple[dict, str]], raw: dict | None, host_rate_mbps: float,
                  real_rate_gbps: float | None, parse_size) -> tuple[list[tuple[dict, str]],
                                                                     dict | None]:
    """A replay at emulation scale (``workload.replay: {size_scale, time_scale}``): every
    entry's size times ``size_scale`` (at least a byte), its ``t_s`` and ``gap_s`` times
    ``time_scale``.
    ``size_scale: real`` derives it from the experiment's ``scale.real_rate_gbps``: the host
    rate over the real one, so a collective takes on the emulated fabric what it took on
    the real one (and ``time_scale`` 1 keeps the gaps as they were).

    Returns:
        The entries, and what was scaled (None when nothing was asked).

    Raises:
        ConfigError: ``real`` without ``scale.real_rate_gbps``.
    """
    if not raw or not entries:
        return entries, None
    size_scale = raw.get("size_scale", 1.0)
    mode = "factor"
    if size_scale == "real":
        if not real_rate_gbps:
            raise ConfigError("workload.replay.size_scale", "real needs scale.real_rate_gbps "
                                                            "(the rate the log was taken at)")
        size_scale, mode = host_rate_mbps / (real_rate_gbps * 1e3), "real"
    time_scale = float(raw.get("time_scale", 1.0))
    out, before, after = [], 0, 0
    for entry, where in entries:
        entry = dict(entry)
        if "size" in entry:
            size = parse_size(entry["size"], f"{where}.size")
            entry["size"] = max(1, round(size * size_scale))
            before, after = before + size, after + entry["size"]
        for key in ("t_s", "gap_s"):  # the trace's times: its start times and its gaps
            if key in entry:
                entry[key] = float(entry[key]) * time_scale
        out.append((entry, where))
    return out, {"mode": mode, "size_scale": size_scale, "time_scale": time_scale,
                 "entries": len(out), "bytes_as_logged": before, "bytes_replayed": after}
