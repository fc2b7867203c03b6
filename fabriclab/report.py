"""``DIR/report.html``: one self-contained page (every plot inlined as a PNG, no network) for a
run, a run with variants or a sweep.

What it shows: busbw and efficiency per run (variant or sweep cell) with error bars over
repetitions; flow completion CDFs; per run, a heatmap of link utilization per tier over time,
the queue, drop, ECN and PFC timelines, a drawing of the topology with hot links coloured and
failed links marked; the fidelity verdict of every run; what the real-equivalent units mean;
the software and machine it ran on. Plots are matplotlib's; the data are the run directory's
files (``results.json``, ``timeline.json``, ``flows.csv``, ``environment.json``).
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from fabriclab.drawing import draw  # noqa: E402
from fabriclab.model import experiment as xp  # noqa: E402
from fabriclab.model import sweep as sw  # noqa: E402
from fabriclab.model.results import job_summaries, upgrade  # noqa: E402
from testbed.errors import ConfigError  # noqa: E402
from traffic.measure.results import row_label  # noqa: E402

DETAILED_RUNS = 8  # runs that get their own heatmap, timelines and drawing


@dataclass
class Run:
    """One run directory's data."""

    name: str
    directory: Path
    doc: dict
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
        doc = _read_json(directory / "results.json")
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


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def efficiency_chart(runs: list[Run]) -> str:
    """Each job's efficiency per run group: the mean over repetitions, error bar one SD."""
    rows = []
    for run in runs:
        jobs = [{"label": s.label or s.op, "op": s.op, "busbw_GBps": s.busbw_GBps,
                 "efficiency": s.efficiency} for s in job_summaries(run.doc["collectives"])]
        rows.append({"cell": run.group, "values": {}, "complete": bool(run.doc.get("complete")),
                     "error": run.doc.get("error"), "jobs": jobs})
    summary = sw.summarize(rows)
    labels = list(dict.fromkeys(j["label"] for line in summary for j in line["jobs"]))
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(summary) * max(1, len(labels)) / 2), 3.6))
    width = 0.8 / max(1, len(labels))
    for i, label in enumerate(labels):
        xs, ys, es = [], [], []
        for x, line in enumerate(summary):
            eff = next((j["efficiency"] for j in line["jobs"] if j["label"] == label), None)
            if eff and eff["mean"] is not None:
                xs.append(x + i * width)
                ys.append(eff["mean"])
                es.append(eff["sd"] or 0.0)
        ax.bar(xs, ys, width, yerr=es, capsize=3, label=label)
    ax.set_xticks([x + width * (len(labels) - 1) / 2 for x in range(len(summary))])
    ax.set_xticklabels([line["cell"] for line in summary], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("efficiency (busbw / link rate)")
    ax.set_ylim(0, 1.1)
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.legend(fontsize=7, ncol=min(4, max(1, len(labels))))
    ax.set_title("efficiency per run (mean, error bar: one SD over repetitions)")
    return _png(fig)


def fct_cdf_chart(runs: list[Run]) -> str | None:
    """Flow completion CDFs: one panel per job label, one line per run."""
    by_label: dict[str, dict[str, list[float]]] = {}
    for run in runs:
        for row in run.flows:
            label = row_label(row)
            by_label.setdefault(label, {}).setdefault(run.name, []).append(float(row["done_s"]))
    if not by_label:
        return None
    labels = list(by_label)[:6]
    fig, axes = plt.subplots(1, len(labels), figsize=(3.6 * len(labels), 3.0), squeeze=False)
    for ax, label in zip(axes[0], labels):
        for name, values in list(by_label[label].items())[:10]:
            values.sort()
            ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=name,
                    lw=1)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("completion (s from the collective's start)", fontsize=8)
        ax.set_ylim(0, 1.02)
    axes[0][0].set_ylabel("CDF of transfers")
    axes[0][-1].legend(fontsize=6)
    return _png(fig)


