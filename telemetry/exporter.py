"""The exporters' adapters: prometheus-client collectors that read the fabric (one netlink link
dump and one qdisc dump per scrape, the marker's and the PFC agent's maps), the workload's
progress and ``/proc``, and an HTTP server for them on 127.0.0.1.

Each collector reads its source when Prometheus scrapes (``collect()``), in the scrape's own
thread with its own netlink socket, so nothing goes stale between scrapes and nothing polls in
the background. :mod:`telemetry.model.metrics` shapes the readings.
"""

from __future__ import annotations

import platform
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import Metric

from telemetry.model import metrics
from telemetry.model.promconfig import (DISCOVERY_DIR, LOOPBACK, MIN_SCRAPE_INTERVAL_S,
                                         discovery_groups)
from telemetry.prometheus import Prometheus
from testbed.contract import TelemetryFabric
from testbed.linux.files import write_json_atomic
from testbed.linux.netlink import Netlink
from traffic.measure.rows import CollectiveRow



def _version() -> str:
    try:
        return version("fabriclab")
    except PackageNotFoundError:  # a checkout never installed
        return "unknown"


BUILD_INFO = metrics.build_info(_version(), platform.python_version())


#: the least time between two netlink reads of one exporter: scrapes closer together (anyone
#: on the machine may ask as often as they like) are answered from the last reading
MIN_READ_INTERVAL_S = MIN_SCRAPE_INTERVAL_S


class FabricCollector:
    """Every switch port's counters, queues, marks, pauses and state, read at most once per
    :data:`MIN_READ_INTERVAL_S` however often it is scraped.

    Args:
        fabric: the running :class:`testbed.fabric.fabric.Fabric`.
    """

    def __init__(self, fabric: TelemetryFabric) -> None:
        self._cached: tuple[float, list[Metric]] | None = None  # (read at, families)
        self.fabric = fabric
        self.ports = metrics.port_labels(fabric.topo)
        self.lock = threading.Lock()  # one scrape at a time on the netlink socket
        self.netlink: Netlink | None = None
        self.scrape_s = 0.0  # the last scrape's reading time
        self.scrapes = 0
        self.cpu_s = 0.0  # CPU time of every scrape so far (reading and shaping)

    def collect(self) -> Iterator[Metric]:
        yield from self.read()

    def read(self) -> list[Metric]:
        """The fabric's metric families: read now, or the last reading if it is under
        :data:`MIN_READ_INTERVAL_S` old."""
        with self.lock:
            start, cpu = time.monotonic(), time.thread_time()
            if self._cached is not None and start - self._cached[0] < MIN_READ_INTERVAL_S:
                return self._cached[1]
            if self.netlink is None:
                self.netlink = Netlink()
            links = self.fabric.link_counters(set(self.ports), self.netlink)
            congestion = self.fabric.congestion(self.netlink)
            self.scrape_s = time.monotonic() - start
            families = metrics.fabric_families(self.ports, links, congestion)
            self._cached = (start, families)
            self.scrapes += 1
            self.cpu_s += time.thread_time() - cpu
            return families

    def close(self) -> None:
        with self.lock:
            if self.netlink is not None:
                self.netlink.close()
                self.netlink = None


@dataclass
class WorkloadState:
    """The workload's progress as the runner reports it (thread-safe)."""

    routing: str
    rows: list[CollectiveRow] = field(default_factory=list)
    running: dict[int, dict] = field(default_factory=dict)  # job index -> what runs
    lock: threading.Lock = field(default_factory=threading.Lock)

    def started(self, job: int, label: str, op: str, transport: str) -> None:
        with self.lock:
            self.running[job] = {"job": job, "label": label, "op": op,
                                 "transport": transport,
                                 "started_s": time.time()}

    def measured(self, job: int, rows: list[CollectiveRow]) -> None:
        with self.lock:
            self.rows.extend(rows)
            self.running.pop(job, None)

    def finished(self, job: int) -> None:
        with self.lock:
            self.running.pop(job, None)

    def snapshot(self) -> tuple[list[CollectiveRow], list[dict]]:
        with self.lock:
            return list(self.rows), list(self.running.values())


