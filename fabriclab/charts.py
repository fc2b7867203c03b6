"""The report's plots (matplotlib, PNG): efficiency per run, flow completion CDFs with the
ideal, the runs overlaid (fabric utilization over time, busbw per collective), and per run a
labelled utilization heatmap and the queue timelines, both with each collective's start and
end marked on the time axis.

Inputs are a run directory's documents as read back (``results.json``, ``timeline.json``,
``flows.csv`` rows); every function returns a base64 PNG, or None when there is nothing to
draw.
"""

from __future__ import annotations

import base64
import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from fabriclab.model import sweep as sw  # noqa: E402
from fabriclab.model.document import RunDocument  # noqa: E402
from fabriclab.model.results import job_summaries  # noqa: E402
from traffic.measure.flows import SIZE_BINS, size_bin  # noqa: E402
from traffic.measure.results import row_label  # noqa: E402

WIDTH_IN = 13.0  # the page is full width: plots as wide as a laptop screen shows them
MARKED = 12  # collectives whose marks carry their name (more: lines only)
OVERLAID = 10  # runs drawn on one plot


def png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def marks(doc: RunDocument, timeline: dict | None) -> list[tuple[str, float, float]]:
    """Each collective's (label, start, end) in the timeline's seconds (its ``t_s``), from
    the rows' start and time; none for a timeline or rows without a wall-clock origin."""
    origin = (timeline or {}).get("started_unix_s")
    if not origin:
        return []
    return [(r.name, r.start_unix_s - origin, r.end_unix_s - origin)
            for r in doc.collectives if r.start_unix_s]


def _mark(ax, spans: list[tuple[str, float, float]], names: bool) -> None:
    """Collectives on a time axis: a green line at each start, grey at each end, the name at
    the top where there are few."""
    for label, start, end in spans:
        ax.axvline(start, color="tab:green", lw=0.8, alpha=0.8)
        ax.axvline(end, color="0.45", lw=0.8, ls="--", alpha=0.8)
        if names and len(spans) <= MARKED:
            ax.text(start, 1.0, f" {label}", transform=ax.get_xaxis_transform(), fontsize=7,
                    va="bottom", ha="left", rotation=0, color="tab:green", clip_on=False)


def efficiency_chart(runs) -> str:
    """Each job's efficiency per run group: the mean over repetitions, error bar one SD."""
    rows = []
    for run in runs:
        jobs = [{"label": s.label or s.op, "op": s.op, "busbw_GBps": s.busbw_GBps,
                 "efficiency": s.efficiency} for s in job_summaries(run.doc.collectives)]
        rows.append({"cell": run.group, "values": {}, "complete": run.doc.complete,
                     "error": run.doc.error, "jobs": jobs})
    summary = sw.summarize(rows)
    labels = list(dict.fromkeys(j["label"] for line in summary for j in line["jobs"]))
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 3.6), layout="constrained")
    width = 0.8 / max(1, len(labels))
    for i, label in enumerate(labels):
        xs, ys, errs = [], [], []
        for x, line in enumerate(summary):
            job = next((j for j in line["jobs"] if j["label"] == label), None)
            if job and job["efficiency"]["mean"] is not None:
                xs.append(x + i * width)
                ys.append(job["efficiency"]["mean"])
                errs.append(job["efficiency"]["sd"] or 0.0)
        ax.bar(xs, ys, width, yerr=errs, capsize=3, label=label)
    ax.set_xticks([x + width * (len(labels) - 1) / 2 for x in range(len(summary))])
    ax.set_xticklabels([line["cell"] for line in summary], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("efficiency (busbw / link rate)")
    ax.set_ylim(0, 1.1)
    ax.axhline(1.0, color="grey", lw=0.5)
    if labels:  # (a program alone has no collectives of the agents')
        ax.legend(fontsize=7, ncol=min(4, max(1, len(labels))))
    ax.set_title("efficiency per run (mean, error bar: one SD over repetitions)")
    return png(fig)


def fct_cdf_chart(runs) -> str | None:
    """When the transfers ended, from their collective's start: one panel per job label, one
    line per run, and the ideal (the collective at line rate: its ``ideal_s``) as a dashed
    line."""
    by_label: dict[str, dict[str, list[float]]] = {}
    ideal: dict[str, float] = {}
    for run in runs:
        for row in run.flows:
            label = row_label(row)
            by_label.setdefault(label, {}).setdefault(run.name, []).append(float(row["end_s"] if "end_s" in row else row["done_s"]))
        for c in run.doc.collectives:
            if c.ideal_s:
                ideal[c.name] = min(ideal.get(c.name, c.ideal_s), c.ideal_s)
    if not by_label:
        return None
    labels = list(by_label)[:6]
    fig, axes = plt.subplots(1, len(labels), figsize=(WIDTH_IN, 3.2), squeeze=False,
                             layout="constrained")
    for ax, label in zip(axes[0], labels):
        for name, values in list(by_label[label].items())[:OVERLAID]:
            values.sort()  # a step per transfer; a few transfers get their points too
            ax.plot([0.0, *values], [0.0, *((i + 1) / len(values) for i in range(len(values)))],
                    label=name, lw=1, drawstyle="steps-post",
                    marker="o" if len(values) < 5 else None, ms=4,
                    markevery=list(range(1, len(values) + 1)))
        if label in ideal:
            ax.axvline(ideal[label], color="k", ls="--", lw=1,
                       label=f"ideal {ideal[label]:.3g} s")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("transfer's end (s from the collective's start)", fontsize=8)
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=6)
    axes[0][0].set_ylabel("CDF of transfers")
    return png(fig)


