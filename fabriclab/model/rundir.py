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

from traffic.measure.rows import CollectiveRow

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


def collectives_csv(rows: list[CollectiveRow]) -> str:
    """``results.json``'s collectives, one CSV row each (:data:`COLLECTIVE_COLUMNS`)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLLECTIVE_COLUMNS)
    for r in rows:
        fct, transport = r.flow_completion_s, r.transport
        writer.writerow([r.job, r.repetition, r.label, r.op, r.algorithm, r.communicator_size,
                         r.bytes, _num(r.time_us), _num(r.algbw_GBps), _num(r.busbw_GBps),
                         _num(r.ideal_s), _num(r.efficiency), _num(fct.p50), _num(fct.p99),
                         _num(fct.max), "" if r.iteration is None else r.iteration,
                         _num(r.gap_s), transport.transport if transport else "tcp",
                         _num(transport.goodput_ratio if transport else None)])
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
