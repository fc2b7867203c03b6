"""The ``fabriclab`` command: validate, up (with --check), run, clean, schema.

Every command that reports something takes ``--json``: stdout then carries exactly one JSON
document (what benchmarks and tests read) and the human output goes to stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import signal
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

from rich.console import Console
from rich.table import Table

from fabriclab.model import experiment as xp
from fabriclab import telemetry_cli
from fabriclab.model.results import job_summaries, variant_row
from fabriclab.run import RunView, SharedFabric, batch_text, run_experiment
from testbed.runs import cleanup
from testbed.model import servers
from testbed.errors import ConfigError, TestbedError
from testbed.plan.fidelity import assess, machine_budget_mbit_hops
from testbed.model.partition import Machine, partition
from testbed.runs.registry import DEFAULT_STATE_DIR, Registry
from testbed.model.spec import Backend
from testbed.model.topology import SWITCH_ROLES

EXIT_OK, EXIT_UNREACHABLE, EXIT_CONFIG, EXIT_SYSTEM, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class Terminated(Exception):
    """SIGTERM arrived: unwind through every ``finally`` so the fabric is torn down."""


def _on_sigterm(signum, _frame) -> None:
    raise Terminated(f"signal {signum}")


def _console(to_stderr: bool) -> Console:
    console = Console(stderr=to_stderr, highlight=False, soft_wrap=True)  # logs stay grep-able
    if not console.is_terminal:
        console.width = max(console.width, 120)  # tables in logs and CI output stay whole
    return console


def _emit(doc: object) -> None:
    """The one JSON document of a ``--json`` command, on stdout."""
    sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    sys.stdout.flush()


def _summary_table(exp: xp.Experiment, fabric) -> Table:
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
        table.add_row("servers", servers.describe(topo))
    table.add_row("queue / MTU", f"{exp.fabric.queue_text()} / {exp.fabric.mtu}")
    table.add_row("datapath", f"Open vSwitch {fabric.datapath_type}"
                              + (f", {fabric.vswitchd_count} private vswitchd"
                                 if fabric.vswitchd_count else ""))
    table.add_row("controller", f"os-ken on {fabric.controller_address}, "
                                f"{exp.controller.routing}")
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


def _fabric_doc(exp: xp.Experiment, fabric) -> dict:
    """A running fabric, for ``--json``."""
    return {"experiment": exp.name, "source": exp.source, "backend": "host",
            "datapath": fabric.datapath_type, "vswitchd_instances": fabric.vswitchd_count,
            "controller": fabric.controller_address, "run_dir": str(fabric.run_dir),
            "fabric": exp.fabric_summary(), "counts": exp.topology.counts(),
            "warnings": list(fabric.warnings), "timings_s": dict(fabric.timings)}


def cmd_validate(args) -> int:
    docs, failed = [], 0
    for path in args.files:
        try:
            exp = xp.load(path)
        except ConfigError as err:
            failed += 1
            args.console.print(f"[red]{path}: config error:[/red] {err}")
            docs.append({"file": path, "ok": False, "field": err.path, "error": err.message})
            continue
        counts = exp.topology.counts()
        verdict = assess(exp.topology, exp.fabric.mtu)
        args.console.print(f"{path}: ok ({exp.topology.kind}, {counts['switches']} switches, "
                           f"{counts['hosts']} hosts, {counts['links']} links)")
        args.console.print(f"  on the userspace datapath: {verdict.explain()}"
                           + ("" if verdict.fits else " -- over the headroom"))
        if exp.topology.servers:
            args.console.print(f"  servers: {servers.describe(exp.topology)}")
        plan = None
        count = getattr(args, "machines", 0) or (exp.cluster.machines if exp.cluster else 0)
        if exp.cluster is not None:
            args.console.print(f"  on the Ray cluster at {exp.cluster.address}"
                               + ("" if count else " (--machines N shows a plan over N "
                                                   "machines like this one)"))
        if count:
            budget = machine_budget_mbit_hops(exp.fabric.mtu, os.cpu_count() or 1)
            try:
                plan = partition(exp.topology, [Machine(f"machine{i + 1}", budget)
                                                for i in range(count)])
            except ConfigError as err:
                failed += 1
                args.console.print(f"[red]{path}: over {count} machines:[/red] {err}")
            else:
                args.console.print(f"  over {count} machines like this one:")
                for line in plan.describe():
                    args.console.print(f"    {line}")
        ecn = _ecn_text(exp)
        for tier, text in ecn.items():
            args.console.print(f"  ECN at the switch ports of {tier} links: {text}")
        pfc = exp.pfc.describe() if exp.pfc is not None else None
        if pfc:
            args.console.print(f"  PFC (lossless) {pfc}")
        if exp.variants:
            args.console.print(f"  variants: {', '.join(v.variant for v in exp.variants)}")
        if exp.cells:
            groups = list(dict.fromkeys(c.plan.group for c in exp.cells))
            reps = len(exp.cells) // len(groups)
            args.console.print(f"  sweep: {len(exp.cells)} runs: {len(groups)} cells x {reps} "
                               f"repetition(s): {', '.join(groups[:6])}"
                               + (f", ... {groups[-1]}" if len(groups) > 6 else ""))
        docs.append({"file": path, "ok": True, "experiment": exp.name, "counts": counts,
                     "collectives": exp.workload.collective_count if exp.workload else 0,
                     "fidelity": {"load": verdict.load, "fits": verdict.fits,
                                  "max_rate_mbps": verdict.max_rate_mbps},
                     "ecn": ecn, "pfc": pfc, "base_rtt_s": exp.base_rtt_s,
                     "variants": [v.variant for v in exp.variants],
                     "sweep": [c.name for c in exp.cells],
                     **({"partition": {"machines": {m.name: {"nodes": plan.nodes(m.name),
                                                             "load_mbit_hops": plan.load[m.name],
                                                             "budget_mbit_hops":
                                                                 m.budget_mbit_hops}
                                                    for m in plan.machines},
                                       "cut_links": [l.name for l in plan.cut]}}
                        if plan is not None else {})})
    if args.json:
        _emit(docs)
    return EXIT_CONFIG if failed else EXIT_OK


def _ecn_text(exp: xp.Experiment) -> dict[str, str]:
    """Per link tier, the marking of each priority (``0-7: step K=26.4 KiB``), when any."""
    out = {}
    for tier in ("host", "fabric"):
        table = exp.port_ecn(tier)
        if all(t.mode == "off" for t in table):
            continue
        groups: dict[str, list[int]] = {}
        for prio, th in enumerate(table):
            groups.setdefault(th.describe(), []).append(prio)
        out[tier] = "; ".join(f"priority {','.join(map(str, p)) if len(p) < 8 else '0-7'}: {d}"
                              for d, p in groups.items())
    return out


def resolve_backend(exp: xp.Experiment, requested: str | None, state_dir: Path) -> Backend:
    """``host`` or ``vm``: the flag, else the experiment's choice; ``auto`` picks the host when
    its kernel has everything the experiment needs (qdiscs, TCP congestion controls)."""
    choice = Backend(requested or exp.emulator.backend)
    if choice != Backend.AUTO:
        return choice
    from testbed.linux import capabilities  # probes the kernel (root)

    caps = capabilities.probe(state_dir)
    missing = [need for need in exp.requirements() if not caps.has(need)]
    return Backend.VM if missing else Backend.HOST


def cmd_up(args) -> int:
    from fabriclab.run import make_fabric  # system adapters only when a fabric is built

    ui = args.console
    exp = xp.load(args.file, cluster=args.cluster)
    if resolve_backend(exp, args.backend, args.state_dir) == Backend.VM:
        return _up_in_vm(args, exp)
    start = time.monotonic()
    fabric = make_fabric(exp, args.state_dir,
                         log=(lambda m: ui.print(f"[dim]{m}[/dim]")) if args.verbose else
                         (lambda _m: None))
    doc: dict = {}
    code = EXIT_OK
    with ExitStack() as stack:
        # registered first, so it runs after the fabric's teardown: the teardown's time
        stack.callback(lambda: ui.print(f"torn down in {fabric.timings.get('down_total', 0):.2f}"
                                        " s") if "down_total" in fabric.timings else None)
        with ui.status("building the fabric ..."):
            stack.enter_context(fabric)
        ui.print(_summary_table(exp, fabric))
        for warning in fabric.warnings:
            ui.print(f"[yellow]warning:[/yellow] {warning}")
        doc = _fabric_doc(exp, fabric)
        opts = telemetry_cli.options(args, ui)
        where = None
        if opts.prometheus:
            where = args.out or Path("runs") / time.strftime("up-%Y%m%d-%H%M%S")
        from telemetry.exporter import RunTelemetry

        tele = stack.enter_context(RunTelemetry(  # the exporters always (fabriclab top)
            fabric, where / "prometheus" if where else None, opts.interval_s,
            {"experiment": exp.name}, str(exp.controller.routing),
            (opts.exporter_host, opts.exporter_port)))
        if opts.prometheus:
            doc["telemetry"] = tele.report()
            ui.print(f"telemetry: Prometheus at {tele.prometheus.url}, data in {where}")
        if not args.check:
            if args.json:
                _emit({**doc, "state": "up"})
            ui.print("fabric is up; Ctrl-C (or SIGTERM) tears it down")
            while True:
                time.sleep(3600)
        result = fabric.reachability(count=args.count)
        reach_s = time.monotonic() - start
        ui.print(result.summary())
        ui.print(f"all pairs reachable {reach_s:.2f} s after start" if result.complete else
                 "unreachable: " + ", ".join(f"{s}->{d}" for s, d in result.failed[:20]))
        doc["reachability"] = {**result.to_dict(), "reachable_s": reach_s if result.complete
                               else None}
        code = EXIT_OK if result.complete else EXIT_UNREACHABLE
        ui.print("tearing down ...")
    doc["timings_s"] = dict(fabric.timings)
    if args.json:
        _emit(doc)
    return code


def _up_in_vm(args, exp: xp.Experiment) -> int:
    """Run ``up --check`` inside the full-kernel guest and relay its output and exit code."""
    if not args.check:
        raise ConfigError("emulator.backend", "the vm backend runs a job and powers off: use "
                          "'fabriclab up --check' (an interactive guest is the lab VM's job)")
    return _in_vm(args, exp, f"up --check --backend host --count {int(args.count)} "
                        f"{'-v ' if args.verbose else ''}/job/experiment.yaml")


def _in_vm(args, exp: xp.Experiment, cli_args: str, results_to: Path | None = None) -> int:
    """Run ``fabriclab CLI_ARGS`` inside the full-kernel guest, relay its output and exit code,
    and copy what it wrote under ``$FABRICLAB_OUT/results`` to ``results_to``. With ``--json``
    the guest's JSON document (written to ``$FABRICLAB_OUT/cli.json``) is printed, with the
    guest run's figures under ``vm``."""
    from testbed.vm import guest as vm

    ui = args.console
    files = {"experiment.yaml": Path(args.file)}
    job = ""
    if any(e.fabric.needs_marker for e in (exp, *exp.variants)):
        # the guest has no compiler: the marker is built here and carried in with the job
        from testbed.linux import bpf
        from testbed.fabric.ecn import OBJECT

        obj = bpf.build(OBJECT, args.state_dir)
        files[f"bpf/{obj.parent.name}/{obj.name}"] = obj
        job += "mkdir -p /run/fabriclab && cp -r /job/bpf /run/fabriclab/\n"
    job += f"python3 -m fabriclab.cli {cli_args}"
    job += ' --json > "$FABRICLAB_OUT/cli.json"\n' if args.json else "\n"
    with ui.status("preparing the guest image ..."):
        image = vm.ensure_image(log=ui.print)
    work = args.state_dir / "vm" / time.strftime("%Y%m%d-%H%M%S")
    ui.print(f"booting the full-kernel guest ({image.directory.name}); this machine "
             "emulates its CPU, so expect minutes")
    result = vm.run(image, job, files, work,
                    Registry(args.state_dir), accel=getattr(args, "vm_accel", "tcg"),
                    on_console=(lambda line: ui.print(f"[dim]guest| {line}[/dim]"))
                    if getattr(args, "verbose", False) else None)
    if not getattr(args, "verbose", False):
        ui.print(result.output.rstrip())
    if results_to is not None and (result.out_dir / "results").is_dir():
        shutil.copytree(result.out_dir / "results", results_to, dirs_exist_ok=True)
        ui.print(f"results copied to {results_to}")
    ui.print(f"guest run: exit {result.returncode} after {result.duration_s:.0f} s; "
             f"console log {result.console}")
    if args.json:
        try:
            doc = json.loads((result.out_dir / "cli.json").read_text())
        except (OSError, ValueError) as err:
            raise TestbedError(f"the guest wrote no JSON document ({err})",
                               stderr=result.output[-2000:]) from None
        if isinstance(doc, dict):
            doc["backend"] = "vm"
            doc["vm"] = {"exit": result.returncode, "duration_s": result.duration_s,
                         "console": str(result.console)}
        _emit(doc)
    return result.returncode


