"""What a running fabric offers to the layers above it: the traffic runner and agents, the
telemetry exporters, failure injection and the experiment layer.

:class:`RunningFabric` is a :class:`typing.Protocol`. :class:`testbed.fabric.fabric.Fabric`
(one machine) and :class:`testbed.cluster.coordinator.ClusterFabric` (partitioned over a Ray
cluster) implement it, and the unit tests check that both, and the tests' fake fabric, keep
every member with the same parameters. Code above ``testbed`` uses nothing else of a fabric.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, Self, runtime_checkable

from testbed.model.partition import Partition
from testbed.model.spec import TestbedSpec
from testbed.model.topology import Topology
from testbed.plan.fidelity import FidelityVerdict
from testbed.plan.reachability import Reachability


class Process(Protocol):
    """A process a fabric started in one of its hosts (``subprocess.Popen`` on one machine, a
    machine actor's process on a cluster)."""

    pid: int
    returncode: int | None

    def communicate(self, timeout: float | None = None) -> tuple[str, str]: ...

    def poll(self) -> int | None: ...


class Monitor(Protocol):
    """A run's samples (:class:`testbed.fabric.monitor.RunMonitor`, or every machine's)."""

    def snapshot(self) -> dict: ...

    def report(self) -> dict: ...

    def timeline(self) -> dict: ...


@runtime_checkable
class RunningFabric(Protocol):
    """A fabric that is up (between ``__enter__`` and ``__exit__``)."""

    spec: TestbedSpec
    topo: Topology
    #: the fabric's partition over machines (None: one machine)
    plan: Partition | None
    timings: dict[str, float]
    warnings: list[str]
    #: what the fabric's service threads died of
    service_errors: list[str]
    #: the controller's deaths: {t, event, cause, pid} (its watch, on the machine running it)
    controller_events: list[dict]
    #: this machine's fidelity verdict (None: not assessed here)
    fidelity: FidelityVerdict | None
    red_marking: bool
    #: the PFC agent (None: no lossless priority)
    pfc_agent: Any
    #: the run record (:class:`testbed.runs.registry.RunRecord`; None once down)
    record: Any

    # -- lifecycle ----------------------------------------------------------------------------
    def __enter__(self) -> Self: ...

    def __exit__(self, *exc: object) -> None: ...

    def up(self) -> None: ...

    def down(self) -> None: ...

    def restart_controller(self, spec: TestbedSpec) -> None: ...

    # -- what it is ---------------------------------------------------------------------------
    @property
    def run_dir(self) -> Path: ...

    @property
    def datapath_type(self) -> str | None: ...

    @property
    def vswitchd_count(self) -> int: ...

    @property
    def controller_address(self) -> str: ...

    def controller_status(self) -> dict: ...

    def placement(self) -> dict | None: ...

    # -- services and processes ---------------------------------------------------------------
    def spawn(self, host: str | None, argv: list[str], role: str,
              **popen_kwargs: Any) -> Process: ...

    def stop(self, proc: Any, timeout_s: float = 5.0) -> int | None: ...

    def start_thread(self, target: Callable[[threading.Event], None],
                     role: str) -> threading.Thread: ...

    def stop_thread(self, thread: threading.Thread) -> None: ...

    def start_monitor(self, queue_interval_s: float) -> tuple[Monitor, Callable[[], None]]: ...

    def track_process(self, pid: int, role: str) -> None: ...

    def track_file(self, path: Path) -> None: ...

    def write_file(self, name: str, text: str) -> Path: ...

    def read_file(self, name: str, host: str | None = None) -> str: ...

    def run_parallel(self, commands: dict[str, list[str]],
                     timeout_s: float) -> dict[str, tuple[int, str, str]]: ...

    # -- what it measures and what can be done to it -----------------------------------------
    def reachability(self, count: int = 2, timeout_s: float = 120.0) -> Reachability: ...

    def cut_off(self, hosts: list[str]) -> str | None: ...

    def dead_switches(self) -> set[str]: ...

    def congestion(self, netlink: Any = None) -> dict[str, dict]: ...

    def link_counters(self, names: set[str], netlink: Any = None) -> dict: ...

    def switch_ports(self) -> set[str]: ...

    def vswitchd_pids(self) -> dict[str, int]: ...

    def cpu_times(self) -> dict[str, dict]: ...

    def set_links(self, pairs: list[tuple[str, str]], up: bool,
                  netlink: Any = None) -> dict[str, float]: ...

    def cut_drops(self, pairs: list[tuple[str, str]], netlink: Any = None) -> int | None: ...
