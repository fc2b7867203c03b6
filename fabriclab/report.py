"""``DIR/report.html``: one self-contained page (every plot inlined as a PNG, no network) for a
run, a run with variants or a sweep.

What it shows: the fidelity verdict of every run; efficiency per run (variant or sweep cell)
with error bars over repetitions; several runs overlaid (utilization over time, busbw per
collective); flow completion CDFs with the ideal; what the real-equivalent units mean; per
run, links to its files, its collectives as NCCL-tests prints them, the experiment file it
ran, a drawing of the topology (hot links coloured on a scale, failed links marked), a
labelled heatmap of link utilization per tier over time and the queue, drop, ECN and PFC
timelines, both with each collective's start and end marked; the software and machine it ran
on. Plots are :mod:`fabriclab.charts`'s; the data are the run directory's files.
"""

from __future__ import annotations

import csv
import html
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fabriclab import charts
from fabriclab.drawing import draw
from fabriclab.model import experiment as xp
from fabriclab.model.document import RunDocument
from fabriclab.model.results import gbps_text, job_summaries, upgrade, us_text
from fabriclab.rundirs import read_document
from testbed.errors import ConfigError
from traffic.measure.flows import slowdown_by_size

DETAILED_RUNS = 8  # runs that get their own heatmap, timelines and drawing


@dataclass
class Run:
    """One run directory's data."""

    name: str
    directory: Path
    doc: RunDocument
    timeline: dict | None = None
    flows: list[dict] = field(default_factory=list)
    group: str = ""  # its sweep cell without the repetition (else its name)