def _rates(timeline: dict) -> tuple[list[float], dict[str, list[float]]]:
    """Sample times, and each port's utilization per interval."""
    samples = timeline["samples"]
    times = [s["t_s"] for s in samples[1:]]
    util: dict[str, list[float]] = {}
    for port, meta in timeline["ports"].items():
        series = []
        for a, b in zip(samples, samples[1:]):
            dt = b["t_s"] - a["t_s"]
            pa, pb = a["ports"].get(port), b["ports"].get(port)
            series.append((pb[0] - pa[0]) * 8 / dt / meta["rate_bps"] if pa and pb and dt > 0
                          else 0.0)
        util[port] = series
    return times, util


def heatmap_chart(timeline: dict) -> str | None:
    """Utilization of every switch port, grouped by tier, over time."""
    if not timeline or len(timeline.get("samples", [])) < 3:
        return None
    times, util = _rates(timeline)
    tiers: dict[str, list[str]] = {}
    for port, meta in sorted(timeline["ports"].items()):
        tiers.setdefault(meta["tier"], []).append(port)
    fig, axes = plt.subplots(len(tiers), 1, figsize=(9, 0.5 + 0.18 * len(util) + 0.4 * len(tiers)),
                             squeeze=False, sharex=True)
    image = None
    for ax, (tier, ports) in zip(axes[:, 0], sorted(tiers.items())):
        image = ax.imshow([util[p] for p in ports], aspect="auto", vmin=0, vmax=1,
                          cmap="inferno", interpolation="nearest",
                          extent=(times[0] - 1, times[-1], len(ports), 0))
        ax.set_ylabel(tier, rotation=0, ha="right", fontsize=8)
        ax.set_yticks([])
    axes[-1, 0].set_xlabel("s since the run's fabric came up")
    fig.colorbar(image, ax=axes[:, 0], label="utilization", shrink=0.8)
    fig.suptitle("link utilization per tier (rows: switch ports)", fontsize=10)
    return _png(fig)


def queue_chart(timeline: dict) -> str | None:
    """Per tier the largest backlog over time; drops, ECN marks and PFC pauses per second."""
    if not timeline or len(timeline.get("samples", [])) < 3:
        return None
    samples = timeline["samples"]
    times = [s["t_s"] for s in samples[1:]]
    tiers: dict[str, list[str]] = {}
    for port, meta in timeline["ports"].items():
        tiers.setdefault(meta["tier"], []).append(port)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 4.6), sharex=True)
    for tier, ports in sorted(tiers.items()):
        top.plot(times, [max((s["ports"].get(p, [0, 0])[1] for p in ports), default=0) / 1024
                         for s in samples[1:]], label=tier, lw=1)
    top.set_ylabel("largest backlog, KiB")
    top.legend(fontsize=7, ncol=3)
    for index, name in ((2, "drops"), (3, "ECN marks"), (4, "PFC pauses")):
        series = []
        for a, b in zip(samples, samples[1:]):
            dt = b["t_s"] - a["t_s"]
            total = sum(b["ports"][p][index] - a["ports"].get(p, b["ports"][p])[index]
                        for p in b["ports"])
            series.append(total / dt if dt > 0 else 0.0)
        bottom.plot(times, series, label=name, lw=1)
    bottom.set_ylabel("per second, all ports")
    bottom.set_xlabel("s since the run's fabric came up")
    bottom.legend(fontsize=7)
    fig.suptitle("switch queues", fontsize=10)
    return _png(fig)


def failed_links(doc: dict) -> set[str]:
    """Links the run took down and did not bring back."""
    down = set((doc.get("controller") or {}).get("links_down") or [])
    for event in doc.get("failures") or []:
        target = event.get("target")
        if isinstance(target, list):
            target = "-".join(target)
        if event.get("action") == "down":
            down.add(str(target))
        elif event.get("action") == "up":
            down.discard(str(target))
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
    _, util = _rates(timeline)
    load: dict[str, float] = {}
    for port, meta in timeline["ports"].items():
        series = util.get(port) or [0.0]
        load[meta["link"]] = max(load.get(meta["link"], 0.0), sum(series) / len(series))
    return _png(draw(topo, run.name, load=load, failed=frozenset(failed_links(run.doc))))


