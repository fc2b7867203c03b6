"""Run an experiment end to end: build its fabric, run its workload batch by batch, and keep
``results.json`` current as it goes (complete, or failed with what it measured and why).

The terminal (progress bar, tables) is the CLI's: it hands in a :class:`RunView`.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from fabriclab.model import results

from fabriclab.model import rundir

from fabriclab.model import sweep
from fabriclab.model.experiment import Experiment
from telemetry.exporter import LOOPBACK, RunTelemetry
from telemetry.model.promconfig import DEFAULT_SCRAPE_INTERVAL_S
from testbed.model.congestion import link_utilization, summarize_congestion
from testbed.errors import TestbedError
from testbed.fabric.fabric import Fabric
from testbed.fabric.failures import FailureInjector
from testbed.linux import environment
from testbed.linux.files import write_json_atomic, write_text_atomic
from traffic.agents.runner import run_batch
from traffic.workloads.workload import Job


MARKER = "ebpf: a virtual queue at each switch port's clsact egress (testbed/linux/progs/ecn_marker.c)"
RED_MARKER = ("red: the kernel's RED qdisc as each lossy class's leaf at the switch ports (ecn, "
              "nodrop, instantaneous backlog); lossless classes by the eBPF marker")


@dataclass(frozen=True)
class TelemetryOptions:
    """The run's telemetry. The exporters always run, on ``exporter_host:exporter_port`` (port
    0: one from the OS); ``prometheus`` (``--telemetry``) adds a Prometheus per run scraping
    them every ``interval_s``; ``keep`` (``--keep``) is called after the workload, before the
    teardown, and returns when the user is done looking."""

    prometheus: bool = False
    interval_s: float = DEFAULT_SCRAPE_INTERVAL_S
    keep: Callable[[RunTelemetry], None] | None = None
    variant: str | None = None
    exporter_host: str = LOOPBACK
    exporter_port: int = 0


class RunView:
    """What a run shows while it goes; the default shows nothing."""

    def building(self, reused: bool = False) -> None:
        """The fabric is being built (``reused``: the previous run's gets a new controller)."""

    def started(self, fabric: Fabric, total: int) -> None:
        """The fabric is up; ``total`` collectives will run."""

    def telemetry(self, telemetry: RunTelemetry) -> None:
        """Prometheus is up and scraping."""

    def batch(self, jobs: list[Job]) -> None:
        """A batch of jobs starts."""

    def measured(self, count: int) -> None:
        """``count`` more collectives were measured."""

    def tearing_down(self) -> None:
        """The fabric is being torn down."""


def batch_text(jobs: list[Job]) -> str:
    """``all_reduce 4194304 B x2 on 16 ranks (+1 at once)``."""
    first = jobs[0].collectives[0]
    return (f"{first.op} {first.schedule.size_bytes} B x{len(jobs[0].collectives)} on "
            f"{len(first.hosts)} ranks" + (f" (+{len(jobs) - 1} at once)" if len(jobs) > 1
                                          else ""))


def make_fabric(exp: Experiment, state_dir: Path,
                log: Callable[[str], None] = lambda _msg: None):
    """The fabric ``exp`` asks for: on one machine (:class:`Fabric`), or partitioned over the
    Ray cluster its ``cluster`` section names (:class:`testbed.cluster.coordinator.ClusterFabric`,
    which offers a run the same)."""
    if exp.cluster is None:
        return Fabric(exp, state_dir=state_dir, log=log)
    from testbed.cluster.coordinator import ClusterFabric  # Ray only for a cluster

    return ClusterFabric(exp, exp.cluster.address, state_dir, log, exp.cluster.machines)


class SharedFabric:
    """The fabric consecutive runs share (a sweep's cells): a run whose fabric section equals
    the previous run's (:func:`fabriclab.model.sweep.fabric_key`) runs on the same namespaces, links,
    switches and markers with a fresh controller; anything else builds anew. A fabric whose
    state outlives a run is never shared: one with failures (links or switches left down) or
    with PFC (pauses and deadlocks), nor one whose run failed.

    A single run uses one of its own and closes it at its end, as :func:`run_experiment` does
    without one.
    """

    def __init__(self, state_dir: Path, build: Callable[..., Fabric] = make_fabric) -> None:
        self.state_dir = state_dir
        self.build = build
        self.fabric: Fabric | None = None
        self.key: str | None = None
        self.builds = 0
        self.reuses = 0

    @staticmethod
    def shareable(exp: Experiment) -> bool:
        """Whether a run of ``exp`` leaves its fabric as it found it (queues drain)."""
        return not exp.failures and exp.pfc is None

    def can_share(self, first: Experiment, then: Experiment) -> bool:
        """Whether ``then`` can run on the fabric ``first`` ran on."""
        return (self.shareable(first) and self.shareable(then)
                and sweep.fabric_key(first.raw) == sweep.fabric_key(then.raw))

    def reusable(self, exp: Experiment) -> bool:
        """Whether :meth:`acquire` would hand ``exp`` the fabric that is up."""
        return (self.fabric is not None and self.shareable(exp)
                and sweep.fabric_key(exp.raw) == self.key)

    @contextmanager
    def use(self, exp: Experiment, keep: bool) -> Iterator[Fabric]:
        """:meth:`acquire` for a run, :meth:`release` after it: kept up when ``keep`` and the
        run ended without an error."""
        fabric = self.acquire(exp)
        ok = False
        try:
            yield fabric
            ok = True
        finally:
            self.release(keep and ok)

    def acquire(self, exp: Experiment) -> Fabric:
        """The fabric for ``exp``: the one up when :meth:`reusable`, else a new one.

        Raises:
            TestbedError, ConfigError: the build or the controller's restart failed (nothing
                is left up).
        """
        if self.reusable(exp):
            try:
                self.fabric.restart_controller(exp)
            except BaseException:
                self.close()
                raise
            self.reuses += 1
            return self.fabric
        self.close()
        fabric = self.build(exp, state_dir=self.state_dir)
        fabric.__enter__()  # tears itself down when the build fails
        self.fabric, self.key = fabric, sweep.fabric_key(exp.raw)
        self.builds += 1
        return fabric

    def release(self, keep: bool) -> None:
        """The run is over: keep the fabric up for the next one, or tear it down."""
        if not keep:
            self.close()

    def close(self) -> None:
        """Tear the fabric down (nothing if none is up)."""
        fabric, self.fabric, self.key = self.fabric, None, None
        if fabric is not None:
            fabric.down()


def _keep_logs(fabric: Fabric, out_dir: Path) -> None:
    """Copy the controller's log and the agents' logs into ``out_dir/logs`` before the
    fabric's run directory goes."""
    logs = out_dir / "logs"
    logs.mkdir(exist_ok=True)
    sources = [Path(fabric.run_dir) / "controller.log",
               *sorted((Path(fabric.run_dir) / "logs").glob("*.log"))]
    for src in sources:
        try:
            shutil.copyfile(src, logs / src.name)
        except OSError:
            pass  # not written (no controller, or an agent that logged nothing)


def run_experiment(exp: Experiment, out_dir: Path, state_dir: Path,
                   view: RunView | None = None,
                   telemetry: TelemetryOptions | None = None,
                   shared: SharedFabric | None = None,
                   then: Experiment | None = None) -> dict:
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
    telemetry = telemetry or TelemetryOptions()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "results.json"
    doc = results.new_document(exp.name, exp.source, time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                               exp.fabric_summary())
    write_json_atomic(path, doc)
    if exp.real_scale is not None:
        doc["real_scale"] = exp.real_scale.factors()
    expanded = rundir.experiment_document(exp.raw)
    doc["experiment_sha256"] = expanded["sha256"]
    write_json_atomic(out_dir / "experiment.json", expanded)
    write_json_atomic(out_dir / "environment.json", environment.document())
    flows: list[list] = []
    injector = None
    marks = {"start": time.monotonic()}  # bring-up, measurement, teardown (timings_s)
    try:
        pool = shared or SharedFabric(state_dir)
        doc["fabric_reused"] = pool.reusable(exp)  # the previous run's, with a new controller
        keep = then is not None and pool.can_share(exp, then)
        view.building(doc["fabric_reused"])
        with pool.use(exp, keep) as fabric, ExitStack() as services:
            marks["up"] = time.monotonic()
            services.callback(_keep_logs, fabric, out_dir)  # also when the run fails
            errors_before = len(fabric.service_errors)
            view.started(fabric, exp.workload.collective_count)
            # the exporters always run (fabriclab top watches them); Prometheus on request
            labels = {"experiment": exp.name, **({"variant": telemetry.variant}
                                                 if telemetry.variant else {})}
            tele = services.enter_context(RunTelemetry(
                fabric, out_dir / "prometheus" if telemetry.prometheus else None,
                telemetry.interval_s, labels, str(exp.controller.routing),
                (telemetry.exporter_host, telemetry.exporter_port)))
            if telemetry.prometheus:
                doc["telemetry"] = tele.report()
                view.telemetry(tele)
            monitor, stop_monitor = fabric.start_monitor(exp.emulator.queue_sample_ms / 1e3)
            services.callback(stop_monitor)
            if exp.cluster is not None:  # the partition, the machines and their builds
                doc["cluster"] = fabric.placement()
            if exp.failures:
                injector = FailureInjector(fabric, exp.failures)
                services.callback(fabric.stop_thread,
                                  fabric.start_thread(injector, "failures"))
            before = fabric.congestion()
            began = time.monotonic()
            if injector is not None:
                injector.begin()
            for batch in exp.workload.batches():
                wait_s = batch[0].not_before_s - (time.monotonic() - began)
                if wait_s > 0:  # a replayed trace's timestamp
                    time.sleep(wait_s)
                view.batch(batch)
                for job in batch:
                    first = job.collectives[0]
                    tele.workload.started(job.index, first.label or first.op, first.op,
                                          job.transport)
                errors = []
                for outcome in run_batch(fabric, batch):
                    if outcome.error is not None:
                        errors.append(f"job {outcome.job.index} ({batch_text([outcome.job])}): "
                                      f"{outcome.error}")
                        tele.workload.finished(outcome.job.index)
                        continue
                    known = len(doc["collectives"])
                    results.add_rows(doc, outcome.job.index, outcome.results, len(batch))
                    if exp.real_scale is not None:
                        for row in doc["collectives"][known:]:
                            row["real"] = exp.real_scale.collective(row)
                    flows += rundir.flow_rows(outcome.job.index, outcome.results)
                    tele.workload.measured(outcome.job.index, doc["collectives"][known:])
                    view.measured(len(outcome.results))
                # the switch queues since the workload began (totals, per port and priority)
                now = fabric.congestion()  # one reading for the summary and the utilization
                doc["congestion"] = summarize_congestion(
                    before, now, monitor.snapshot(),
                    exp.fabric.pfc.priorities)
                doc["congestion"]["utilization"] = link_utilization(
                    fabric.topo, before, now, time.monotonic() - began)
                doc["congestion"]["marker"] = (
                    (RED_MARKER if fabric.red_marking else MARKER) if exp.fabric.marks_ecn
                    else None)
                if fabric.pfc_agent is not None:
                    doc["congestion"]["pfc"] = fabric.pfc_agent.report()
                status = fabric.controller_status()  # routing decisions so far
                doc["controller"] = {"routing": status.get("routing"),
                                     "cpu_s": status.get("cpu_s"),
                                     "links_down": status.get("links_down", []),
                                     "adaptive": status.get("adaptive")}
                if injector is not None:
                    doc["failures"] = injector.report()
                    errors += [f"failure {f['target']} {f['action']}: {e}"
                               for f in doc["failures"] for e in f["errors"]]
                errors += [f"fabric service failed: {e}"
                           for e in fabric.service_errors[errors_before:]]
                if telemetry.prometheus:
                    doc["telemetry"] = tele.report()
                doc["fidelity"] = monitor.report()
                write_json_atomic(path, doc)
                write_json_atomic(out_dir / "timeline.json", monitor.timeline(), indent=None)
                write_text_atomic(out_dir / "collectives.csv",
                                  rundir.collectives_csv(doc["collectives"]))
                write_text_atomic(out_dir / "flows.csv", rundir.flows_csv(flows))
                if errors:
                    raise TestbedError("\n".join(errors))
            if injector is not None:  # the throughput windows end with the workload
                injector.finish()
                doc["failures"] = injector.report()
            doc["fidelity"] = monitor.report()
            write_json_atomic(out_dir / "timeline.json", monitor.timeline(), indent=None)
            results.finish(doc)
            write_json_atomic(path, doc)
            marks["measured"] = time.monotonic()
            if telemetry.keep is not None:
                telemetry.keep(tele)
                marks["kept"] = time.monotonic()
            if not keep:
                view.tearing_down()
    except BaseException as err:
        results.fail(doc, f"{type(err).__name__}: {err}" if not isinstance(
            err, TestbedError) else str(err))
        raise
    finally:
        if injector is not None:  # what was applied, also when the run failed
            doc["failures"] = injector.report()
        doc["timings_s"] = results.run_timings(marks, time.monotonic())
        write_json_atomic(path, doc)
    return doc

