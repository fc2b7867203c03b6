"""What a running fabric offers to the layers above it (pure: protocols only), one role per
kind of user:

- :class:`TrafficFabric`: what runs traffic needs (processes in hosts, files of the run,
  service threads, commands in every host at once);
- :class:`TelemetryFabric`: what samples it (queues, counters, CPU, the run monitor);
- :class:`FailureFabric`: what fails it (links cut and repaired, who is cut off);
- :class:`FabricLifecycle`: what brings it up, takes it down, and runs the next experiment's
  controller on it;

all four over :class:`FabricDescription` (what it is), and :class:`RunningFabric`, all of
them: what the experiment layer drives. :class:`testbed.fabric.fabric.Fabric` (one machine)
and :class:`testbed.cluster.coordinator.ClusterFabric` (partitioned over a Ray cluster)
implement it, and the unit tests check that both, and the tests' fake fabric, keep every
member with the same parameters. Code above ``testbed`` uses nothing else of a fabric.
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


class FabricDescription(Protocol):
    """What a fabric that is up is: its spec, model, partition, how its build went."""

    spec: TestbedSpec
    topo: Topology
    #: the fabric's partition over machines (None: one machine)
    plan: Partition | None
    timings: dict[str, float]
    warnings: list[str]
    #: this machine's fidelity verdict (None: not assessed here)
    fidelity: FidelityVerdict | None
    red_marking: bool

    #: the run record (:class:`testbed.runs.registry.RunRecord`; None once down)
    record: Any
    #: what the fabric's service threads died of
    service_errors: list[str]
    #: the controller's deaths and restarts: {t, event, cause, pid, ...}
    controller_events: list[dict]
    #: the PFC agent (None: no lossless priority, or on a cluster)
    pfc_agent: Any

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

    def delay_relay_counters(self) -> dict | None:
        """The hosts' delay relay's counters (:mod:`testbed.linux.tunrelay`); None: no relay
        here, or its counters are on other machines."""
        ...


class TrafficFabric(FabricDescription, Protocol):
    """What running traffic on a fabric uses (:mod:`traffic.agents`)."""

    def spawn(self, host: str | None, argv: list[str], role: str,
              **popen_kwargs: Any) -> Process: ...

    def stop(self, proc: Any, timeout_s: float = 5.0) -> int | None: ...

    def start_thread(self, target: Callable[[threading.Event], None],
                     role: str) -> threading.Thread: ...

    def stop_thread(self, thread: threading.Thread) -> None: ...

    def track_process(self, pid: int, role: str) -> None: ...

    def track_file(self, path: Path) -> None: ...

    def write_file(self, name: str, text: str) -> Path: ...

    def read_file(self, name: str, host: str | None = None) -> str: ...

    def run_parallel(self, commands: dict[str, list[str]],
                     timeout_s: float) -> dict[str, tuple[int, str, str]]: ...

    def reachability(self, count: int = 2, timeout_s: float = 120.0) -> Reachability: ...

    def cut_off(self, hosts: list[str]) -> str | None:
        """Why some of ``hosts`` no longer reach each other (a job's ranks cut off)."""


class TelemetryFabric(FabricDescription, Protocol):
    """What sampling a fabric uses (:mod:`telemetry`, the run monitor)."""

    def track_process(self, pid: int, role: str) -> None: ...

    def track_file(self, path: Path) -> None: ...

    def start_monitor(self, queue_interval_s: float) -> tuple[Monitor, Callable[[], None]]: ...

    def congestion(self, netlink: Any = None) -> dict[str, dict]: ...

    def link_counters(self, names: set[str], netlink: Any = None) -> dict: ...

    def switch_ports(self) -> set[str]: ...

    def vswitchd_pids(self) -> dict[str, int]: ...

    def cpu_times(self) -> dict[str, dict]: ...


class FailureFabric(FabricDescription, Protocol):
    """What failing a fabric's links uses (planned failures, ``fabriclab fail``)."""

    def set_links(self, pairs: list[tuple[str, str]], up: bool,
                  netlink: Any = None) -> dict[str, float]: ...

    def cut_drops(self, pairs: list[tuple[str, str]], netlink: Any = None) -> int | None: ...

    def set_rates(self, pairs: list[tuple[str, str]], factor: float,
                  netlink: Any = None) -> dict[str, float]: ...

    def offered_bytes(self, names: set[str]) -> dict[str, int] | None: ...

    def largest_packets(self, names: set[str]) -> dict[str, int]: ...

    def switch_notices(self) -> list[tuple[float, str, int, tuple[int, ...]]]: ...

    def cut_off(self, hosts: list[str]) -> str | None: ...

    def link_counters(self, names: set[str], netlink: Any = None) -> dict: ...

    def dead_switches(self) -> set[str]: ...


class FabricLifecycle(Protocol):
    """Bringing a fabric up and down, and the next experiment's controller on it."""

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc: object) -> None: ...

    def up(self) -> None: ...

    def down(self) -> None: ...

    def restart_controller(self, spec: TestbedSpec) -> None: ...


@runtime_checkable
class RunningFabric(TrafficFabric, TelemetryFabric, FailureFabric, FabricLifecycle, Protocol):
    """A fabric that is up (between ``__enter__`` and ``__exit__``): every role."""