def _topology(directory: Path):
    """The topology a run ran on, from the experiment it kept (None when it kept none)."""
    kept = _read_json(directory / "experiment.json")
    try:
        return xp.parse(kept["experiment"]).topology if kept else None
    except (ConfigError, KeyError, TypeError):
        return None


def _img(b64: str | None, alt: str) -> str:
    if b64 is None:
        return f"<p class='none'>{html.escape(alt)}: no data</p>"
    return f"<img alt='{html.escape(alt)}' src='data:image/png;base64,{b64}'>"


def _table(headers: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def render(out: Path, runs: list[Run]) -> str:
    """The page."""
    first = runs[0].doc if runs else {}
    parts = [f"<h1>{html.escape(first.get('experiment', out.name))}</h1>",
             f"<p>{len(runs)} run(s) in {html.escape(str(out))}</p>"]
    verdicts = [[r.name, "complete" if r.doc.get("complete") else
                 f"failed: {r.doc.get('error') or ''}"[:200],
                 (r.doc.get("fidelity") or {}).get("verdict", "-"),
                 "; ".join((r.doc.get("fidelity") or {}).get("reasons", [])) or "-",
                 (r.doc.get("fidelity") or {}).get("idle_pct", {}).get("median", "-")]
                for r in runs]
    parts += ["<h2>Fidelity</h2>", _table(["run", "status", "fidelity", "reasons",
                                           "machine idle % (median)"], verdicts)]
    parts += ["<h2>Efficiency</h2>", _img(efficiency_chart(runs) if runs else None,
                                          "efficiency per run")]
    parts += ["<h2>Flow completion</h2>", _img(fct_cdf_chart(runs), "flow completion CDFs")]
    scale = first.get("real_scale")
    if scale:
        parts += ["<h2>Real-equivalent units</h2>",
                  f"<p>{scale['real_rate_gbps']:g} Gbit/s links and {scale['real_rtt_us']:g} us "
                  f"base RTT stand for the emulated {scale['emulated_rate_mbps']:g} Mbit/s and "
                  f"{scale['emulated_rtt_ms']:g} ms. Scales: {html.escape(scale['scales'])}. "
                  f"Does not scale: {html.escape(scale['does_not_scale'])}.</p>"]
    for run in runs[:DETAILED_RUNS]:
        parts += [f"<h2>Run {html.escape(run.name)}</h2>",
                  _img(topology_chart(run), f"{run.name} topology"),
                  _img(heatmap_chart(run.timeline), f"{run.name} utilization heatmap"),
                  _img(queue_chart(run.timeline), f"{run.name} queues")]
    if len(runs) > DETAILED_RUNS:
        parts.append(f"<p>{len(runs) - DETAILED_RUNS} more runs: their own directories hold "
                     "their data.</p>")
    env = _read_json(runs[0].directory / "environment.json") if runs else None
    if env:
        rows = [[k, v] for k, v in {**env.get("software", {}), **env.get("machine", {})}.items()]
        parts += ["<h2>Software and machine</h2>", _table(["", ""], rows)]
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
             "img{max-width:100%;display:block;margin:1em 0}table{border-collapse:collapse;"
             "font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}")
    # the page marks itself once every image has decoded (the report test reads it)
    script = ("window.addEventListener('load',()=>{const i=[...document.images];"
              "document.body.dataset.images=i.filter(x=>x.complete&&x.naturalWidth>0).length"
              "+'/'+i.length;});")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>"
            f"{html.escape(first.get('experiment', 'report'))}</title><style>{style}</style>"
            f"</head><body>{''.join(parts)}<script>{script}</script></body></html>")


def write_report(out: Path) -> Path:
    """Build ``out/report.html`` from the runs under ``out``; returns its path."""
    from testbed.linux.files import write_text_atomic

    path = out / "report.html"
    write_text_atomic(path, render(out, load_runs(out)))
    return path