def _read_json(path: Path) -> dict | None:
    try:
        return upgrade(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def load_runs(out: Path) -> list[Run]:
    """The runs under ``out``: a sweep's cells, a run's variants, or the run itself."""
    entries: list[tuple[str, Path, str]] = []
    if (out / "sweep.json").is_file():
        for cell in _read_json(out / "sweep.json")["cells"]:
            entries.append((cell["name"], out / cell["name"], cell["cell"]))
    elif (out / "variants.json").is_file():
        for row in _read_json(out / "variants.json"):
            entries.append((str(row["variant"]), out / str(row["variant"]), str(row["variant"])))
    else:
        entries.append((out.name, out, out.name))
    runs = []
    for name, directory, group in entries:
        doc = read_document(directory / "results.json")
        if doc is None:
            continue
        flows = []
        try:
            with open(directory / "flows.csv", encoding="utf-8") as fh:
                flows = list(csv.DictReader(fh))
        except OSError:
            pass
        runs.append(Run(name, directory, doc, _read_json(directory / "timeline.json"), flows,
                        group))
    return runs


def failed_links(doc: RunDocument) -> set[str]:
    """Links the run took down and did not bring back."""
    down = set(doc.controller.links_down if doc.controller else ())
    for event in doc.failures or ():
        if event.action == "down":
            down.add(event.link)
        elif event.action == "up":
            down.discard(event.link)
    return down


def topology_chart(run: Run) -> str | None:
    """The fabric as ``fabriclab graph`` draws it (:func:`fabriclab.drawing.draw`), each link
    coloured and widened by its busier direction's mean utilization over the run, failed
    links dashed red; None without the run's experiment or timeline."""
    timeline = run.timeline
    if not timeline or len(timeline.get("samples", [])) < 2:
        return None
    topo = _topology(run.directory)
    if topo is None:
        return None
    _, util = charts.rates(timeline)
    load: dict[str, float] = {}
    for port, meta in timeline["ports"].items():
        series = util.get(port) or [0.0]
        load[meta["link"]] = max(load.get(meta["link"], 0.0), sum(series) / len(series))
    return charts.png(draw(topo, run.name, load=load, failed=frozenset(failed_links(run.doc))))


def _topology(directory: Path):
    """The topology a run ran on, from the experiment it kept (None when it kept none)."""
    kept = _read_json(directory / "experiment.json")
    try:
        return xp.parse(kept["experiment"]).topology if kept else None
    except (ConfigError, KeyError, TypeError):
        return None


def _matrix(run: Run) -> str:
    """The run's traffic matrix (nothing for runs made before ``traffic.json``)."""
    chart = charts.matrix_chart((_read_json(run.directory / "traffic.json") or {}).get("matrix"))
    return "" if chart is None else _img(chart, f"{run.name} traffic matrix")


def _img(b64: str | None, alt: str, kind: str = "") -> str:
    if b64 is None:
        return f"<p class='none'>{html.escape(alt)}: no data</p>"
    return (f"<img{f' class={kind}' if kind else ''} alt='{html.escape(alt)}' "
            f"src='data:image/png;base64,{b64}'>")


def _table(headers: list[str], rows: list[list], numeric_from: int | None = None) -> str:
    """An HTML table; columns from ``numeric_from`` on are right-aligned figures."""
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(
        f"<td{' class=n' if numeric_from is not None and i >= numeric_from else ''}>"
        f"{html.escape(str(c))}</td>" for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def numbers_table(doc: RunDocument) -> str:
    """The collectives as NCCL-tests prints them: per job and size, the mean over its
    repetitions (time us, algbw and busbw GB/s), with the ideal and the efficiency."""
    rows = []
    summaries = job_summaries(doc.collectives)
    hashed = any(s.hashed_us for s in summaries)  # the paths as hashed are known
    for s in summaries:
        same = [r for r in doc.collectives if (r.job, r.op, r.bytes) == (s.job, s.op, s.bytes)]
        ideals = [r.ideal_s for r in same if r.ideal_s]
        ideal_us = min(ideals) * 1e6 if ideals else None
        rows.append([s.job, s.label or s.op, s.algorithm, s.ranks, f"{s.bytes:,}",
                     f"{s.count:,}", s.repetitions, us_text(s.mean_us), gbps_text(s.algbw_GBps),
                     gbps_text(s.busbw_GBps), "-" if ideal_us is None else us_text(ideal_us),
                     f"{ideal_us / s.mean_us:.2f}" if ideal_us and s.mean_us else "-",
                     f"{s.efficiency:.3f}",
                     "-" if s.predicted_us is None else us_text(s.predicted_us),
                     "-" if s.of_predicted is None else f"{s.of_predicted:.2f}",
                     *(["-" if s.hashed_us is None else us_text(s.hashed_us),
                        "-" if s.of_hashed is None else f"{s.of_hashed:.2f}"] if hashed
                       else [])])
    return _table(["job", "collective", "algo", "ranks", "bytes", "count", "reps", "time us",
                   "algbw GB/s", "busbw GB/s", "ideal us", "of ideal", "eff", "predicted us",
                   "measured / predicted",
                   *(["as hashed us", "measured / as hashed"] if hashed else [])],
                  rows, numeric_from=3)


def slowdown_table(runs) -> str:
    """Per run and flow-size bin: transfers, and their p50, p99 and max slowdown."""
    rows = []
    for run in runs:
        pairs = [(int(f["bytes"]), float(f["slowdown"])) for f in run.flows
                 if f.get("slowdown")]
        for label, q in slowdown_by_size(pairs).items():
            rows.append([run.name, label, q["flows"], f"{q['p50']:.2f}", f"{q['p99']:.2f}",
                         f"{q['max']:.2f}"])
    if not rows:
        return ""
    return _table(["run", "flow size", "transfers", "slowdown p50", "p99", "max"], rows,
                  numeric_from=2)


def jobs_table(doc: RunDocument) -> str:
    """Several jobs at once: each one's time together and alone, the slowdown measured and
    predicted, and the links it shared."""
    rows = [[j.name, len(j.hosts), j.time_s, j.alone_s, j.slowdown, j.predicted_slowdown,
             ", ".join(j.shared_links[:8]) + (" ..." if len(j.shared_links) > 8 else "")]
            for j in doc.jobs or ()]
    if not rows:
        return ""
    return _table(["job", "ranks", "together s", "alone s", "slowdown", "predicted slowdown",
                   "shared links"], rows, numeric_from=1)


def iterations_table(doc: RunDocument) -> str:
    """Training iterations: time, compute, exposed and hidden communication, predicted."""
    predicted = {(p.job, p.iteration): p.predicted_s
                 for p in (doc.prediction.iterations or () if doc.prediction else ())}
    rows = [[i.job, i.iteration, i.time_s, _or_dash(i.compute_s), _or_dash(i.exposed_comm_s),
             _or_dash(i.comm_s), _or_dash(i.overlap_fraction),
             predicted.get((i.job, i.iteration), "-")]
            for i in doc.iterations or ()]
    if not rows:
        return ""
    return _table(["job", "iteration", "time s", "compute s", "exposed comm s", "comm s",
                   "hidden", "predicted s"], rows, numeric_from=1)


def _or_dash(value: float | None) -> float | str:
    return "-" if value is None else value


def _files(out: Path, run: Run) -> str:
    """Links to the run's own files, relative to the report."""
    names = ("results.json", "collectives.csv", "flows.csv", "timeline.json",
             "experiment.json", "environment.json")
    rel = os.path.relpath(run.directory, out)
    links = [f"<a href='{html.escape(name if rel == '.' else f'{rel}/{name}')}'>{name}</a>"
             for name in names if (run.directory / name).is_file()]
    return f"<p class='files'>files: {' · '.join(links)}</p>" if links else ""


def _experiment(run: Run) -> str:
    """The experiment file the run ran (as it kept it), folded."""
    kept = _read_json(run.directory / "experiment.json")
    if not kept or "experiment" not in kept:
        return ""
    text = yaml.safe_dump(kept["experiment"], sort_keys=False, width=100)
    source = run.doc.source or kept.get("source") or ""
    where = f" ({html.escape(source)})" if source else ""
    return (f"<details><summary>the experiment file{where}</summary>"
            f"<pre>{html.escape(text)}</pre></details>")


def render(out: Path, runs: list[Run]) -> str:
    """The page."""
    first = runs[0].doc if runs else RunDocument(out.name)
    parts = [f"<h1>{html.escape(first.experiment or out.name)}</h1>",
             f"<p>{len(runs)} run(s) in {html.escape(str(out))}; units as NCCL-tests prints "
             "them: time in us, bandwidth in GB/s (10<sup>9</sup> bytes/s)</p>"]
    verdicts = [[r.name, "complete" if r.doc.complete else f"failed: {r.doc.error or ''}"[:200],
                 r.doc.fidelity_verdict or "-",
                 "; ".join(r.doc.fidelity.reasons if r.doc.fidelity else ()) or "-",
                 _or_dash(r.doc.fidelity.idle_pct.median if r.doc.fidelity else None)]
                for r in runs]
    parts += ["<h2>Fidelity</h2>", _table(["run", "status", "fidelity", "reasons",
                                           "machine idle % (median)"], verdicts)]
    parts += ["<h2>Efficiency</h2>", _img(charts.efficiency_chart(runs) if runs else None,
                                          "efficiency per run")]
    if len(runs) > 1:
        parts += ["<h2>The runs overlaid</h2>", _img(charts.overlay_chart(runs),
                                                     "the runs overlaid")]
    parts += ["<h2>Transfers' ends</h2>", _img(charts.fct_cdf_chart(runs),
                                               "when the transfers ended")]
    slow = slowdown_table(runs)
    if slow:
        parts += ["<h2>Slowdown by flow size</h2>",
                  "<p>Each transfer's FCT (from its sender's first byte to its receiver's "
                  "last) over its time alone on the idle fabric (flows.csv).</p>",
                  _img(charts.slowdown_cdf_chart(runs), "slowdown CDFs by flow size"), slow]
    scale = first.real_scale
    if scale:
        parts += ["<h2>Real-equivalent units</h2>",
                  f"<p>{scale.real_rate_gbps:g} Gbit/s links and {scale.real_rtt_us:g} us "
                  f"base RTT stand for the emulated {scale.emulated_rate_mbps or 0:g} Mbit/s and "
                  f"{scale.emulated_rtt_ms or 0:g} ms. Scales: {html.escape(scale.scales)}. "
                  f"Does not scale: {html.escape(scale.does_not_scale)}.</p>"]
    for run in runs[:DETAILED_RUNS]:
        spans = charts.marks(run.doc, run.timeline)
        parts += [f"<h2>Run {html.escape(run.name)}</h2>", _files(out, run),
                  numbers_table(run.doc), jobs_table(run.doc), iterations_table(run.doc),
                  _experiment(run),
                  _img(topology_chart(run), f"{run.name} topology", "topo"),
                  _img(charts.heatmap_chart(run.timeline, spans),
                       f"{run.name} utilization heatmap"),
                  _matrix(run),
                  _img(charts.queue_chart(run.timeline, spans), f"{run.name} queues")]
    if len(runs) > DETAILED_RUNS:
        parts.append(f"<p>{len(runs) - DETAILED_RUNS} more runs: their own directories hold "
                     "their data.</p>")
    env = _read_json(runs[0].directory / "environment.json") if runs else None
    if env:
        rows = [[k, v] for k, v in {**env.get("software", {}), **env.get("machine", {})}.items()]
        parts += ["<h2>Software and machine</h2>", _table(["", ""], rows)]
    return _page(first.experiment or "report", parts)


def _page(title: str, parts: list[str]) -> str:
    style = ("body{font-family:sans-serif;margin:1em 2em;color:#222}"
             "img{width:100%;max-width:1400px;display:block;margin:1em 0}"
             "img.topo{max-width:760px}"
             "table{border-collapse:collapse;font-size:13px;margin:.5em 0}"
             "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}"
             "td.n{text-align:right;font-variant-numeric:tabular-nums}"
             "pre{background:#f6f6f6;padding:.6em;font-size:12px;overflow:auto}"
             "p.files{font-size:13px}h2{margin-top:1.6em;border-bottom:1px solid #ddd}")
    # the page marks itself once every image has decoded (the report test reads it)
    script = ("window.addEventListener('load',()=>{const i=[...document.images];"
              "document.body.dataset.images=i.filter(x=>x.complete&&x.naturalWidth>0).length"
              "+'/'+i.length;});")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>"
            f"{html.escape(title)}</title><style>{style}</style>"
            f"</head><body>{''.join(parts)}<script>{script}</script></body></html>")


def write_report(out: Path) -> Path:
    """Build ``out/report.html`` from the runs under ``out``; returns its path."""
    from testbed.linux.files import write_text_atomic

    path = out / "report.html"
    write_text_atomic(path, render(out, load_runs(out)))
    return path
