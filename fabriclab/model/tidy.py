"""Tidy tables across runs (pure): one row per collective or per transfer, every run of a
sweep or a variants run in one table, each cell's parameters as columns, ready for a data
frame (:meth:`fabriclab.api.Results.to_dataframe`) or a sweep's ``collectives.csv``,
``flows.csv`` and their Parquet twins.

A run is ``(name, parameters, document, flows)``: its name (the cell's or variant's
directory), the values that made it (a sweep's axes by field path, ``variant``, the cell's
``repetition``), its ``results.json`` typed, and its ``flows.csv`` rows.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field

from fabriclab.model.document import RunDocument
from fabriclab.model.rundir import FLOW_COLUMNS

#: flows.csv's numeric columns (the rest stay text)
FLOW_NUMBERS = {"job": int, "repetition": int, "step": int, "bytes": int,
                "start_unix_s": float, "start_s": float, "end_s": float, "fct_s": float,
                "ideal_fct_s": float, "slowdown": float, "line_rate_fct_s": float,
                "retransmitted": int}


@dataclass
class Run:
    """One run of a table: its name, the parameters that made it, its document and flows."""

    name: str
    parameters: dict = field(default_factory=dict)
    document: RunDocument | None = None
    flows: list[dict] = field(default_factory=list)
    group: str = ""  # a sweep cell over its repetitions (compared as one line)


def collective_records(runs: list[Run]) -> list[dict]:
    """One record per collective of every run: ``run``, its parameters, then the collective's
    figures, its transport, the run's seed, datapath, fidelity verdict and completeness."""
    out = []
    for run in runs:
        doc = run.document
        if doc is None:
            continue
        prov = doc.provenance
        for r in doc.collectives:
            t = r.transport
            out.append({"run": run.name, **run.parameters,
                        "job": r.job, "repetition": r.repetition, "label": r.name,
                        "op": r.op, "algorithm": r.algorithm,
                        "ranks": r.communicator_size or len(r.ranks), "bytes": r.bytes,
                        "time_us": r.time_us, "algbw_GBps": r.algbw_GBps,
                        "busbw_GBps": r.busbw_GBps, "ideal_s": r.ideal_s,
                        "efficiency": r.efficiency, "fct_p50_s": r.fct_s.p50,
                        "fct_p99_s": r.fct_s.p99, "slowdown_p50": r.slowdown.p50,
                        "slowdown_p99": r.slowdown.p99, "end_p99_s": r.flow_end_s.p99,
                        "transport": t.label if t else "tcp",
                        "retransmitted": t.tx_retransmitted if t else None,
                        "predicted_s": r.predicted_s, "predicted_hashed_s": r.predicted_hashed_s,
                        "seed": prov.seed if prov else None,
                        "datapath": prov.datapath if prov else None,
                        "fidelity": doc.fidelity_verdict, "complete": doc.complete})
    return out


def flow_records(runs: list[Run]) -> list[dict]:
    """One record per transfer of every run: ``run``, its parameters, then flows.csv's
    columns, numbers as numbers (an empty field: None)."""
    out = []
    for run in runs:
        for row in run.flows:
            record = {"run": run.name, **run.parameters}
            for key in FLOW_COLUMNS:
                value = row.get(key, "")
                kind = FLOW_NUMBERS.get(key)
                record[key] = (None if value in ("", None) else kind(float(value))
                               if kind is int else kind(value)) if kind else value
            out.append(record)
    return out


def failure_records(runs: list[Run]) -> list[dict]:
    """One record per failure event and watched port of every run (one with ``port`` None
    for an event that watched none, a repair): ``run``, its parameters, the event (its index
    in ``failures``, action, target, planned and applied time, rate factor, the delivered
    throughput before, during and after it) and, per port, the rate it carries, its
    alternatives and the times to move off (``ms``, ``averaged_ms``; ``real_`` on a
    time-scaled fabric)."""
    out = []
    for run in runs:
        doc = run.document
        for index, f in enumerate(doc.failures or () if doc else ()):
            tp = f.throughput or {}
            event = {"run": run.name, **run.parameters, "event": index, "action": f.action,
                     "target": f.link, "at_s": f.at_s, "applied_s": f.applied_s,
                     "rate_factor": f.rate_factor, "before_mbps": tp.get("before_mbps"),
                     "during_mbps": tp.get("during_mbps"), "after_mbps": tp.get("after_mbps")}
            move = f.move_off or {}
            ports = sorted(move.get("rates_mbps") or {})
            for port in ports or [None]:
                row = {**event, "port": port}
                if port is not None:
                    row["alternatives"] = " ".join((move.get("alternatives") or {}).get(port, []))
                    for key in ("rates_mbps", "ms", "averaged_ms", "window_ms", "packet_bytes",
                                "real_ms", "real_averaged_ms"):
                        if key in move:
                            row["rate_mbps" if key == "rates_mbps" else key] = \
                                move[key].get(port)
                out.append(row)
    return out


