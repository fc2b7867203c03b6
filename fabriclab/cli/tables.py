"""The CLI's tables (rich): a fabric's summary, a run's collectives, servers of GPUs and
real-equivalent units, variants and sweeps side by side, runs compared. Each builds a table
from documents; none prints."""

from __future__ import annotations

import os

import re

from rich.table import Table

from fabriclab.model import experiment as xp
from fabriclab.model.document import ControllerEvent, Iteration, Prediction, RunDocument
from fabriclab.model.results import VariantRow, gbps_text, job_summaries, us_text
from testbed.model import servers as gpu_servers
from testbed.model.topology import SWITCH_ROLES


def fabric_summary(exp: xp.Experiment, fabric) -> Table:
    topo = exp.topology
    counts = topo.counts()
    table = Table(title=f"fabric {exp.name} ({topo.kind})", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    table.add_row("switches", ", ".join(f"{counts[r]} {r}" for r in SWITCH_ROLES if r in counts))
    table.add_row("hosts", str(counts["hosts"]))
    table.add_row("links", f"{counts['links']} (host {exp.fabric.host_link.describe()}, "
                           f"fabric {exp.fabric.fabric_link.describe()})")
    table.add_row("oversubscription", f"{topo.oversubscription():g}:1")
    if topo.servers:
        table.add_row("servers", gpu_servers.describe(topo))
    table.add_row("queue / MTU", f"{exp.fabric.queue_text()} / {exp.fabric.mtu}")
    kind = fabric.datapath_type or ""  # on a cluster: "ebpf on 2 machines"
    datapath = ("eBPF switches (tc programs and maps)" + kind.removeprefix("ebpf")
                if kind.startswith("ebpf") else f"Open vSwitch {kind}"
                + (f", {fabric.vswitchd_count} private vswitchd" if fabric.vswitchd_count
                   else ""))
    choice = getattr(fabric, "datapath_choice", "")
    table.add_row("datapath", datapath + (f"\n{choice}" if choice.startswith("auto") else ""))
    ctl = exp.controller
    table.add_row("controller", f"os-ken on {fabric.controller_address}, {ctl.routing}"
                  if ctl.own else f"the user's, at {fabric.controller_address}" if ctl.remote
                  else f"os-ken on {fabric.controller_address}, {ctl.kind}")
    if exp.cluster is not None:
        table.add_row("cluster", "\n".join(fabric.plan.describe()))
    if fabric.fidelity is not None:
        v = fabric.fidelity
        table.add_row("fidelity", f"full load {v.load:.0%} of this machine's budget "
                                  f"({'fits' if v.fits else 'OVER the headroom'}; "
                                  f"<= {v.max_rate_mbps:.1f} Mbit/s per host fits)")
    table.add_row("up in", f"{fabric.timings['up_total']:.2f} s")
    table.add_row("first hosts", ", ".join(f"{h.name}={h.ip}" for h in topo.hosts[:3]) + ", ...")
    return table


def variants(name: str, rows: list[VariantRow]) -> Table:
    """Variants side by side: switch queues, then each job's busbw and worst FCT p99."""
    table = Table(title=f"{name}: variants", box=None,
                  caption="pkts/BDP: full frames per bandwidth-delay product (host rate x "
                          "the longest path's unloaded RTT); pauses: PFC pause events "
                          "(paused: their total time, s; over all ports; with CBFC: credit "
                          "stalls, marked c); watchdog: pauses the storm watchdog broke; "
                          "deadlocks: cycles of pauses (or of credit stalls) seen; reord: "
                          "data packets (TCP: segments) received out of order; queue: "
                          "sampled switch backlog, KiB; top util: max/mean "
                          "share of the link rate into the top tier over the run; busbw: "
                          "GB/s; fct: flow completion, s")
    scaled = any(r.time_scale for r in rows)  # time-scaled: the real fabric's units
    queue = "BDP" if scaled else "KiB"
    for col in ("variant", "fidelity", "pkts/BDP", "drops", "ce marks", "pauses", "paused s",
                "watchdog", "deadlocks", "reord", f"queue max {queue}", f"queue p99 {queue}",
                "top util"):
        table.add_column(col, justify="left" if col == "variant" else "right")
    jobs = max((len(r.jobs) for r in rows), default=0)
    for j in range(jobs):
        op = next((r.jobs[j].name for r in rows if len(r.jobs) > j), "?")
        table.add_column(f"j{j} {op} busbw", justify="right")
        table.add_column(f"j{j} fct p50/p99" + (" us" if scaled else ""), justify="right")
    if scaled:
        table.caption += ("; time-scaled (emulator.time_scale): busbw in the real fabric's "
                          "GB/s, fct in its us, queues in its bandwidth-delay products")
    for r in rows:
        kib = lambda v: "-" if v is None else (  # noqa: E731
            f"{v / r.bdp_bytes:.2f}" if scaled and r.bdp_bytes else f"{v / 1024:.0f}")
        count = lambda v: "-" if v is None else str(v)  # noqa: E731
        cells = [(r.variant or "-") + ("" if r.complete else " (failed)"),
                 r.fidelity or "-",
                 f"{r.bdp_packets:g}" if r.bdp_packets is not None else "-",
                 count(r.drops), count(r.ecn_marked),
                 str(r.pfc_pause_events) if r.pfc_pause_events
                 else f"{r.credit_stall_events}c" if r.credit_stall_events else "-",
                 f"{r.pfc_paused_s:.1f}" if r.pfc_paused_s
                 else f"{r.credit_stalled_s:.1f}c" if r.credit_stalled_s else "-",
                 str(r.pfc_watchdog_events) if r.pfc_watchdog_events else "-",
                 str(r.pfc_deadlocks) if r.pfc_deadlocks else "-",
                 "-" if r.reordered is None else f"{r.reordered:.2%}",
                 kib(r.queue_max_bytes), kib(r.queue_p99_bytes), _top_util(r)]
        n = r.time_scale or 1
        for j in range(jobs):
            job = r.jobs[j] if len(r.jobs) > j else None
            fct = (f"{job.fct_p50_s / n * 1e6:,.1f}/{job.fct_p99_s / n * 1e6:,.1f}" if scaled
                   else f"{job.fct_p50_s:.2f}/{job.fct_p99_s:.2f}") if job else "-"
            cells += ([gbps_text(job.busbw_GBps * n), fct] if job else ["-", "-"])
        table.add_row(*cells)
    return table


def transports(name: str, rows: list[VariantRow]) -> Table | None:
    """Variants by what their UDP transports did (None: no variant used one)."""
    if not any(r.transport for r in rows):
        return None
    table = Table(title=f"{name}: transports", box=None,
                  caption="retx: packets resent; RTOs: retransmission timeouts; trims: packets "
                          "the switches trimmed (NACKed: the senders' trim NACKs); stalls: "
                          "credit requests repeated without a grant; lost: UUD packets given "
                          "up; corrupt/LLR: frames hit by bit errors, and replayed by the "
                          "link; bneck q99: the busiest port's queue p99, KiB")
    cols = ("variant", "transport", "retx", "RTOs", "trims", "NACKed", "grants", "stalls",
            "lost", "corrupt", "LLR", "bneck q99")
    for col in cols:
        table.add_column(col, justify="left" if col in cols[:2] else "right")
    for r in rows:
        t = r.transport
        if not t:
            table.add_row(r.variant or "-", "tcp", *["-"] * (len(cols) - 2))
            continue
        num = lambda v: "-" if not v else str(v)  # noqa: E731
        q99 = t.bottleneck_queue_p99_bytes
        table.add_row(r.variant or "-", t.label, num(t.tx_retransmitted), num(t.tx_timeouts),
                      num(t.trimmed), num(t.tx_trim_naks), num(t.tx_grants),
                      num(t.tx_credit_stalls), num(t.rx_lost), num(t.corrupted),
                      num(t.llr_replays), "-" if q99 is None else f"{q99 / 1024:.0f}")
    return table


def efficiency(name: str, rows: list[VariantRow]) -> Table:
    """Variants by job, compact: efficiency (busbw over the link rate: the last flow decides),
    and for patterns of flows their throughput as a fraction of ideal (Hedera's aggregate
    measure: each flow counts for its own share)."""
    table = Table(title=f"{name}: efficiency per job", box=None,
                  caption="eff: busbw / link rate; tput: the flows' aggregate throughput as a "
                          "fraction of ideal (mean of each flow's ideal time over its "
                          "completion time)")
    table.add_column("variant")
    jobs = max((len(r.jobs) for r in rows), default=0)
    for j in range(jobs):
        label = next((r.jobs[j].name for r in rows if len(r.jobs) > j), "?")
        table.add_column(label, justify="right")
    for r in rows:
        cells = [r.variant or "-"]
        for j in range(jobs):
            job = r.jobs[j] if len(r.jobs) > j else None
            if job is None:
                cells.append("-")
                continue
            tput = job.throughput_of_ideal
            cells.append(f"eff {job.efficiency:.2f}"
                         + (f" tput {tput:.2f}" if tput is not None else ""))
        table.add_row(*cells)
    return table


def _top_util(row: VariantRow) -> str:
    """Max/mean utilization of the links into the top tier (agg->core, leaf->spine)."""
    top = row.top_utilization()
    return f"{top.max:.2f}/{top.mean:.2f}" if top else "-"


def real_scale(doc: RunDocument) -> Table:
    """The collectives in the real fabric's units (``scale``), one row per collective run."""
    f = doc.real_scale
    title = (f"{doc.experiment} in the real fabric's units (time scale N = "
             f"{doc.time_scale.n:,.0f}: {f.real_rate_gbps:g} Gbit/s, {f.real_rtt_us:.3g} us "
             "base RTT)" if doc.time_scale else
             f"real-equivalent at {f.real_rate_gbps:g} Gbit/s, {f.real_rtt_us:g} us RTT")
    table = Table(title=title, box=None,
                  caption=f"scales: {f.scales}\ndoes not scale: {f.does_not_scale}")
    for col in ("job", "op", "bytes", "time_us", "algbw GB/s", "busbw GB/s", "fct p50 us",
                "fct p99 us", "emulated s"):
        table.add_column(col, justify="left" if col == "op" else "right")
    for row in doc.collectives:
        real = row.real
        if not real:
            continue
        fct = real.fct_s if real.fct_s.p50 is not None else real.flow_end_s
        table.add_row(str(row.job), row.name, f"{real.bytes:,}", us_text(real.time_us),
                      gbps_text(real.algbw_GBps), gbps_text(real.busbw_GBps),
                      *("-" if q is None else f"{q * 1e6:,.1f}" for q in (fct.p50, fct.p99)),
                      f"{row.time_us / 1e6:.3f}")
    return table


def collectives(doc: RunDocument) -> Table:
    """An nccl-tests-like table: one row per job, times averaged over its repetitions."""
    table = Table(title=f"{doc.experiment}: collectives",
                  caption="as NCCL-tests prints them: bytes: size; count: float32 elements; "
                          "time: us; algbw, busbw: GB/s (10^9 bytes/s); eff: busbw / link rate; "
                          "cpu_s: all agents' CPU seconds; x pred: time over fabriclab "
                          "predict's", box=None)
    summaries = job_summaries(doc.collectives)
    hashed = any(s.hashed_us for s in summaries)
    if hashed:
        table.caption += "; x hashed: over the prediction on the paths the connections took"
    for col in ("op", "algo", "n", "bytes", "count", "reps", "time_us", "algbw", "busbw",
                "eff", "x pred", *(("x hashed",) if hashed else ()), "cpu_s"):
        table.add_column(col, justify="left" if col in ("op", "algo") else "right",
                         no_wrap=True)
    constants = sorted({c.transport.constants for c in doc.collectives
                        if c.transport and c.transport.constants})
    if constants:  # the transports' constants at the emulated scale
        table.caption += "".join(f"\n{text}" for text in constants)
    for s in summaries:
        table.add_row(s.label or s.op, s.algorithm, str(s.ranks), str(s.bytes), str(s.count),
                      str(s.repetitions), us_text(s.mean_us), gbps_text(s.algbw_GBps),
                      gbps_text(s.busbw_GBps), f"{s.efficiency:.3f}",
                      "-" if s.of_predicted is None else f"{s.of_predicted:.2f}",
                      *(("-" if s.of_hashed is None else f"{s.of_hashed:.2f}",)
                        if hashed else ()),
                      f"{s.agent_cpu_s:.1f}")
    return table


def iteration_text(item: Iteration, prediction: Prediction | None) -> str:
    """One training iteration: its time, compute, exposed communication and the share
    hidden, and the prediction's time."""
    text = f"training job {item.job} iteration {item.iteration}: {item.time_s:.2f} s"
    if item.compute_s is not None:
        text += (f" (compute {item.compute_s:.2f} s, exposed communication "
                 f"{item.exposed_comm_s or 0:.2f} s of {item.comm_s or 0:.2f} s, "
                 f"{100 * (item.overlap_fraction or 0):.0f} % hidden)")
    predicted = [p for p in (prediction.iterations or () if prediction else ())
                 if p.job == item.job and p.iteration == item.iteration]
    if predicted:
        text += f"; predicted {predicted[0].predicted_s:.2f} s"
    return text


def program(doc: RunDocument, out: str = "") -> Table:
    """The user's program: each rank's host, exit code and time (ranks that ended alike are
    one line); ``out``: where its output is (default: the run directory)."""
    run = doc.program
    where = f"{out}/" if out else ""
    table = Table(title=f"{doc.experiment}: program, {run.world_size} rank(s), "
                        f"{run.time_s:.2f} s", box=None,
                  caption=f"{' '.join(run.argv)}\noutput: {where}ranks/RANK.out, "
                          f"{where}ranks/RANK.err")
    for col in ("ranks", "hosts", "exit", "time s", "ended"):
        table.add_column(col, justify="right" if col in ("exit", "time s") else "left")
    groups: list[list] = []
    for r in run.ranks:
        key = (r.exit_code, r.ended)
        if groups and groups[-1][0] == key:
            groups[-1][1].append(r)
        else:
            groups.append([key, [r]])
    for (code, ended), ranks in groups:
        first, last = ranks[0], ranks[-1]
        times = [r.time_s for r in ranks if r.time_s is not None]
        table.add_row(str(first.rank) if first is last else f"{first.rank}-{last.rank}",
                      first.host if first is last else f"{first.host}..{last.host}",
                      "-" if code is None else str(code),
                      f"{max(times):.2f}" if times else "-", ended)
    return table


def named_jobs(doc: RunDocument) -> Table:
    """Several jobs at once: each one's time with the others and alone, and the slowdown,
    measured and predicted."""
    table = Table(title=f"{doc.experiment}: jobs", box=None,
                  caption="together: with the other jobs; alone: the same job on the same "
                          "fabric by itself; shared: links (as routed) that carried another "
                          "job's bytes too")
    for col in ("job", "hosts", "together s", "alone s", "slowdown", "predicted", "shared"):
        table.add_column(col, justify="left" if col in ("job", "hosts") else "right")
    for j in doc.jobs or ():
        num = lambda v, f="{:.2f}": "-" if v is None else f.format(v)  # noqa: E731
        hosts = j.hosts
        table.add_row(j.name, f"{hosts[0]}..{hosts[-1]} ({len(hosts)})" if hosts else "-",
                      num(j.time_s), num(j.alone_s), num(j.slowdown, "{:.3f}"),
                      num(j.predicted_slowdown, "{:.3f}"), str(len(j.shared_links)))
    return table


def servers_of_gpus(doc: RunDocument) -> Table | None:
    """Servers of GPUs: per collective (a training phase summed over its runs) its time, the
    time its byte counts predict on the fabric, and the bytes that crossed the scale-out
    network against all it moved."""
    phases: dict[str, dict] = {}
    for row in doc.collectives:
        if row.scale_out_bytes is None:
            continue
        label = row.name
        if row.iteration is not None:  # "iter 0 mb 1 fwd stage 0 tp all_reduce"
            label = re.sub(r"\b(iter|mb|stage) \d+ ?", "", label).strip()  # "fwd tp ..."
        p = phases.setdefault(label, {"runs": 0, "time_s": 0.0, "ideal_s": 0.0,
                                      "scale_out": 0, "moved": 0, "algo": row.algorithm})
        p["runs"] += 1
        p["time_s"] += row.time_us / 1e6
        p["ideal_s"] += row.ideal_s
        p["scale_out"] += row.scale_out_bytes
        p["moved"] += row.moved_bytes or 0
    if not phases:
        return None
    table = Table(title=f"{doc.experiment}: servers of GPUs", box=None,
                  caption="ideal: what the schedule's byte counts predict at line rate, link by "
                          "link on this fabric (scale-up and scale-out); scale-out: bytes "
                          "between servers, of all bytes moved")
    for col in ("collective", "algo", "runs", "time_ms", "ideal_ms", "of ideal",
                "scale-out MiB", "moved MiB", "share"):
        table.add_column(col, justify="left" if col in ("collective", "algo") else "right")
    for label, p in phases.items():
        table.add_row(label, p["algo"], str(p["runs"]), f"{p['time_s'] * 1e3:.0f}",
                      f"{p['ideal_s'] * 1e3:.0f}", f"{p['ideal_s'] / p['time_s']:.2f}",
                      f"{p['scale_out'] / 2**20:.1f}", f"{p['moved'] / 2**20:.1f}",
                      f"{p['scale_out'] / p['moved']:.2f}" if p["moved"] else "-")
    return table


def sweep(name: str, summary: list[dict]) -> Table:
    """Per cell: its values, runs and failures, and each job's efficiency as mean +- sd."""
    table = Table(title=f"{name}: sweep", box=None, header_style="bold")
    table.add_column("cell")
    table.add_column("runs", justify="right")
    table.add_column("failed", justify="right")
    labels = []
    for line in summary:
        for job in line["jobs"]:
            if job["label"] not in labels:
                labels.append(job["label"])
    for label in labels:
        table.add_column(f"{label} eff", justify="right")
    for line in summary:
        by_label = {j["label"]: j["efficiency"] for j in line["jobs"]}
        cells = []
        for label in labels:
            e = by_label.get(label) or {}
            cells.append("-" if e.get("mean") is None else
                         f"{e['mean']:.3f}" + (f" ±{e['sd']:.3f}" if e["n"] > 1 else ""))
        table.add_row(line["cell"], str(line["runs"]), str(line["failed"]), *cells)
    table.caption = "eff: busbw / link rate, mean ± standard deviation over the complete runs"
    return table


def compare(lines: list[dict]) -> list[Table]:
    """Runs side by side (:func:`fabriclab.frames.compare_rows`), one table per job: each run's
    efficiency, time, FCT p50/p99 and slowdown p99, each with its change against the baseline
    run."""
    labels = list(dict.fromkeys(j["label"] for line in lines for j in line["jobs"]))
    shown = (("efficiency", "eff", "{:.3f}"), ("time_us", "time us", "{:,.0f}"),
             ("fct_p50_s", "fct p50 s", "{:.4g}"), ("fct_p99_s", "fct p99 s", "{:.4g}"),
             ("slowdown_p99", "slowdown p99", "{:.2f}"))
    common = os.path.commonpath([line["run"] for line in lines]) if len(lines) > 1 else ""
    tables = []
    for label in labels or [""]:
        table = Table(title=f"runs compared: {label}" if label else "runs compared", box=None,
                      header_style="bold")
        table.add_column(f"run (in {common})" if common else "run", no_wrap=True)
        table.add_column("status")
        table.add_column("n", justify="right")
        for _key, name, _fmt in shown:
            table.add_column(name, justify="right")
        for line in lines:
            job = next((j for j in line["jobs"] if j["label"] == label), {})
            name = os.path.relpath(line["run"], common) if common else line["run"]
            table.add_row(name, "ok" if line["complete"] else "failed", str(job.get("n", "-")),
                          *(_compared(job, key, fmt) for key, _name, fmt in shown))
        tables.append(table)
    tables[-1].caption = ("eff: busbw / link rate; fct: each transfer's completion time; "
                          "times in the real fabric's units (a time-scaled run's divided by "
                          "its N); "
                          "slowdown: FCT over alone on the idle fabric; (+x%): against the "
                          "first run (or --baseline); n: collectives (a sweep cell's over its "
                          "repetitions)")
    return tables


def _compared(job: dict, key: str, fmt: str) -> str:
    value, delta = job.get(key), job.get(f"delta_{key}")
    if value is None:
        return "-"
    text = fmt.format(value)
    return text + (f" ({delta:+.1%})" if delta else "")


def provenance_diff(lines: list[dict]) -> Table | None:
    """What differs between the compared runs' provenance (seed, datapath, congestion
    control, sysctls, qdiscs, software); None when nothing does."""
    keys = list(dict.fromkeys(k for line in lines for k in line.get("provenance_differs", {})))
    if not keys:
        return None
    table = Table(title="provenance that differs", box=None, header_style="bold")
    table.add_column("field")
    for line in lines:
        table.add_column(line["run"])
    for k in keys:
        table.add_row(k, *(str(line["provenance_differs"].get(k, "-")) for line in lines))
    return table


def controller_event(event: ControllerEvent) -> str:
    """One line of a controller's life during a run (results.json's ``controller.events``)."""
    what = event.event
    if what == "died":
        return f"controller: {event.cause or 'died'} (pid {event.pid})"
    if what == "restarted":
        changes = event.changes or {}
        changed = ", ".join(f"{n} {k}" for k, n in sorted(changes.items())) or "nothing changed"
        return (f"controller: restarted warm in {event.outage_s or 0:.2f} s of lost "
                f"control; {event.flows_read or 0} flows and {event.groups_read or 0} "
                f"groups read back from {event.switches_read or 0} switches, {changed}")
    return f"controller: {what}: {event.cause or ''}"