class _TerminalView(RunView):
    """Progress of ``fabriclab run`` on the terminal."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.stack = ExitStack()
        self.bar = None
        self.task = None

    def building(self, reused: bool = False) -> None:
        self.status = self.stack.enter_context(self.console.status(
            "the previous run's fabric: restarting the controller ..." if reused
            else "building the fabric ..."))

    def started(self, fabric, total: int) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.stack.close()  # the spinner
        for line in fabric.plan.describe() if fabric.plan is not None else []:
            self.console.print(f"cluster: {line}")
        for warning in fabric.warnings:
            self.console.print(f"[yellow]warning:[/yellow] {warning}")
        self.bar = self.stack.enter_context(Progress(
            TextColumn("{task.description}"), BarColumn(), TextColumn(
                "{task.completed}/{task.total}"), TimeElapsedColumn(), console=self.console))
        self.task = self.bar.add_task("collectives", total=total)

    def telemetry(self, telemetry) -> None:
        self.console.print(f"telemetry: Prometheus at {telemetry.prometheus.url}, scraping "
                           f"{', '.join(t for ts in telemetry.targets.values() for t in ts)} "
                           f"every {telemetry.interval_s:g} s into {telemetry.directory}")

    def batch(self, jobs) -> None:
        self.bar.update(self.task, description=batch_text(jobs))

    def measured(self, count: int) -> None:
        self.bar.advance(self.task, count)

    def tearing_down(self) -> None:
        self.stack.close()
        self.console.print("tearing down ...")


def cmd_run(args) -> int:
    """Build the fabric, run the workload, write DIR/results.json, tear down."""
    exp = xp.load(args.file, cluster=args.cluster)
    if exp.workload is None:
        raise ConfigError("workload", "'fabriclab run' needs a workload section with collectives")
    out = Path(args.out)
    if args.parallel and not exp.cells:
        raise ConfigError("--parallel", "runs a sweep's cells at once, one per machine of a "
                                        "cluster; this experiment has no sweep section")
    _check_out_dir(out, args.resume, args.force)
    if exp.cells:
        if resolve_backend(exp, args.backend, args.state_dir) == Backend.VM:
            raise ConfigError("sweep", "sweeps run on this host (--backend host); the vm "
                                       "backend runs single experiments")
        return _run_sweep(args, exp, out)
    if resolve_backend(exp, args.backend, args.state_dir) == Backend.VM:
        return _in_vm(args, exp, "run --backend host /job/experiment.yaml "
                            "--out \"$FABRICLAB_OUT/results\"", out)
    if not exp.variants:
        if args.resume and _complete(out / "results.json"):
            args.console.print(f"{out / 'results.json'} is complete: nothing to resume")
            doc = json.loads((out / "results.json").read_text())
        else:
            doc = _run_one(args, exp, out)
        _report(args, out)
        if args.json:
            _emit(doc)
        return EXIT_OK
    rows, failed = [], 0
    todo = [v for v in exp.variants
            if not (args.resume and _complete(out / v.variant / "results.json"))]
    shared = SharedFabric(args.state_dir)  # variants that build the same fabric share it
    try:
        for variant in exp.variants:  # a failing one does not stop the rest
            args.console.rule(f"variant {variant.variant}")
            names = [v.variant for v in todo]
            if variant.variant not in names:
                args.console.print("complete: kept")
            else:
                i = names.index(variant.variant)
                then = todo[i + 1] if i + 1 < len(todo) else None
                try:
                    _run_one(args, variant, out / variant.variant, variant.variant, shared,
                             then)
                except (ConfigError, TestbedError) as err:
                    failed += 1
                    args.console.print(f"[red]variant {variant.variant} failed:[/red] {err}")
            rows.append(variant_row(json.loads(
                (out / variant.variant / "results.json").read_text())))
    finally:
        shared.close()
    (out / "variants.json").write_text(json.dumps(rows, indent=1))
    args.console.print(_variants_table(exp.name, rows))
    args.console.print(_efficiency_table(exp.name, rows))
    _report(args, out)
    args.console.print(f"results: {out}/<variant>/results.json; side by side: "
                       f"{out / 'variants.json'}")
    if args.json:
        _emit(rows)
    return EXIT_SYSTEM if failed else EXIT_OK


PREVIOUS_RUN = ("results.json", "variants.json", "sweep.json")


def _report(args, out: Path) -> None:
    """Write ``out/report.html``; a failure to draw says so and leaves the results as they
    are."""
    from fabriclab.report import write_report

    try:
        args.console.print(f"report: {write_report(out)}")
    except Exception as err:  # noqa: BLE001 - the results stand without their report
        args.console.print(f"[yellow]report not written:[/yellow] {type(err).__name__}: {err} "
                           f"(the results are in {out}; fabriclab report {out} tries again)")


def cmd_report(args) -> int:
    """(Re)build DIR/report.html from a run, variants or sweep directory."""
    from fabriclab.report import write_report

    out = Path(args.dir)
    _require_run(out)
    path = write_report(out)
    args.console.print(f"report: {path}")
    if args.json:
        _emit({"report": str(path)})
    return EXIT_OK


def _require_run(out: Path) -> None:
    if not any((out / name).is_file() for name in PREVIOUS_RUN):
        raise ConfigError(str(out), "holds no run (results.json, variants.json or sweep.json)")


def _check_out_dir(out: Path, resume: bool, force: bool) -> None:
    """An output directory holding an earlier run is refused unless the run resumes it or
    is forced to overwrite it."""
    if resume and force:
        raise ConfigError("--resume", "give --resume or --force, not both")
    earlier = [name for name in PREVIOUS_RUN if (out / name).exists()]
    if earlier and not (resume or force):
        raise ConfigError("--out", f"{out} already holds a run ({', '.join(earlier)}); "
                                   "--resume finishes it, --force overwrites it")


def _complete(path: Path) -> bool:
    try:
        return bool(json.loads(path.read_text()).get("complete"))
    except (OSError, ValueError, AttributeError):
        return False


def _run_sweep(args, exp: xp.Experiment, out: Path) -> int:
    """Every cell of the sweep in order; a failed cell is recorded with its error and the
    sweep goes on; ``--resume`` keeps the cells already complete. Consecutive cells that build
    the same fabric share it (:class:`fabriclab.run.SharedFabric`: a new controller each).
    ``DIR/sweep.json`` (rewritten after every cell) holds every cell's values, status and row,
    and the summary over repetitions."""
    from fabriclab.model import sweep as sw
    from testbed.linux.files import write_json_atomic

    cells = list(exp.cells)
    finished = {c.name for c in cells if args.resume and _complete(out / c.name / "results.json")}
    todo = sw.pending(cells, finished)
    ui = args.console
    ui.print(f"sweep: {len(cells)} cells ({len(finished)} complete already), "
             f"{len(todo)} to run into {out}")
    out.mkdir(parents=True, exist_ok=True)
    records: dict[str, dict] = {}
    began, durations = time.monotonic(), []

    def record(cell, doc: dict | None, error: str | None) -> None:
        row = variant_row(doc) if doc else None
        records[cell.name] = {"cell": cell.plan.group, "name": cell.name,
                              "variant": cell.plan.variant, "values": cell.plan.values,
                              "repetition": cell.plan.repetition,
                              "complete": bool(doc and doc.get("complete")),
                              "error": error or (doc or {}).get("error"),
                              "jobs": row["jobs"] if row else [], "row": row,
                              "timings_s": (doc or {}).get("timings_s", {}),
                              "fabric_reused": bool((doc or {}).get("fabric_reused"))}

    def save() -> None:
        rows = [records[c.name] for c in cells if c.name in records]
        write_json_atomic(out / "sweep.json", {
            "experiment": exp.name, "source": exp.source, "cells": rows,
            "summary": sw.summarize(rows), "wall_s": round(time.monotonic() - began, 1),
            "timings_s": sw.total_timings(rows)})

    for cell in cells:
        if cell.name in finished:
            record(cell, json.loads((out / cell.name / "results.json").read_text()), None)
    shared = SharedFabric(args.state_dir)
    try:
        if getattr(args, "parallel", False):
            machines = _run_cells_on_machines(args, exp, todo, out, record, save)
            builds = f"{len(todo)} cell(s) on {machines} machine(s) at once"
            todo = []
        for n, cell in enumerate(todo, start=1):
            eta = ""
            if durations:
                left = sum(durations) / len(durations) * (len(todo) - n + 1)
                eta = f", about {time.strftime('%H:%M:%S', time.gmtime(left))} left"
            ui.rule(f"cell {len(finished) + n}/{len(cells)}: {cell.name}{eta}")
            start = time.monotonic()
            doc, error = None, None
            then = todo[n].experiment if n < len(todo) else None
            try:
                doc = _run_one(args, cell.experiment, out / cell.name, cell.plan.variant,
                               shared, then)
            except (ConfigError, TestbedError) as err:
                error = str(err)
                ui.print(f"[red]cell {cell.name} failed:[/red] {err}")
                try:
                    doc = json.loads((out / cell.name / "results.json").read_text())
                except (OSError, ValueError):
                    doc = None
            durations.append(time.monotonic() - start)
            record(cell, doc, error)
            save()
    finally:
        shared.close()
    save()
    rows = [records[c.name] for c in cells]
    ui.print(_sweep_table(exp.name, sw.summarize(rows)))
    phases = sw.total_timings(rows)
    ui.print(f"wall time {time.monotonic() - began:.0f} s; over the cells: "
             + ", ".join(f"{k.replace('_', '-')} {v:.0f} s" for k, v in phases.items())
             + "; " + (builds if getattr(args, "parallel", False)
                       else f"{shared.builds} fabric build(s) for {len(todo)} cell(s)"))
    ui.print(f"results: {out}/<cell>/results.json; all cells: {out / 'sweep.json'}")
    _report(args, out)
    if args.json:
        _emit(json.loads((out / "sweep.json").read_text()))
    return EXIT_SYSTEM if any(records[c.name]["error"] for c in todo) else EXIT_OK


def _sweep_table(name: str, summary: list[dict]) -> Table:
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


def _run_cells_on_machines(args, exp: xp.Experiment, todo: list, out: Path, record,
                           save) -> int:
    """``--parallel``: the cells at once, one per machine of the cluster, each built whole on
    its machine by that machine's actor (:meth:`testbed.cluster.machines.MachineAgent.run_cell`); its
    run directory comes back into ``out/<cell>``. A failed cell is recorded and the rest go
    on; a machine that dies fails its cell, and the others take the cells left."""
    import queue

    from testbed.cluster.machines import Cluster
    from testbed.linux.files import write_json_atomic

    if exp.cluster is None:
        raise ConfigError("--parallel", "runs a sweep's cells on the machines of a cluster: "
                                        "give --cluster ADDRESS or the cluster section")
    cluster = Cluster(exp.cluster.address)
    ui, lock = args.console, threading.Lock()
    cells: queue.Queue = queue.Queue()
    for cell in todo:
        cells.put(cell)
    done = []

    def machine_loop(name: str) -> None:
        while True:
            try:
                cell = cells.get_nowait()
            except queue.Empty:
                return
            ui.print(f"cell {cell.name}: on {name}")
            alone = dataclasses.replace(cell.experiment, cluster=None)
            error, lost = None, False
            try:
                agent = cluster.agents[name]
                got = cluster.ray.get(agent.run_cell.remote(run_experiment, alone, cell.name))
                error = got["error"]
                for rel, data in got["files"].items():
                    path = out / cell.name / rel
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(data)
            except Exception as err:  # noqa: BLE001 - the machine died: its cell failed
                error, lost = f"machine {name}: {type(err).__name__}: {err}"[:2000], True
            try:  # the document says where it ran
                doc = json.loads((out / cell.name / "results.json").read_text())
                doc["machine"] = name
                write_json_atomic(out / cell.name / "results.json", doc)
            except (OSError, ValueError):
                doc = None
            with lock:
                if error:
                    ui.print(f"[red]cell {cell.name} failed on {name}:[/red] {error}")
                record(cell, doc, error)
                done.append(cell.name)
                save()
                ui.print(f"{len(done)}/{len(todo)} cells done")
            if lost:
                return

    try:
        threads = [threading.Thread(target=machine_loop, args=(n,), name=f"cells-{n}")
                   for n in sorted(cluster.machines)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        cluster.close()
    left = [c for c in todo if c.name not in done]
    for cell in left:  # every machine died
        record(cell, None, "no machine of the cluster was left to run it")
    save()
    return len(threads)


def _run_one(args, exp: xp.Experiment, out: Path, variant: str | None = None,
             shared: SharedFabric | None = None, then: xp.Experiment | None = None) -> dict:
    view = _TerminalView(args.console)
    try:
        doc = run_experiment(exp, out, args.state_dir, view,
                             telemetry_cli.options(args, args.console, variant), shared, then)
    finally:
        view.stack.close()
    for item in doc.get("iterations", []):
        args.console.print(f"training iteration {item['iteration']}: {item['time_s']:.2f} s")
    args.console.print(_results_table(doc))
    gpus_table = _servers_table(doc)
    if gpus_table is not None:
        args.console.print(gpus_table)
    if doc.get("real_scale"):
        args.console.print(_real_table(doc))
    fidelity = doc.get("fidelity") or {}
    if fidelity:
        idle = fidelity.get("idle_pct", {}).get("median")
        args.console.print(f"fidelity: {fidelity['verdict']}"
                           + (f" (machine {idle:.0f} % idle)" if idle is not None else "")
                           + "".join(f"\n  {reason}" for reason in fidelity["reasons"]))
    timings = doc.get("timings_s") or {}
    if timings:
        args.console.print("time: " + ", ".join(f"{k.replace('_', '-')} {v:.1f} s"
                                                for k, v in timings.items()))
    args.console.print(f"results: {out / 'results.json'}")
    if doc.get("telemetry", {}).get("data"):
        args.console.print(f"telemetry: {doc['telemetry']['data']} (served during the run at "
                           f"{doc['telemetry']['prometheus']}; again: fabriclab telemetry {out})")
    return doc


def _variants_table(name: str, rows: list[dict]) -> Table:
    """Variants side by side: switch queues, then each job's busbw and worst FCT p99."""
    table = Table(title=f"{name}: variants", box=None,
                  caption="pauses: PFC pause events (paused: their total time, s; over all "
                          "ports); watchdog: pauses the storm watchdog broke; deadlocks: cycles "
                          "of pauses seen; queue: sampled switch backlog, KiB; top util: max/mean "
                          "share of the link rate into the top tier over the run; busbw: "
                          "Mbit/s; fct: flow completion, s")
    for col in ("variant", "fidelity", "drops", "ce marks", "pauses", "paused s", "watchdog",
                "deadlocks", "queue max", "queue p99", "top util"):
        table.add_column(col, justify="left" if col == "variant" else "right")
    jobs = max((len(r["jobs"]) for r in rows), default=0)
    for j in range(jobs):
        op = next((r["jobs"][j].get("label") or r["jobs"][j]["op"] for r in rows
                   if len(r["jobs"]) > j), "?")
        table.add_column(f"j{j} {op} busbw", justify="right")
        table.add_column(f"j{j} fct p50/p99", justify="right")
    for r in rows:
        kib = lambda v: "-" if v is None else f"{v / 1024:.0f}"  # noqa: E731
        cells = [r["variant"] + ("" if r["complete"] else " (failed)"),
                 r.get("fidelity") or "-",
                 str(r["drops"]) if r["drops"] is not None else "-",
                 str(r["ecn_marked"]) if r["ecn_marked"] is not None else "-",
                 str(r["pfc_pause_events"]) if r.get("pfc_pause_events") else "-",
                 f"{r['pfc_paused_s']:.1f}" if r.get("pfc_paused_s") else "-",
                 str(r["pfc_watchdog_events"]) if r.get("pfc_watchdog_events") else "-",
                 str(r["pfc_deadlocks"]) if r.get("pfc_deadlocks") else "-",
                 kib(r["queue_max_bytes"]), kib(r["queue_p99_bytes"]), _top_util(r)]
        for j in range(jobs):
            job = r["jobs"][j] if len(r["jobs"]) > j else None
            cells += ([f"{job['busbw_mbps']:.2f}",
                       f"{job['fct_p50_s']:.2f}/{job['fct_p99_s']:.2f}"] if job else ["-", "-"])
        table.add_row(*cells)
    return table