class CallbackCollector:
    """Metric families from a function called at every scrape (a process's own counters)."""

    def __init__(self, families: Callable[[], list[Metric]]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families()


class WorkloadCollector:
    """Collective durations, bandwidths and transport counters so far."""

    def __init__(self, state: WorkloadState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        rows, running = self.state.snapshot()
        yield from metrics.collective_families(rows, self.state.routing, running)


class FidelityCollector:
    """Each machine's CPU by mode and each vswitchd's CPU (one machine, or every machine of a
    cluster: :meth:`testbed.fabric.fabric.Fabric.cpu_times`).

    Args:
        fabric: the running fabric (its private vswitchds on the userspace datapath, else the
            system's).
    """

    def __init__(self, fabric: TelemetryFabric) -> None:
        self.fabric = fabric

    def collect(self) -> Iterator[Metric]:
        yield from metrics.fidelity_families(self.fabric.cpu_times())


def standard_registry() -> CollectorRegistry:
    """A registry with what every exporter serves: its process (the standard
    ``process_cpu_seconds_total``, memory, open files, start time) and its build
    (``fabriclab_build_info``)."""
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    registry.register(CallbackCollector(lambda: [BUILD_INFO]))
    return registry


class Exporter:
    """A registry of collectors served over HTTP on 127.0.0.1 (port from the OS unless set);
    a context manager that stops the server on exit.

    Args:
        collectors: what to serve.
        port: the port (0: one the OS picks).
        host: the address (loopback unless told otherwise).
    """

    def __init__(self, collectors: list, port: int = 0, host: str = LOOPBACK) -> None:
        self.registry = standard_registry()
        for collector in collectors:
            self.registry.register(collector)
        self.collectors = collectors
        self.host, self.port = host, port
        self.server = None
        self.thread = None

    def __enter__(self) -> Exporter:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, or_any: bool = False) -> Exporter:
        """Serve (in a daemon thread); ``or_any``: on a port from the OS if the one asked
        for is taken."""
        try:
            self.server, self.thread = start_http_server(self.port, addr=self.host,
                                                         registry=self.registry)
        except OSError:
            if not (or_any and self.port):
                raise
            self.server, self.thread = start_http_server(0, addr=self.host,
                                                         registry=self.registry)
        self.port = self.server.server_port
        return self

    def stop(self) -> None:
        """Stop serving and close the collectors."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.thread.join(5)
            self.server = None
        for collector in self.collectors:
            close = getattr(collector, "close", None)
            if close is not None:
                close()

    @property
    def target(self) -> str:
        """``host:port`` as Prometheus scrapes it."""
        return f"{self.host}:{self.port}"


TELEMETRY_FILE = "telemetry.json"  # in the fabric's run directory: where its exporters are


class RunTelemetry:
    """A running fabric's telemetry: its exporter (fabric, workload, fidelity; always, so
    ``fabriclab top`` can watch any fabric), the controller's, and with ``directory`` a
    Prometheus scraping both into it. A context manager; on exit it waits for a last scrape,
    then stops Prometheus and the exporter.

    Args:
        fabric: the running fabric.
        directory: where Prometheus keeps its configuration and data (None: no Prometheus).
        interval_s: the scrape interval.
        labels: labels on every series (``experiment``, ``variant``).
        routing: the controller's routing mode (a label of the workload's series).
        address: the fabric exporter's host and port (0: one from the OS).
        discovery_dir: where a standing Prometheus (the lab VM's) discovers exporters; when
            that folder exists, the run's exporters are announced there while it runs.
    """

    def __init__(self, fabric: TelemetryFabric, directory: Path | None, interval_s: float,
                 labels: dict[str, str], routing: str,
                 address: tuple[str, int] = (LOOPBACK, 0),
                 discovery_dir: Path = DISCOVERY_DIR) -> None:
        self.fabric = fabric
        self.directory = Path(directory) if directory is not None else None
        self.interval_s = interval_s
        self.labels = labels
        self.workload = WorkloadState(routing)
        self.fabric_collector = FabricCollector(fabric)
        self.stack = ExitStack()
        self.exporter: Exporter | None = None
        self.prometheus: Prometheus | None = None
        self.targets: dict[str, list[str]] = {}
        self.address = address
        self.discovery_dir = Path(discovery_dir)
        self.announced: list[Path] = []

    def __enter__(self) -> RunTelemetry:
        with ExitStack() as stack:
            self.exporter = stack.enter_context(Exporter(
                [self.fabric_collector, WorkloadCollector(self.workload),
                 FidelityCollector(self.fabric)], port=self.address[1], host=self.address[0]))
            self.targets = {"fabric": [self.exporter.target]}
            controller = self.fabric.controller_status().get("metrics")
            if controller:
                self.targets["controller"] = [controller]
            if self.directory is not None:
                self.prometheus = stack.enter_context(Prometheus(
                    self.directory, self.targets, self.interval_s, self.labels,
                    track=lambda pid: self.fabric.track_process(pid, "prometheus")))
            write_json_atomic(self.fabric.run_dir / TELEMETRY_FILE, self.report())
            stack.callback(self._withdraw)
            self._announce()
            self.stack = stack.pop_all()
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self.prometheus is not None and exc[0] is None \
                    and self.prometheus.ended() is None:
                self.prometheus.wait_scraped()  # the last counters are in the data
        finally:
            self.stack.close()

    def _announce(self) -> None:
        """Tell a standing Prometheus about the exporters (one discovery file per job)."""
        if not self.discovery_dir.is_dir():
            return
        run_id = self.fabric.record.run_id
        labels = {**self.labels, "run": run_id}
        for job, hosts in sorted(self.targets.items()):
            path = self.discovery_dir / f"{run_id}.{job}.json"
            self.fabric.track_file(path)  # fabriclab clean removes it after a crash
            write_json_atomic(path, discovery_groups(hosts, labels))
            self.announced.append(path)

    def _withdraw(self) -> None:
        for path in self.announced:
            path.unlink(missing_ok=True)
        self.announced.clear()

    def report(self) -> dict:
        """For ``results.json``: where the exporters and the data are."""
        doc = {"targets": self.targets,
               "fabric_scrape_s": round(self.fabric_collector.scrape_s, 4)}
        if self.prometheus is not None:
            doc.update(prometheus=self.prometheus.url, data=str(self.directory / "data"),
                       scrape_interval_s=self.interval_s)
            ended = self.prometheus.ended()
            if ended:  # a lost server is said, not hidden: the data has a hole
                doc["errors"] = [ended]
        return doc
