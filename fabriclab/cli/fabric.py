"""``fabriclab up`` (a fabric kept up, or checked and torn down), ``fail`` / ``restore`` on
the fabric ``up`` keeps running, and ``clean``."""

from __future__ import annotations

import json
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from fabriclab.cli import background, tables
from fabriclab.cli.output import EXIT_OK, EXIT_UNREACHABLE, emit
from fabriclab.cli.requests import CleanRequest, FailRequest, UpRequest
from fabriclab.model import experiment as xp
from fabriclab.modes import in_vm, resolve_backend
from fabriclab.runner import RunView
from fabriclab.shared import make_fabric
from telemetry.exporter import RunTelemetry
from testbed.cluster.agent import machine_state_dirs
from testbed.errors import ConfigError
from testbed.fabric.failures import set_links_of_running_fabric
from testbed.fabric.lifecycle import keep_logs, keep_tables
from testbed.model.spec import Backend
from testbed.runs import cleanup
from testbed.runs.registry import Registry


def up(req: UpRequest, ui: Console) -> int:
    """Build the fabric; with ``check``, probe every pair and tear down, else stay up until
    Ctrl-C (or SIGTERM); with ``detach``, in a process of its own, this one back once it is
    up."""
    exp = xp.load(req.file, cluster=req.cluster)
    if resolve_backend(exp, req.backend, req.state_dir) == Backend.VM:
        return _up_in_vm(req, exp, ui)
    if req.detach:
        if req.check:
            raise ConfigError("--detach", "keeps a fabric up in the background; --check tears "
                                          "it down: give one of them")
        code = background.detach(req.state_dir, exp.controller.ready_timeout_s + 120)
        if code is not None:
            return code
        ui = Console(file=sys.stdout, force_terminal=False, width=120)  # the child: its log
    start = time.monotonic()
    fabric = make_fabric(exp, req.state_dir,
                         log=(lambda m: ui.print(f"[dim]{m}[/dim]")) if req.verbose else
                         (lambda _m: None), failable=not req.check)
    doc: dict = {}
    code = EXIT_OK
    with ExitStack() as stack:
        # registered first, so it runs after the fabric's teardown: the teardown's time
        stack.callback(lambda: ui.print(f"torn down in {fabric.timings.get('down_total', 0):.2f}"
                                        " s") if "down_total" in fabric.timings else None)
        with ui.status("building the fabric ..."):
            stack.enter_context(fabric)
        ui.print(tables.fabric_summary(exp, fabric))
        for warning in fabric.warnings:
            ui.print(f"[yellow]warning:[/yellow] {escape(warning)}")
        doc = fabric_document(exp, fabric)
        opts = req.telemetry
        where = None
        if opts.prometheus:
            where = req.out or Path("runs") / time.strftime("up-%Y%m%d-%H%M%S")
        tele = stack.enter_context(RunTelemetry(  # the exporters always (fabriclab top)
            fabric, where / "prometheus" if where else None, opts.interval_s,
            {"experiment": exp.name}, str(exp.controller.routing),
            (opts.exporter_host, opts.exporter_port)))
        if opts.prometheus:
            doc["telemetry"] = tele.report()
            ui.print(f"telemetry: Prometheus at {tele.prometheus.url}, data in {where}")
        if not req.check:
            if req.json:
                emit({**doc, "state": "up"})
            fabric.write_file(background.FABRIC_FILE, json.dumps({
                "experiment": exp.name, "file": str(Path(req.file).resolve()),
                "hosts": len(fabric.topo.hosts), "controller": fabric.controller_address,
                "controller_kind": exp.controller.kind,
                "telemetry": tele.prometheus.url if tele.prometheus else None}))
            ui.print("fabric is up; Ctrl-C (or SIGTERM) tears it down")
            background.say_up(fabric.record.run_id)
            said = 0
            while True:  # Ctrl-C or SIGTERM unwinds through the teardown
                time.sleep(1)
                for error in fabric.service_errors[said:]:  # a controller's death, say
                    ui.print(f"[red]fabric service failed:[/red] {escape(error)}")
                said = len(fabric.service_errors)
        result = fabric.reachability(count=req.count)
        reach_s = time.monotonic() - start
        ui.print(result.summary())
        ui.print(f"all pairs reachable {reach_s:.2f} s after start" if result.complete else
                 "unreachable: " + ", ".join(f"{s}->{d}" for s, d in result.failed[:20]))
        doc["reachability"] = {**result.to_dict(), "reachable_s": reach_s if result.complete
                               else None}
        if not result.complete:  # why: the controller's and the switches' logs and tables
            kept = keep_logs(fabric)
            if kept is not None:
                keep_tables(fabric, kept)
                doc["logs"] = str(kept)
                ui.print(f"the run's logs are kept in {kept}")
        code = EXIT_OK if result.complete else EXIT_UNREACHABLE
        ui.print("tearing down ...")
    doc["timings_s"] = dict(fabric.timings)
    if req.json:
        emit(doc)
    return code