def _efficiency_table(name: str, rows: list[dict]) -> Table:
    """Variants by job, compact: efficiency (busbw over the link rate: the last flow decides),
    and for patterns of flows their throughput as a fraction of ideal (Hedera's aggregate
    measure: each flow counts for its own share)."""
    table = Table(title=f"{name}: efficiency per job", box=None,
                  caption="eff: busbw / link rate; tput: the flows' aggregate throughput as a "
                          "fraction of ideal (mean of each flow's ideal time over its "
                          "completion time)")
    table.add_column("variant")
    jobs = max((len(r["jobs"]) for r in rows), default=0)
    for j in range(jobs):
        label = next((r["jobs"][j].get("label") or r["jobs"][j]["op"] for r in rows
                      if len(r["jobs"]) > j), "?")
        table.add_column(label, justify="right")
    for r in rows:
        cells = [r["variant"] or "-"]
        for j in range(jobs):
            job = r["jobs"][j] if len(r["jobs"]) > j else None
            if job is None:
                cells.append("-")
                continue
            tput = job.get("throughput_of_ideal")
            cells.append(f"eff {job['efficiency']:.2f}"
                         + (f" tput {tput:.2f}" if tput is not None else ""))
        table.add_row(*cells)
    return table


def _top_util(row: dict) -> str:
    """Max/mean utilization of the links into the top tier (agg->core, leaf->spine)."""
    util = row.get("utilization") or {}
    tier = next((t for t in ("agg->core", "leaf->spine") if t in util), None)
    return f"{util[tier]['max']:.2f}/{util[tier]['mean']:.2f}" if tier else "-"