def slowdown_cdf_chart(runs) -> str | None:
    """Slowdown CDFs by flow size, as congestion-control papers draw them: one panel per size
    bin (:data:`traffic.measure.flows.SIZE_BINS`), one line per run; slowdown is a transfer's
    FCT over its time alone on the idle fabric (log axis)."""
    by_bin: dict[str, dict[str, list[float]]] = {}
    for run in runs:
        for row in run.flows:
            if row.get("slowdown"):
                by_bin.setdefault(size_bin(int(row["bytes"])), {}).setdefault(
                    run.name, []).append(float(row["slowdown"]))
    if not by_bin:
        return None
    order = [b for b in (size_bin(n) for n in (*SIZE_BINS, SIZE_BINS[-1] + 1)) if b in by_bin]
    fig, axes = plt.subplots(1, len(order), figsize=(WIDTH_IN, 3.2), squeeze=False,
                             layout="constrained")
    for ax, label in zip(axes[0], order):
        for name, values in list(by_bin[label].items())[:OVERLAID]:
            values.sort()
            ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=name,
                    lw=1, drawstyle="steps-post", marker="o" if len(values) < 5 else None, ms=4)
        ax.axvline(1.0, color="k", ls="--", lw=1)
        ax.set_xscale("log")
        total = sum(len(v) for v in by_bin[label].values())
        ax.set_title(f"{label} ({total} transfers)", fontsize=9)
        ax.set_xlabel("slowdown (FCT / alone on the idle fabric)", fontsize=8)
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=6)
    axes[0][0].set_ylabel("CDF of transfers")
    return png(fig)


def rates(timeline: dict) -> tuple[list[float], dict[str, list[float]]]:
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


def _port_name(meta: dict) -> str:
    return f"{meta['node']} > {meta['peer']}"


