"""What a run directory holds besides ``results.json`` (pure): the experiment as run and its
SHA-256, and the per-collective and per-flow CSV tables.

``DIR/experiment.json``
    the experiment's data as it ran (the variant's and sweep cell's fields set), with
    ``sha256`` over its canonical JSON: two runs of the same experiment have the same hash.
``DIR/environment.json``
    software versions and machine facts (:mod:`testbed.linux.environment`).
``DIR/collectives.csv``, ``DIR/flows.csv``
    one row per collective run / per transfer.
``DIR/logs/``
    the controller's log and the traffic agents' stderr.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json

COLLECTIVE_COLUMNS = ("job", "repetition", "label", "op", "algorithm", "communicator_size",
                      "bytes", "time_us", "algbw_GBps", "busbw_GBps", "ideal_s",
                      "efficiency", "fct_p50_s", "fct_p99_s", "fct_max_s", "iteration",
                      "gap_s", "transport", "goodput_ratio")
FLOW_COLUMNS = ("job", "repetition", "label", "op", "src", "dst", "step", "bytes", "done_s")


def experiment_document(raw: dict) -> dict:
    """The experiment as run, with the SHA-256 of its canonical JSON (keys sorted, no
    whitespace)."""
    canonical = json.dumps(raw, sort_keys=True, separators=(",", ":"), default=str)
    return {"sha256": hashlib.sha256(canonical.encode()).hexdigest(), "experiment": raw}


def collectives_csv(rows: list[dict]) -> str:
    """``results.json``'s collectives, one CSV row each (:data:`COLLECTIVE_COLUMNS`)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLLECTIVE_COLUMNS)
    for r in rows:
        fct = r.get("flow_completion_s") or {}
        transport = r.get("transport") or {}
        writer.writerow([r.get("job"), r.get("repetition"), r.get("label", ""), r.get("op"),
                         r.get("algorithm"), r.get("communicator_size"), r.get("bytes"),
                         _num(r.get("time_us")), _num(r.get("algbw_GBps")),
                         _num(r.get("busbw_GBps")), _num(r.get("ideal_s")),
                         _num(r.get("efficiency")), _num(fct.get("p50")), _num(fct.get("p99")),
                         _num(fct.get("max")), "" if r.get("iteration") is None
                         else r["iteration"], _num(r.get("gap_s")),
                         transport.get("transport", "tcp"),
                         _num(transport.get("goodput_ratio"))])
    return out.getvalue()


def flow_rows(job: int, results: list) -> list[list]:
    """One job's transfers (``CollectiveResult.flows``), as :data:`FLOW_COLUMNS` rows."""
    rows = []
    for repetition, r in enumerate(results):
        for src, dst, step, nbytes, done_s in r.flows:
            rows.append([job, repetition, r.label, r.op, src, dst, step, nbytes, done_s])
    return rows


def flows_csv(rows: list[list]) -> str:
    """The per-transfer table (:data:`FLOW_COLUMNS`)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(FLOW_COLUMNS)
    writer.writerows(rows)
    return out.getvalue()


def _num(value) -> str:
    return "" if value is None else f"{value:.6g}" if isinstance(value, float) else str(value)
