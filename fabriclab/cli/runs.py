"""``fabriclab run`` (the experiment layer's ways of running, shown on the terminal),
``report`` and ``compare``."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from fabriclab.cli import tables
from fabriclab.cli.output import EXIT_OK, EXIT_SYSTEM, emit
from fabriclab.cli.requests import CompareRequest, ReportRequest, RunRequest
from fabriclab.model.document import RunDocument
from fabriclab.model.results import VariantRow
from fabriclab.modes import run_file
from fabriclab.report import write_report
from fabriclab.runner import RunView, batch_text
from fabriclab.frames import compare_rows
from fabriclab.rundirs import require_run


class TerminalView(RunView):
    """Progress and results of ``fabriclab run`` on the terminal: a spinner while the fabric
    is built, a progress bar while the workload runs, the tables once a run is done."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.stack = ExitStack()  # the spinner or the progress bar of the run going on
        self.bar = None
        self.task = None

    def building(self, reused: bool = False) -> None:
        self.stack.enter_context(self.console.status(
            "the previous run's fabric: restarting the controller ..." if reused
            else "building the fabric ..."))

    def started(self, fabric, total: int) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.stack.close()  # the spinner
        for line in fabric.plan.describe() if fabric.plan is not None else []:
            self.console.print(f"cluster: {line}")
        for warning in fabric.warnings:
            self.console.print(f"[yellow]warning:[/yellow] {escape(warning)}")
        if not total:  # a program alone: its rank 0 speaks instead
            return
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

    def closed(self) -> None:
        self.stack.close()

    def say(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False)

    def warn(self, text: str) -> None:
        self.console.print(f"[red]{escape(text)}[/red]" if "failed" in text else
                           f"[yellow]{escape(text)}[/yellow]")

    def section(self, title: str) -> None:
        self.console.rule(title)

    def run_done(self, doc: RunDocument, out: Path) -> None:
        ui = self.console
        for item in doc.iterations or ():
            ui.print(tables.iteration_text(item, doc.prediction))
        if doc.real_scale and doc.time_scale:  # the real fabric's units first
            ui.print(tables.real_scale(doc))
        if doc.collectives or not doc.program:
            ui.print(tables.collectives(doc))
        if doc.program:
            ui.print(tables.program(doc))
        if doc.jobs:
            ui.print(tables.named_jobs(doc))
        gpus_table = tables.servers_of_gpus(doc)
        if gpus_table is not None:
            ui.print(gpus_table)
        if doc.real_scale and not doc.time_scale:
            ui.print(tables.real_scale(doc))
        fidelity = doc.fidelity
        if fidelity:
            idle = fidelity.idle_pct.median
            ui.print(f"fidelity: {fidelity.verdict}"
                     + (f" (machine {idle:.0f} % idle)" if idle is not None else "")
                     + "".join(f"\n  {reason}" for reason in fidelity.reasons))
            kept = fidelity.extra.get("time_scale") or {}
            ppb, late = kept.get("packets_per_bdp"), kept.get("lateness")
            if ppb:
                ui.print(f"  regime: {ppb['measured']:g} packets per BDP (the emulation added "
                         f"up to {ppb['added_ms']:g} ms to a {ppb['base_rtt_ms']:g} ms round "
                         f"trip), the real fabric's {ppb['real']:g}")
            relay = kept.get("delay_relay")
            if relay and relay.get("cpu_us_per_packet") is not None:
                ui.print(f"  delay relay: {relay['packets']:,} packets held, "
                         f"{relay['cpu_us_per_packet']:g} us of CPU each")
            if late:
                who = "agents' and relay's" if relay else "agents'"
                ui.print(f"  {who} lateness: median <= {late['p50_us_at_most']:g} us, p99 <= "
                         f"{late['p99_us_at_most']:g} us, a packet time {late['packet_time_us']:g}"
                         " us")
        for event in doc.controller.events if doc.controller else ():
            ui.print(tables.controller_event(event), markup=False)
        if doc.timings_s:
            ui.print("time: " + ", ".join(f"{k.replace('_', '-')} {v:.1f} s"
                                          for k, v in doc.timings_s.items()))
        ui.print(f"results: {out / 'results.json'}")
        telemetry = doc.telemetry
        for error in telemetry.errors or () if telemetry else ():
            ui.print(f"[yellow]telemetry: {escape(error)}[/yellow]")
        if telemetry and telemetry.data:
            ui.print(f"telemetry: {telemetry.data} (served during the run at "
                     f"{telemetry.prometheus}; again: fabriclab telemetry {out})")

    def variants_done(self, name: str, rows: list[VariantRow]) -> None:
        self.console.print(tables.variants(name, rows))
        self.console.print(tables.efficiency(name, rows))
        transports = tables.transports(name, rows)
        if transports is not None:
            self.console.print(transports)

    def sweep_done(self, name: str, summary: list[dict]) -> None:
        self.console.print(tables.sweep(name, summary))


def run(req: RunRequest, ui: Console) -> int:
    """Build the fabric, run the workload, write DIR/results.json, tear down (a run, its
    variants or its sweep; on this host or in the guest)."""
    view = TerminalView(ui)
    try:
        outcome = run_file(req, view)
    finally:
        view.closed()
    if req.json:
        emit(outcome.document)
    if outcome.exit_code is not None:  # the guest's, relayed
        return outcome.exit_code
    return EXIT_SYSTEM if outcome.failed else EXIT_OK


def report(req: ReportRequest, ui: Console) -> int:
    """(Re)build DIR/report.html from a run, variants or sweep directory."""
    require_run(req.dir)
    path = write_report(req.dir)
    ui.print(f"report: {path}")
    if req.json:
        emit({"report": str(path)})
    return EXIT_OK


def compare(req: CompareRequest, ui: Console) -> int:
    """Runs side by side: each job's efficiency, time, FCT and slowdown per run, their change
    against the baseline run, and where the runs' provenance differs."""
    lines = compare_rows(req.dirs, req.baseline)
    if req.json:
        emit(lines)
        return EXIT_OK
    for table in tables.compare(lines):
        ui.print(table)
    differ = tables.provenance_diff(lines)
    if differ is not None:
        ui.print(differ)
    return EXIT_OK
