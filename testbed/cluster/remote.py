"""What a cluster's coordinator reaches on its machines: a process an actor started in a host
(as the runner uses a ``subprocess.Popen``), the run monitor of every machine as one, calls on
several machines at once, and ``fabriclab fail`` on a fabric that ``fabriclab up --cluster``
keeps running (its actors found by name from the coordinator's run directory)."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from testbed.cluster.machines import Cluster, MachineHandle
from testbed.model.partition import links_by_machine
from testbed.plan.fidelity import merge_fidelity, merge_timelines

T = TypeVar("T")
#: in the coordinator's run directory while the fabric is up: the cluster's address, each
#: machine's actor by name, and which machine builds each node
CLUSTER_FILE = "cluster.json"


class RemoteProcess:
    """A process a machine's actor started in one of its hosts, as the runner uses a
    ``subprocess.Popen``: ``communicate(timeout=)``, ``poll()``, ``returncode``, ``pid``."""

    def __init__(self, handle: MachineHandle, machine: str, pid: int, argv: list[str]) -> None:
        self.handle, self.machine, self.pid, self.args = handle, machine, pid, argv
        self.returncode: int | None = None

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        wait_s = 3600.0 if timeout is None else timeout
        done = self.handle.communicate(self.pid, wait_s)
        if done is None:
            raise subprocess.TimeoutExpired(self.args, wait_s)
        self.returncode, out, err = done
        return out, err

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.handle.poll(self.pid)
        return self.returncode


class ClusterMonitor:
    """The run monitor of every machine (each samples its own CPU, vswitchds and ports): the
    queue samples of all ports, one fidelity verdict (degraded when a machine's is, its
    reasons named by machine, every machine's verdict under ``machines``) and one timeline."""

    def __init__(self, on_all: Callable[[Callable[[MachineHandle], T]], dict[str, T]]) -> None:
        self.on_all = on_all  # a call on every machine at once

    def _read(self, what: str) -> dict[str, dict]:
        return self.on_all(lambda m: m.monitor_read(what))

    def snapshot(self) -> dict:
        return {port: values for data in self._read("snapshot").values()
                for port, values in data.items()}

    def report(self) -> dict:
        return merge_fidelity(self._read("report"))

    def timeline(self) -> dict:
        return merge_timelines(self._read("timeline"))


def local_address_towards(address: str) -> str:
    """This machine's address on the route to ``address`` (``host:port``): where the
    cluster's machines reach the controller."""
    host = address.rsplit(":", 1)[0]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((host, 9))  # no packet is sent: the kernel only picks the route
        return sock.getsockname()[0]


def on_each(cluster, names: list[str], call: Callable[[MachineHandle], T]) -> dict[str, T]:
    """``call(machine)`` on each of ``names`` at once; the first error is raised."""
    if len(names) == 1:
        return {names[0]: call(cluster.machine(names[0]))}
    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        futures = {n: pool.submit(call, cluster.machine(n)) for n in names}
    return {n: f.result() for n, f in futures.items()}


def set_links_on_machines(cluster, by_machine: dict[str, list], up: bool) -> dict[str, float]:
    """Every machine's ends of the links at once; each step's time is the latest machine's."""
    done = on_each(cluster, list(by_machine), lambda m: m.set_links(by_machine[m.name], up))
    steps: dict[str, float] = {}
    for got in done.values():
        for step, at in got.items():
            steps[step] = max(at, steps.get(step, 0.0))
    return steps


def set_links_of_running_cluster(run_dir: Path, topo, pairs: list[tuple[str, str]],
                                 up: bool) -> dict[str, float]:
    """``fabriclab fail`` / ``restore`` on a fabric that ``fabriclab up --cluster`` keeps
    running: its actors, found by name from its :data:`CLUSTER_FILE`, fail or repair their
    machines' ends of the links at once (this process must run on a machine of the cluster,
    as Ray's drivers do).

    Raises:
        TestbedError: the cluster or the fabric's actors gone, or a machine's error.
    """
    doc = json.loads((run_dir / CLUSTER_FILE).read_text())
    cluster = Cluster(doc["address"], attach=doc["actors"])
    try:
        return set_links_on_machines(cluster, links_by_machine(topo, doc["place"], pairs), up)
    finally:
        cluster.close()
