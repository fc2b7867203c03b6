"""Run an experiment end to end: build its fabric, run its workload batch by batch, and keep
``results.json`` current as it goes (complete, or failed with what it measured and why).

:func:`run_experiment` goes in phases, each a method of :class:`ExperimentRun`: ``begin``
(the run directory's first files), ``start_services`` (exporters, Prometheus, the monitor,
failures), ``run_batch`` then ``record`` for every batch of the workload, and ``finish``. It
uses of the fabric only what :class:`testbed.contract.RunningFabric` declares, so the
unit tests drive it with a fake fabric. The terminal (progress bar, tables) is the CLI's: it
hands in a :class:`RunView`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from fabriclab.model import prediction, results, rundir, timescale
from fabriclab.model import jobs as jobs_out
from fabriclab.model import document as d
from fabriclab.model import traffic as traffic_out
from fabriclab.model.experiment import Experiment
from fabriclab.options import TelemetryOptions
from fabriclab.shared import SharedFabric
from telemetry.exporter import RunTelemetry
from testbed.errors import TestbedError
from testbed.contract import RunningFabric
from testbed.fabric.failures import FailureInjector
from testbed.linux import environment
from testbed.linux.files import copy_file, make_dirs, write_json_atomic, write_text_atomic
from testbed.model.congestion import link_utilization, summarize_congestion
from testbed.plan import delayline
from fabriclab import delayprobe
from fabriclab import programs as programs_run
from traffic.agents.runner import JobOutcome, batch_start_at, run_batch
from traffic.workloads.program import Program
from traffic.workloads.workload import Job

MARKER = ("ebpf: a virtual queue at each switch port's clsact egress "
          "(testbed/linux/progs/ecn_marker.c)")
RED_MARKER = ("red: the kernel's RED qdisc as each lossy class's leaf at the switch ports (ecn, "
              "nodrop, instantaneous backlog); lossless classes by the eBPF marker")

#: runs a batch of jobs from a wall-clock time (:func:`traffic.agents.runner.run_batch`)
BatchRunner = Callable[[RunningFabric, list[Job], float], list[JobOutcome]]


class RunView:
    """What a run shows while it goes; the default shows nothing. The ways of running
    (:mod:`fabriclab.modes`) also say what they do through it."""

    def building(self, reused: bool = False) -> None:
        """The fabric is being built (``reused``: the previous run's gets a new controller)."""

    def started(self, fabric: RunningFabric, total: int) -> None:
        """The fabric is up; ``total`` collectives will run."""

    def telemetry(self, telemetry: RunTelemetry) -> None:
        """Prometheus is up and scraping."""

    def batch(self, jobs: list[Job]) -> None:
        """A batch of jobs starts."""

    def measured(self, count: int) -> None:
        """``count`` more collectives were measured."""

    def tearing_down(self) -> None:
        """The fabric is being torn down."""

    def closed(self) -> None:
        """The run is over, complete or not: progress displays end."""

    def say(self, text: str) -> None:
        """A line for the user."""

    def warn(self, text: str) -> None:
        """Something went wrong that does not stop what runs (a failed cell, a report)."""

    def section(self, title: str) -> None:
        """The next run of several starts (a variant, a sweep's cell)."""

    def run_done(self, doc: d.RunDocument, out: Path) -> None:
        """A run finished with the results document ``doc`` in ``out``."""

    def variants_done(self, name: str, rows: list[results.VariantRow]) -> None:
        """Every variant ran: one row each (:func:`fabriclab.model.results.variant_row`)."""

    def sweep_done(self, name: str, summary: list[dict]) -> None:
        """Every cell of a sweep ran (:func:`fabriclab.model.sweep.summarize`)."""


def batch_text(jobs: list[Job]) -> str:
    """``all_reduce 4194304 B x2 on 16 ranks (+1 at once)``."""
    first = jobs[0].collectives[0]
    return (f"{first.op} {first.schedule.size_bytes} B x{len(jobs[0].collectives)} on "
            f"{len(first.hosts)} ranks" + (f" (+{len(jobs) - 1} at once)" if len(jobs) > 1
                                          else ""))


def _keep_logs(fabric: RunningFabric, out_dir: Path) -> None:
    """Copy the controller's log and stderr (a restarted one's predecessors' too) and the
    agents' logs into ``out_dir/logs`` before the fabric's run directory goes."""
    logs = make_dirs(out_dir / "logs")
    run_dir = Path(fabric.run_dir)
    sources = [run_dir / "controller.log", run_dir / "controller.stderr",
               *sorted(run_dir.glob("controller-*.stderr")), *sorted((run_dir / "logs").glob("*.log"))]
    for src in sources:
        if src.is_file():  # (not written: no controller, or an agent that logged nothing)
            copy_file(src, logs / src.name)


@dataclass
class Services:
    """What a run starts on its fabric for its measurement (ended by the run's stack)."""

    telemetry: RunTelemetry
    monitor: object  # testbed.fabric.monitor.RunMonitor or a cluster's
    injector: FailureInjector | None = None


def named_jobs(workload) -> list[dict]:
    """``workload.jobs``: each named job's index, name, hosts and its alone copy's index."""
    alone = {j.alone_of: j.index for j in workload.jobs if j.alone_of}
    return [{"index": j.index, "name": j.name, "hosts": list(j.collectives[0].hosts),
             "alone_index": alone.get(j.name)}
            for j in workload.jobs if j.name and not j.alone_of]


def _baseline(baseline: str) -> dict[str, float] | None:
    """A baseline run directory's jobs alone, by name (None: alone copies, or none)."""
    if baseline in ("", "alone", "none"):
        return None
    return jobs_out.baseline_times(d.read(json.loads((Path(baseline) / "results.json")
                                                  .read_text())))


@dataclass
class ExperimentRun:
    """One run of ``exp`` into ``out_dir``, phase by phase (see the module docstring)."""

    exp: Experiment
    out_dir: Path
    view: RunView
    telemetry: TelemetryOptions
    doc: d.RunDocument = field(default_factory=d.RunDocument)
    flows: list[list] = field(default_factory=list)
    marks: dict[str, float] = field(default_factory=dict)  # bring-up, measurement, teardown
    injector: FailureInjector | None = None
    lost_switches: list[str] = field(default_factory=list)  # their vswitchd died under the run
    traffic: dict = field(default_factory=dict)  # traffic.json: matrix, links per phase, batch
    reading: dict = field(default_factory=dict)  # the switches' counters when a batch began
    hashing: prediction.AsHashed | None = None  # the paths as hashed (ECMP, eBPF switches)
    relay_probe: dict | None = None  # the hosts' delay relay: the probe before the workload
    relay_before: dict | None = None  # and its counters then
    relay_counters: Callable[[], dict | None] | None = None

    @property
    def path(self) -> Path:
        return self.out_dir / "results.json"

    def begin(self) -> None:
        """The run directory's first files: the document (no results yet), the experiment as
        run and the environment."""
        exp = self.exp
        self.marks["start"] = time.monotonic()
        make_dirs(self.out_dir)
        self.doc = results.new_document(exp.name, exp.source,
                                        time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                        exp.fabric_summary())
        self.save()
        if exp.real_scale is not None:
            self.doc.real_scale = d.RealScale.from_json(exp.real_scale.factors(), "real_scale")
        if exp.time_scale is not None:
            self.doc.time_scale = d.TimeScaleSummary.from_json(exp.time_scale.to_json(),
                                                               "time_scale")
        self.doc.prediction = d.Prediction.from_json(prediction.document(exp), "prediction")
        if exp.workload is not None and exp.workload.replay:
            self.doc.replay = exp.workload.replay  # what a trace's or log's replay scaled
        self.traffic = prediction.traffic_document(exp)
        write_json_atomic(self.out_dir / "traffic.json", self.traffic, indent=None)
        expanded = rundir.experiment_document(exp.raw)
        self.doc.experiment_sha256 = expanded["sha256"]
        write_json_atomic(self.out_dir / "experiment.json", expanded)
        write_json_atomic(self.out_dir / "environment.json", environment.document())

    def start_services(self, fabric: RunningFabric, stack: ExitStack) -> Services:
        """The exporters (always: ``fabriclab top`` watches them), Prometheus on request, the
        run monitor and the failure injector, each ended by ``stack``."""
        exp, opts = self.exp, self.telemetry
        self.marks["up"] = time.monotonic()
        stack.callback(_keep_logs, fabric, self.out_dir)  # also when the run fails
        self.view.started(fabric, exp.workload.collective_count)
        # the run's own directory names it among a sweep's cells; a run without a variant is
        # the base (every label has a value: the dashboards' variables list them)
        labels = {"experiment": exp.name, "variant": opts.variant or "base",
                  "cell": self.out_dir.name}
        tele = stack.enter_context(RunTelemetry(
            fabric, self.out_dir / "prometheus" if opts.prometheus else None,
            opts.interval_s, labels, str(exp.controller.routing),
            (opts.exporter_host, opts.exporter_port)))
        if opts.prometheus:
            self.doc.telemetry = d.TelemetrySummary.from_json(tele.report(), "telemetry")
            self.view.telemetry(tele)
        monitor, stop_monitor = fabric.start_monitor(exp.emulator.queue_sample_ms / 1e3)
        stack.callback(stop_monitor)
        placement = fabric.placement()  # on a cluster: the partition, machines, builds
        if placement is not None:
            self.doc.cluster = placement
        facts = fabric.provenance() if hasattr(fabric, "provenance") else {}
        self.doc.provenance = d.Provenance.from_json(
            {"seed": exp.seed, **facts, "software": environment.document()["software"]},
            "provenance")
        if exp.failures:
            self.injector = FailureInjector(fabric, exp.failures,
                                            exp.time_scale.n if exp.time_scale else 1.0)
            stack.callback(fabric.stop_thread, fabric.start_thread(self.injector, "failures"))
        return Services(tele, monitor, self.injector)

    def measure(self, fabric: RunningFabric, services: Services, runner: BatchRunner) -> None:
        """Every batch of the workload, at its time, then its program if it has one; the
        document after each (a failing job, rank or fabric service raises, once what it
        measured is recorded)."""
        errors_before = len(fabric.service_errors)
        before = fabric.congestion()
        began = time.monotonic()
        self.reading = before
        if fabric.spec.fabric.delay_line == "hosts":  # what the relay adds, unloaded
            self.relay_probe = delayprobe.probe(fabric)
            self.relay_counters = fabric.delay_relay_counters
            self.relay_before = self.relay_counters()
        for index, batch in enumerate(self.exp.workload.batches()):
            wait_s = batch[0].not_before_s - (time.monotonic() - began)
            if wait_s > 0:  # a replayed trace's timestamp
                time.sleep(wait_s)
            start_at = batch_start_at(batch)  # failures count from the traffic's start
            if index == 0 and services.injector is not None:
                services.injector.begin(time.monotonic() + max(0.0, start_at - time.time()))
            errors = self.run_batch(fabric, services, batch, runner, start_at)
            errors += self.record(fabric, services, before, began, (index, batch))
            errors += [f"fabric service failed: {e}"
                       for e in fabric.service_errors[errors_before:]]
            if errors:
                raise TestbedError("\n".join(errors))
        if self.exp.workload.program is not None:
            if services.injector is not None and services.injector.began is None:
                services.injector.begin()  # no collectives first: from the program's start
            errors = self.run_program(fabric, self.exp.workload.program)
            errors += self.record(fabric, services, before, began)
            errors += [f"fabric service failed: {e}"
                       for e in fabric.service_errors[errors_before:]]
            if errors:
                raise TestbedError("\n".join(errors))

    def run_program(self, fabric: RunningFabric, program: Program) -> list[str]:
        """The user's program (:func:`fabriclab.programs.run_on`): its run and the collectives
        it reported into the document. Returns its error, if any."""
        run, rows = programs_run.run_on(fabric, self.exp, program, self.out_dir, self.view)
        self.doc.program = run
        self.doc.collectives += rows
        self.save()
        return [f"program: {run.error}"] if run.error else []

    def run_batch(self, fabric: RunningFabric, services: Services, batch: list[Job],
                  runner: BatchRunner, start_at: float) -> list[str]:
        """One batch of jobs at once, their traffic from ``start_at`` (wall clock); their rows
        into the document. Returns the jobs' errors."""
        self.view.batch(batch)
        workload = services.telemetry.workload
        for job in batch:
            first = job.collectives[0]
            workload.started(job.index, first.label or first.op, first.op, job.transport)
        errors = []
        first_row = len(self.doc.collectives)
        outcomes = runner(fabric, batch, start_at)
        for outcome in outcomes:
            if outcome.error is not None:
                errors.append(f"job {outcome.job.index} ({batch_text([outcome.job])}): "
                              f"{outcome.error}")
                workload.finished(outcome.job.index)
                continue
            rows = results.add_rows(self.doc, outcome.job.index, outcome.results, len(batch))
            prediction.attach(rows, self.doc.prediction)
            for row in rows:
                if outcome.job.name:
                    row.job_name = outcome.job.name
                if self.exp.real_scale is not None:
                    row.real = d.RealFigures.from_json(self.exp.real_scale.collective(row))
            workload.measured(outcome.job.index, rows)
            self.view.measured(len(outcome.results))
        hashed = self.predict_as_hashed(fabric, batch, outcomes,
                                        self.doc.collectives[first_row:])
        for outcome in outcomes:
            if outcome.error is None:
                self.flows += rundir.flow_rows(outcome.job.index, outcome.results,
                                               outcome.connections, hashed)
        return errors

    def predict_as_hashed(self, fabric: RunningFabric, batch: list[Job], outcomes: list,
                          rows: list[d.CollectiveRow]) -> list[dict]:
        """Beside the prediction over hash draws, the batch's collectives predicted on the
        paths its connections took (ECMP on eBPF switches, whose hash is known):
        ``predicted_hashed_s`` per row and ``links_as_hashed`` per phase of ``traffic.json``,
        or why not (``prediction.as_hashed_missing``). Returns the connections' rows with their
        paths (none where not known)."""
        doc = self.doc.prediction
        if not doc or any(o.error is not None for o in outcomes):
            return []
        why = prediction.hashing_known(self.exp, fabric.datapath_type)
        paths, known = None, why is None
        if known:
            if self.hashing is None:
                self.hashing = prediction.AsHashed(self.exp)
            paths = self.hashing.paths(batch, {o.job.index: o.connections for o in outcomes})
            if paths is None:
                why = "a connection of the batch is not known (not TCP, or not reported)"
        if paths is None:  # the first batch's reason (they share the fabric)
            if doc.as_hashed_missing is None:
                doc.as_hashed_missing = why
            seen = {o.job.index: o.connections for o in outcomes}  # some known: their paths
            return traffic_out.hashed_connections(
                self.hashing.router, batch, seen,
                self.hashing.connection_paths(batch, seen)) if known else []
        prediction.attach_hashed(rows, self.hashing.predict(batch, paths))
        hashed = traffic_out.hashed_connections(
            self.hashing.router, batch, {o.job.index: o.connections for o in outcomes}, paths)
        self.traffic.setdefault("connections", []).extend(hashed)
        links = self.hashing.links(batch, paths)
        for phase in self.traffic.get("phases", []):
            if (phase["job"], phase["index"]) in links:
                phase["links_as_hashed"] = links[(phase["job"], phase["index"])]
        return hashed

    def record(self, fabric: RunningFabric, services: Services, before: dict,
               began: float, batch: tuple[int, list[Job]] | None = None) -> list[str]:
        """The fabric since the workload began (queues, marks, pauses, utilization, routing,
        failures, fidelity) into the document, and every file of the run directory written.
        Returns the failures' errors."""
        exp, doc = self.exp, self.doc
        now = fabric.congestion()  # one reading for the summary and the utilization
        if batch is not None and self.traffic:  # what the batch sent, port by port
            self.traffic["batches"].append(traffic_out.batch_entry(
                batch[0], batch[1], traffic_out.measured_links(fabric.topo, self.reading, now)))
            self.reading = now
            write_json_atomic(self.out_dir / "traffic.json", self.traffic, indent=None)
        congestion = summarize_congestion(before, now, services.monitor.snapshot(),
                                          exp.fabric.pfc.priorities)
        congestion["utilization"] = link_utilization(fabric.topo, before, now,
                                                     time.monotonic() - began)
        congestion["marker"] = ((RED_MARKER if fabric.red_marking else MARKER)
                                if exp.fabric.marks_ecn else None)
        if fabric.pfc_agent is not None:
            congestion["pfc"] = fabric.pfc_agent.report()
        doc.congestion = d.Congestion.from_json(congestion, "congestion")
        status = fabric.controller_status()  # routing decisions so far
        doc.controller = d.ControllerSummary.from_json(
            {"routing": status.get("routing"), "cpu_s": status.get("cpu_s"),
             "links_down": status.get("links_down", []), "adaptive": status.get("adaptive"),
             "events": list(fabric.controller_events)}, "controller")
        errors = []
        if services.injector is not None:
            doc.failures = self._failures(services.injector)
            errors += [f"failure {f.target} {f.action}: {e}"
                       for f in doc.failures for e in f.errors]
        if self.telemetry.prometheus:
            doc.telemetry = d.TelemetrySummary.from_json(services.telemetry.report(), "telemetry")
        self.lost_switches = sorted(fabric.dead_switches())
        doc.fidelity = self._fidelity(services)
        self.save()
        write_json_atomic(self.out_dir / "timeline.json", services.monitor.timeline(),
                          indent=None)
        write_text_atomic(self.out_dir / "collectives.csv",
                          rundir.collectives_csv(doc.collectives))
        write_text_atomic(self.out_dir / "flows.csv", rundir.flows_csv(self.flows))
        watched = services.injector.port_samples() if services.injector is not None else []
        if watched:
            write_text_atomic(self.out_dir / "ports.csv", rundir.ports_csv(watched))
        return errors

    def save(self) -> None:
        """``results.json`` as the document stands."""
        write_json_atomic(self.path, self.doc.to_json())

    @staticmethod
    def _failures(injector: FailureInjector) -> list[d.FailureApplied]:
        return [d.FailureApplied.from_json(f, f"failures[{i}]")
                for i, f in enumerate(injector.report())]

    def _fidelity(self, services: Services) -> d.Fidelity:
        """The monitor's verdict, degraded when switches lost their vswitchd during the run:
        the emulator failed under it, so its numbers are not the fabric's (the controller
        routed around them)."""
        report = services.monitor.report()
        lost = self.lost_switches
        if lost:
            report["verdict"] = "degraded"
            report.setdefault("reasons", []).append(
                f"switch(es) {', '.join(lost)} lost their vswitchd during the run (an emulator "
                "fault, not the fabric's)")
        if self.exp.time_scale is not None:  # the real fabric's regime, as run
            kept, reasons = timescale.judge(self.exp.time_scale,
                                            [r.transport for r in self.doc.collectives],
                                            self._relay())
            report["time_scale"] = kept
            if reasons:
                report["verdict"] = "degraded"
                report.setdefault("reasons", []).extend(reasons)
        return d.Fidelity.from_json(report, "fidelity")

    def _relay(self) -> dict | None:
        """The hosts' delay relay's figures (none without one): the probe before the
        workload, its lateness and CPU per packet since."""
        if self.relay_probe is None:
            return None
        now = self.relay_counters() or {}
        was = self.relay_before or {}
        packets = now.get("packets", 0) - was.get("packets", 0)
        cpu_s = now.get("cpu_s", 0.0) - was.get("cpu_s", 0.0)
        return {**self.relay_probe, "packets": packets,
                "cpu_us_per_packet": round(cpu_s / packets * 1e6, 1) if packets else None,
                "lateness_us": delayline.difference(was.get("lateness_us"),
                                                    now.get("lateness_us"))}

    def finish(self, services: Services) -> None:
        """The workload is done: the failures' throughput windows end, the document is
        complete; with ``--keep``, the user looks before the teardown."""
        if services.injector is not None:
            services.injector.finish()
            self.doc.failures = self._failures(services.injector)
        self.doc.fidelity = self._fidelity(services)
        if self.doc.provenance is not None:
            self.doc.provenance.tcp_congestion_control = results.congestion_controls(self.doc)
        write_json_atomic(self.out_dir / "timeline.json", services.monitor.timeline(),
                          indent=None)
        results.finish(self.doc)
        named = named_jobs(self.exp.workload)
        if named:
            self.doc.jobs = jobs_out.summary(self.doc, named, self.traffic.get("phases", []),
                                             _baseline(self.exp.workload.baseline))
        self.save()
        self.marks["measured"] = time.monotonic()
        if self.telemetry.keep is not None:
            self.telemetry.keep(services.telemetry)
            self.marks["kept"] = time.monotonic()

    def failed(self, err: BaseException) -> None:
        """The run ended with ``err``: the document says so."""
        results.fail(self.doc, str(err) if isinstance(err, TestbedError)
                     else f"{type(err).__name__}: {err}")

    def close(self) -> None:
        """The last word of the document: what failures applied, the phases' times."""
        if self.injector is not None:  # what was applied, also when the run failed
            self.doc.failures = self._failures(self.injector)
        self.doc.timings_s = results.run_timings(self.marks, time.monotonic())
        self.save()


def run_experiment(exp: Experiment, out_dir: Path, state_dir: Path,
                   view: RunView | None = None,
                   telemetry: TelemetryOptions | None = None,
                   shared: SharedFabric | None = None,
                   then: Experiment | None = None,
                   runner: BatchRunner = run_batch) -> d.RunDocument:
    """Build ``exp``'s fabric, run its workload, tear down; ``out_dir/results.json`` holds the
    document at every moment (written before the build, after every batch, and at the end).

    With ``shared``, the fabric comes from it (the previous run's, when it builds the same one)
    and stays up after a complete run when ``then``, the next run, can use it too.

    Returns:
        The complete results document.

    Raises:
        TestbedError: a failing job or system step (the document then holds ``error``).
        ConfigError, KeyboardInterrupt, ...: likewise recorded in the document, then raised.
    """
    view = view or RunView()
    run = ExperimentRun(exp, out_dir, view, telemetry or TelemetryOptions())
    run.begin()
    try:
        pool = shared or SharedFabric(state_dir)
        run.doc.fabric_reused = pool.reusable(exp)  # the previous run's, new controller
        keep = then is not None and pool.can_share(exp, then)
        view.building(run.doc.fabric_reused)
        with pool.use(exp, keep) as fabric, ExitStack() as stack:
            services = run.start_services(fabric, stack)
            run.measure(fabric, services, runner)
            run.finish(services)
            if not keep:
                view.tearing_down()
    except BaseException as err:
        run.failed(err)
        raise
    finally:
        run.close()
    return run.doc
