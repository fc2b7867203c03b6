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