def heatmap_chart(timeline: dict, spans: list[tuple[str, float, float]] = ()) -> str | None:
    """Utilization of every switch port over time, grouped by tier, each row named by its
    port (``edge1_1 > agg1_1``), collectives marked."""
    if not timeline or len(timeline.get("samples", [])) < 3:
        return None
    times, util = rates(timeline)
    tiers: dict[str, list[str]] = {}
    for port, meta in sorted(timeline["ports"].items(), key=lambda kv: _port_name(kv[1])):
        tiers.setdefault(meta["tier"], []).append(port)
    heights = [max(1.0, 0.13 * len(ports)) for ports in tiers.values()]
    fig, axes = plt.subplots(len(tiers), 1, figsize=(WIDTH_IN, 0.6 + sum(heights)),
                             squeeze=False, sharex=True, layout="constrained",
                             gridspec_kw={"height_ratios": heights})
    image = None
    step = times[1] - times[0] if len(times) > 1 else 1.0
    for ax, (tier, ports) in zip(axes[:, 0], sorted(tiers.items())):
        image = ax.imshow([util[p] for p in ports], aspect="auto", vmin=0, vmax=1,
                          cmap="inferno", interpolation="nearest",
                          extent=(times[0] - step, times[-1], len(ports), 0))
        ax.set_yticks([i + 0.5 for i in range(len(ports))])
        ax.set_yticklabels([_port_name(timeline["ports"][p]) for p in ports],
                           fontsize=max(4, min(7, 400 // max(1, len(util)))))
        ax.set_ylabel(tier, fontsize=8)
        _mark(ax, list(spans), ax is axes[0, 0])
    axes[-1, 0].set_xlabel("s since the run began (green: a collective starts, grey: ends)")
    fig.colorbar(image, ax=axes[:, 0], label="utilization", shrink=0.8, pad=0.01)
    return png(fig)


def queue_chart(timeline: dict, spans: list[tuple[str, float, float]] = ()) -> str | None:
    """Per tier the largest backlog over time; drops, ECN marks and PFC pauses per second;
    collectives marked."""
    if not timeline or len(timeline.get("samples", [])) < 3:
        return None
    samples = timeline["samples"]
    times = [s["t_s"] for s in samples[1:]]
    tiers: dict[str, list[str]] = {}
    for port, meta in timeline["ports"].items():
        tiers.setdefault(meta["tier"], []).append(port)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(WIDTH_IN, 4.6), sharex=True,
                                      layout="constrained")
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
    for ax in (top, bottom):
        _mark(ax, list(spans), ax is top)
    bottom.set_ylabel("per second, all ports")
    bottom.set_xlabel("s since the run began (green: a collective starts, grey: ends)")
    bottom.legend(fontsize=7)
    return png(fig)


def overlay_chart(runs) -> str | None:
    """Several runs (variants, sweep cells, repetitions) on one plot each: the mean
    utilization of the fabric's switch-to-switch ports over time, and each collective's
    busbw (GB/s, the mean over repetitions)."""
    drawn = [r for r in runs if r.timeline and len(r.timeline.get("samples", [])) >= 3]
    if len(runs) < 2:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(WIDTH_IN, 3.6), layout="constrained")
    for run in drawn[:OVERLAID]:
        times, util = rates(run.timeline)
        inner = [p for p, m in run.timeline["ports"].items() if "host" not in m["tier"]]
        if inner and times:
            left.plot(times, [sum(util[p][i] for p in inner) / len(inner)
                              for i in range(len(times))], lw=1, label=run.name)
    left.set_xlabel("s since the run began")
    left.set_ylabel("mean utilization, switch-to-switch ports")
    left.set_ylim(0, 1.05)
    left.legend(fontsize=6)
    labels: list[str] = []
    for run in runs[:OVERLAID]:
        for s in job_summaries(run.doc.collectives):
            if (s.label or s.op) not in labels:
                labels.append(s.label or s.op)
    shown = runs[:OVERLAID]
    for i, run in enumerate(shown):  # side by side within each collective's slot
        bw = {s.label or s.op: s.busbw_GBps for s in job_summaries(run.doc.collectives)}
        offset = (i - (len(shown) - 1) / 2) * 0.6 / max(1, len(shown))
        right.plot([labels.index(k) + offset for k in bw], list(bw.values()), "o", ms=6,
                   label=run.name)
    right.set_xticks(range(len(labels)))
    right.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
    right.set_ylabel("busbw, GB/s")
    right.legend(fontsize=6)
    fig.suptitle("the runs overlaid", fontsize=10)
    return png(fig)


def matrix_chart(traffic: dict | None) -> str | None:
    """The traffic matrix (MB from each host to each), in total and, with 2 to 4 jobs, per
    job beside it (``traffic.json``)."""
    if not traffic or not traffic.get("hosts"):
        return None
    hosts = traffic["hosts"]
    panels = [("all jobs", traffic["total"])]
    if 2 <= len(traffic["jobs"]) <= 4:
        panels += [(f"job {j}", rows) for j, rows in traffic["jobs"].items()]
    size = min(WIDTH_IN / len(panels), 6.0)
    fig, axes = plt.subplots(1, len(panels), figsize=(size * len(panels), size),
                             squeeze=False, layout="constrained")
    top = max(max(max(r) for r in rows) for _t, rows in panels) / 1e6 or 1.0
    image = None
    ticks = range(0, len(hosts), max(1, len(hosts) // 16))
    for ax, (title, rows) in zip(axes[0], panels):
        image = ax.imshow([[v / 1e6 for v in r] for r in rows], cmap="viridis", vmin=0,
                          vmax=top, interpolation="nearest")
        ax.set_title(title, fontsize=9)
        ax.set_xticks(list(ticks))
        ax.set_xticklabels([hosts[i] for i in ticks], rotation=90, fontsize=6)
        ax.set_yticks(list(ticks))
        ax.set_yticklabels([hosts[i] for i in ticks], fontsize=6)
        ax.set_xlabel("to", fontsize=8)
    axes[0, 0].set_ylabel("from", fontsize=8)
    fig.colorbar(image, ax=axes[0, :], label="MB", shrink=0.8, pad=0.01)
    return png(fig)