def _real_table(doc: dict) -> Table:
    """The collectives in the real fabric's units (``scale``), one row per collective run."""
    f = doc["real_scale"]
    table = Table(title=f"real-equivalent at {f['real_rate_gbps']:g} Gbit/s, "
                        f"{f['real_rtt_us']:g} us RTT", box=None,
                  caption=f"scales: {f['scales']}\ndoes not scale: {f['does_not_scale']}")
    for col in ("job", "op", "bytes", "time_us", "busbw Gbit/s", "fct p99 us"):
        table.add_column(col, justify="left" if col == "op" else "right")
    for row in doc["collectives"]:
        real = row.get("real")
        if not real:
            continue
        p99 = real["flow_completion_s"].get("p99")
        table.add_row(str(row["job"]), row.get("label") or row["op"], f"{real['bytes']:,}",
                      f"{real['duration_s'] * 1e6:,.1f}", f"{real['busbw_gbps']:,.1f}",
                      "-" if p99 is None else f"{p99 * 1e6:,.1f}")
    return table


def _results_table(doc: dict) -> Table:
    """An nccl-tests-like table: one row per job, times averaged over its repetitions."""
    table = Table(title=f"{doc['experiment']}: collectives",
                  caption="bytes: NCCL-tests size; count: float32 elements; algbw, busbw: Mbit/s;"
                          " eff: busbw / link rate; cpu_s: all agents' CPU seconds", box=None)
    for col in ("op", "algo", "n", "bytes", "count", "reps", "time_ms", "algbw", "busbw",
                "eff", "cpu_s"):
        table.add_column(col, justify="left" if col in ("op", "algo") else "right",
                         no_wrap=True)
    constants = sorted({c["transport"]["constants"] for c in doc["collectives"]
                        if (c.get("transport") or {}).get("constants")})
    if constants:  # the transports' constants at the emulated scale
        table.caption += "".join(f"\n{text}" for text in constants)
    for s in job_summaries(doc["collectives"]):
        table.add_row(s.op, s.algorithm, str(s.ranks), str(s.bytes), str(s.count),
                      str(s.repetitions), f"{s.mean_s * 1e3:.0f}", f"{s.algbw_mbps:.2f}",
                      f"{s.busbw_mbps:.2f}", f"{s.efficiency:.3f}", f"{s.agent_cpu_s:.1f}")
    return table