def to_csv(records: list[dict]) -> str:
    """Records as CSV, the columns in the order they first appear (a parameter only some
    runs have is empty in the others)."""
    columns = list(dict.fromkeys(k for r in records for k in r))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, columns, lineterminator="\n", restval="")
    writer.writeheader()
    for r in records:
        writer.writerow({k: "" if v is None else v for k, v in r.items()})
    return buf.getvalue()


def parameters(cell: dict) -> dict:
    """A sweep cell's record (``sweep.json``'s ``cells``) as columns: its axes' values by
    field path, its variant and repetition."""
    out = dict(cell.get("values") or {})
    if cell.get("variant"):
        out["variant"] = cell["variant"]
    out["cell_repetition"] = cell.get("repetition", 0)
    return out


#: a job's figures in ``fabriclab compare``: the mean over the runs of a line
COMPARED = ("efficiency", "busbw_GBps", "time_us", "fct_p50_s", "fct_p99_s", "slowdown_p99")


def compared_records(runs: list[Run]) -> list[dict]:
    """Per collective of every run its label and :data:`COMPARED`, times and bandwidths in
    the real fabric's units where the run was time-scaled (``emulator.time_scale``: its
    collectives carry them as ``real``), so that runs at different N compare."""
    out = []
    for run in runs:
        for r in run.document.collectives if run.document else []:
            real = r.real
            fct = real.fct_s if real and real.fct_s.p50 is not None else r.fct_s
            out.append({"label": r.name, "efficiency": r.efficiency,
                        "busbw_GBps": real.busbw_GBps if real else r.busbw_GBps,
                        "time_us": real.time_us if real else r.time_us,
                        "fct_p50_s": fct.p50, "fct_p99_s": fct.p99,
                        "slowdown_p99": r.slowdown.p99})
    return out


def compare_lines(lines: list[tuple[str, list[Run]]]) -> list[dict]:
    """One line per (name, runs) (a run, a variant, a sweep cell over its repetitions): per
    job label the mean of :data:`COMPARED` over the runs' collectives (in the real fabric's
    units: :func:`compared_records`) and their count ``n``, whether all runs completed, their
    errors, and the provenance they share (a value the runs of the line disagree on:
    ``"(mixed)"``)."""
    out = []
    for name, runs in lines:
        jobs: dict[str, list[dict]] = {}
        for r in compared_records(runs):
            jobs.setdefault(r["label"], []).append(r)
        docs = [run.document for run in runs if run.document is not None]
        out.append({"run": name, "complete": bool(docs) and len(docs) == len(runs)
                    and all(d.complete for d in docs),
                    "error": "; ".join(d.error for d in docs if d.error) or None,
                    "jobs": [{"label": label, "n": len(rows),
                              **{k: _mean([r[k] for r in rows]) for k in COMPARED}}
                             for label, rows in jobs.items()],
                    "provenance": _shared([_flat(d.provenance.to_json()) if d.provenance
                                           else {} for d in docs])})
    return out


def deltas(lines: list[dict], baseline: int = 0) -> list[dict]:
    """Each line's jobs with ``delta_<figure>``: the relative change of each figure against
    the same job of line ``baseline`` (None where either is missing)."""
    base = {j["label"]: j for j in lines[baseline]["jobs"]} if lines else {}
    for line in lines:
        for job in line["jobs"]:
            ref = base.get(job["label"], {})
            for k in COMPARED:
                a, b = job.get(k), ref.get(k)
                job[f"delta_{k}"] = None if a is None or not b else a / b - 1
    return lines


def provenance_diff(lines: list[dict]) -> dict[str, list]:
    """The provenance fields whose values differ between the lines: field -> each line's."""
    keys = list(dict.fromkeys(k for line in lines for k in line["provenance"]))
    out = {}
    for k in keys:
        values = [line["provenance"].get(k) for line in lines]
        if len({str(v) for v in values}) > 1:
            out[k] = values
    return out


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _flat(doc: dict, prefix: str = "") -> dict:
    """A nested provenance as ``a.b`` keys (lists joined with ``+``)."""
    out = {}
    for k, v in doc.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, f"{key}."))
        else:
            out[key] = "+".join(map(str, v)) if isinstance(v, list) else v
    return out


def _shared(flats: list[dict]) -> dict:
    keys = list(dict.fromkeys(k for f in flats for k in f))
    return {k: (flats[0].get(k) if len({str(f.get(k)) for f in flats}) == 1 else "(mixed)")
            for k in keys}