def _up_in_vm(req: UpRequest, exp: xp.Experiment, ui: Console) -> int:
    """``up --check`` inside the full-kernel guest; its output and exit code relayed."""
    if not req.check:
        raise ConfigError("emulator.backend", "the vm backend runs a job and powers off: use "
                          "'fabriclab up --check' (an interactive guest is the lab VM's job)")
    outcome = in_vm(req.file, req.state_dir, exp,
                    f"up --check --backend host --count {int(req.count)} "
                    f"{'-v ' if req.verbose else ''}/job/experiment.yaml",
                    _Say(ui), json_doc=req.json, verbose=req.verbose, accel=req.vm_accel)
    if req.json:
        emit(outcome.document)
    return outcome.exit_code


class _Say(RunView):
    def __init__(self, ui: Console) -> None:
        self.ui = ui

    def say(self, text: str) -> None:
        self.ui.print(text, markup=False)


def fabric_document(exp: xp.Experiment, fabric) -> dict:
    """A running fabric, for ``--json``."""
    return {"experiment": exp.name, "source": exp.source, "backend": "host",
            "datapath": fabric.datapath_type, "vswitchd_instances": fabric.vswitchd_count,
            "controller": fabric.controller_address, "run_dir": str(fabric.run_dir),
            "fabric": exp.fabric_summary(), "counts": exp.topology.counts(),
            "warnings": list(fabric.warnings), "timings_s": dict(fabric.timings)}

def fail(req: FailRequest, ui: Console) -> int:
    """Take a link or a switch of the running fabric down (``fail``) or up (``restore``);
    ``--json`` also gives how long it took, and on one machine when its first step began
    (the wall clock) and each step's time after that."""
    start, timings = time.monotonic(), {}
    done = set_links_of_running_fabric(Registry(req.state_dir), req.targets, up=req.up,
                                       run_id=req.run, timings=timings)
    ui.print(done)
    if req.json:
        emit({"done": done, "took_ms": round((time.monotonic() - start) * 1000, 1),
              **({"began": round(timings.pop("began"), 6), "steps_s": timings}
                 if "began" in timings else {})})
    return EXIT_OK


def clean(req: CleanRequest, ui: Console) -> int:
    """Remove what earlier runs left: this machine's runs, and the parts it built for a
    cluster (their actors gone)."""
    report = cleanup.clean(Registry(req.state_dir), include_live=req.all)
    for state in machine_state_dirs(req.state_dir):
        part = cleanup.clean(Registry(state), include_live=req.all, orphans=False)
        for name in ("runs", "skipped", "errors"):
            getattr(report, name).extend(getattr(part, name))
        report.links += part.links
        report.processes += part.processes
        report.bridges += part.bridges
    ui.print(f"removed {len(report.runs)} run(s): {report.bridges} bridge(s), "
             f"{report.links} link(s), {report.processes} process(es)")
    for item in report.skipped:
        ui.print(f"skipped run {item}"
                 + (" (use --all to remove it too)" if "still running" in item else ""))
    for err in report.errors:
        ui.print(f"[red]error:[/red] {escape(str(err))}")
    if req.json:
        emit({"runs": report.runs, "bridges": report.bridges, "links": report.links,
              "processes": report.processes, "skipped": report.skipped,
              "errors": report.errors})
    return 1 if report.errors else EXIT_OK