def _servers_table(doc: dict) -> Table | None:
    """Servers of GPUs: per collective (a training phase summed over its runs) its time, the
    time its byte counts predict on the fabric, and the bytes that crossed the scale-out
    network against all it moved."""
    phases: dict[str, dict] = {}
    for row in doc["collectives"]:
        if row.get("scale_out_bytes") is None:
            continue
        label = row.get("label") or row["op"]
        if row.get("iteration") is not None:  # "iter 0 mb 1 fwd stage 0 tp all_reduce"
            label = re.sub(r"\b(iter|mb|stage) \d+ ?", "", label).strip()  # "fwd tp ..."
        p = phases.setdefault(label, {"runs": 0, "time_s": 0.0, "ideal_s": 0.0,
                                      "scale_out": 0, "moved": 0, "algo": row["algorithm"]})
        p["runs"] += 1
        p["time_s"] += row["duration_s"]
        p["ideal_s"] += row["ideal_s"]
        p["scale_out"] += row["scale_out_bytes"]
        p["moved"] += row.get("moved_bytes") or 0
    if not phases:
        return None
    table = Table(title=f"{doc['experiment']}: servers of GPUs", box=None,
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


def cmd_clean(args) -> int:
    from testbed.cluster.machines import machine_state_dirs

    report = cleanup.clean(Registry(args.state_dir), include_live=args.all)
    # the parts this machine built for a cluster (their actors gone)
    for state in machine_state_dirs(args.state_dir):
        part = cleanup.clean(Registry(state), include_live=args.all, orphans=False)
        for name in ("runs", "skipped", "errors"):
            getattr(report, name).extend(getattr(part, name))
        report.links += part.links
        report.processes += part.processes
        report.bridges += part.bridges
    args.console.print(f"removed {len(report.runs)} run(s): {report.bridges} bridge(s), "
                       f"{report.links} link(s), {report.processes} process(es)")
    for item in report.skipped:
        args.console.print(f"skipped run {item}"
                           + (" (use --all to remove it too)" if "still running" in item else ""))
    for err in report.errors:
        args.console.print(f"[red]error:[/red] {err}")
    if args.json:
        _emit({"runs": report.runs, "bridges": report.bridges, "links": report.links,
               "processes": report.processes, "skipped": report.skipped,
               "errors": report.errors})
    return 1 if report.errors else EXIT_OK


def cmd_fail(args) -> int:
    """Take a link or a switch of the running fabric down (``fail``) or up (``restore``)."""
    from testbed.fabric.failures import set_links_of_running_fabric

    done = set_links_of_running_fabric(Registry(args.state_dir), args.target,
                                       up=args.command == "restore", run_id=args.run)
    args.console.print(done)
    if args.json:
        _emit({"done": done})
    return EXIT_OK


def compare_rows(dirs: list[Path]) -> list[dict]:
    """The runs under each directory, one line each: a sweep's cells (mean over repetitions),
    a run's variants, or a single run. Lines: ``{"run", "complete", "error", "jobs": [{"label",
    "efficiency", "busbw_mbps", "n"}]}``."""
    from fabriclab.model import sweep as sw

    lines = []
    for d in dirs:
        if (d / "sweep.json").is_file():
            doc = json.loads((d / "sweep.json").read_text())
            for line in sw.summarize(doc["cells"]):
                lines.append({"run": f"{d}/{line['cell']}", "complete": line["failed"] == 0,
                              "error": "; ".join(line["errors"]) or None,
                              "jobs": [{"label": j["label"], "n": j["efficiency"]["n"],
                                        "efficiency": j["efficiency"]["mean"],
                                        "busbw_mbps": j["busbw_mbps"]["mean"]}
                                       for j in line["jobs"]]})
            continue
        docs = []
        if (d / "results.json").is_file():
            docs.append((str(d), json.loads((d / "results.json").read_text())))
        elif (d / "variants.json").is_file():
            for row in json.loads((d / "variants.json").read_text()):
                path = d / str(row["variant"]) / "results.json"
                docs.append((f"{d}/{row['variant']}", json.loads(path.read_text())))
        else:
            _require_run(d)  # raises: neither file is there
        for name, doc in docs:
            row = variant_row(doc)
            lines.append({"run": name, "complete": row["complete"], "error": row["error"],
                          "jobs": [{"label": j.get("label") or j["op"], "n": 1,
                                    "efficiency": j["efficiency"],
                                    "busbw_mbps": j["busbw_mbps"]} for j in row["jobs"]]})
    return lines


def cmd_compare(args) -> int:
    """Runs side by side: each job's efficiency (busbw / link rate) per run."""
    lines = compare_rows([Path(d) for d in args.dirs])
    if args.json:
        _emit(lines)
        return EXIT_OK
    labels = list(dict.fromkeys(j["label"] for line in lines for j in line["jobs"]))
    table = Table(title="runs compared", box=None, header_style="bold")
    table.add_column("run")
    table.add_column("status")
    for label in labels:
        table.add_column(f"{label} eff", justify="right")
    for line in lines:
        by_label = {j["label"]: j for j in line["jobs"]}
        cells = [("-" if by_label.get(label, {}).get("efficiency") is None else
                  f"{by_label[label]['efficiency']:.3f}"
                  + (f" (n={by_label[label]['n']})" if by_label[label]["n"] > 1 else ""))
                 for label in labels]
        table.add_row(line["run"], "ok" if line["complete"] else "failed", *cells)
    table.caption = "eff: busbw / link rate (a sweep's cell: the mean over its complete runs)"
    args.console.print(table)
    return EXIT_OK


def cmd_schema(_args) -> int:
    _emit(xp.schema())
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fabriclab", description=__doc__)
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR,
                        help=f"run records and caches (default {DEFAULT_STATE_DIR})")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, func, help_text: str, json_flag: bool = True):
        p = sub.add_parser(name, help=help_text)
        p.set_defaults(func=func, json=False)
        if json_flag:
            p.add_argument("--json", action="store_true",
                           help="print one JSON document on stdout (the rest goes to stderr)")
        return p

    def backend(p) -> None:
        p.add_argument("--backend", choices=list(Backend),
                       help="where to run (default: the experiment's emulator.backend)")

    def cluster(p) -> None:
        p.add_argument("--cluster", metavar="ADDRESS",
                       help="partition the fabric over the Ray cluster whose head is ADDRESS "
                            "(host:port), as the experiment's cluster.address would")

    p = command("validate", cmd_validate, "check experiment files without building anything")
    p.add_argument("files", nargs="+")
    p.add_argument("--machines", type=int, default=0,
                   help="also show how the fabric would be partitioned over N machines like "
                        "this one (each at the fidelity model's headroom)")
    p = command("up", cmd_up, "build a fabric and keep it up until Ctrl-C")
    p.add_argument("file")
    p.add_argument("--check", action="store_true",
                   help="test all-pairs reachability, tear down, exit non-zero on any loss")
    p.add_argument("--count", type=int, default=2, help="probes per pair with --check")
    p.add_argument("-v", "--verbose", action="store_true", help="print step timings")
    backend(p)
    cluster(p)
    p.add_argument("--vm-accel", choices=("tcg", "kvm"), default="tcg",
                   help="vm backend: CPU emulation (default; works everywhere) or KVM")
    p.add_argument("--out", type=Path, help="with --telemetry: where Prometheus stores "
                                            "(default runs/up-<time>)")
    telemetry_cli.add_arguments(p)
    p = command("run", cmd_run, "build the fabric, run the workload, write results, tear down")
    p.add_argument("file")
    p.add_argument("--out", required=True, help="directory for results.json")
    p.add_argument("--resume", action="store_true",
                   help="finish an interrupted run in --out: complete cells and variants are "
                        "kept, the rest run")
    p.add_argument("--force", action="store_true",
                   help="overwrite the run --out already holds")
    backend(p)
    cluster(p)
    p.add_argument("--parallel", action="store_true",
                   help="a sweep's cells at once, one per machine of the cluster, each built "
                        "whole on its machine")
    telemetry_cli.add_arguments(p)
    telemetry_cli.add_command(command)
    telemetry_cli.add_top_command(command)
    for name, verb in (("fail", "down"), ("restore", "back up")):
        p = command(name, cmd_fail, f"take a link (two nodes) or a switch (one) of the fabric "
                                    f"'fabriclab up' keeps running {verb}")
        p.add_argument("target", nargs="+", help="agg1_1 core1 (a link) or core1 (a switch)")
        p.add_argument("--run", help="the run id, when several fabrics are up")
    p = command("report", cmd_report, "(re)build DIR/report.html from a run directory")
    p.add_argument("dir", metavar="DIR")
    p = command("compare", cmd_compare, "put runs side by side (run, variants or sweep "
                                        "directories)")
    p.add_argument("dirs", nargs="+", metavar="DIR")
    p = command("clean", cmd_clean, "remove what earlier (killed) runs left behind")
    p.add_argument("--all", action="store_true", help="also runs whose process is still alive")
    command("schema", cmd_schema, "print the experiment file's JSON Schema", json_flag=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.console = ui = _console(to_stderr=args.json)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return args.func(args)
    except ConfigError as err:
        ui.print(f"[red]config error:[/red] {err}")
        return EXIT_CONFIG
    except TestbedError as err:
        ui.print(f"[red]testbed error:[/red] {err}")
        for note in getattr(err, "__notes__", []):
            ui.print(f"  {note}")
        return EXIT_SYSTEM
    except (KeyboardInterrupt, Terminated) as err:
        if getattr(args, "verbose", False):
            ui.print_exception()
        ui.print(f"interrupted ({type(err).__name__}); torn down")
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
