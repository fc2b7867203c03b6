"""The actor on one machine of a cluster (:class:`MachineAgent`): it builds that machine's part
of a fabric with :class:`testbed.fabric.fabric.Fabric` itself, runs processes in its hosts for
the coordinator, reads its counters, fails its ends of links, runs a whole sweep cell, and
tears down. Its run records live in :func:`machine_state_dir`, so ``fabriclab clean`` there, or
the next run, removes what a dead actor left."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

from testbed.errors import ConfigError, TestbedError
from testbed.plan.remote import checked_argv
from testbed.runs.registry import DEFAULT_STATE_DIR


class MachineAgent:
    """The actor on one machine (``ray.remote`` applied by :class:`Cluster`, threaded: a
    call that waits for a process does not hold up the others). It builds the machine's part
    of a fabric with :class:`testbed.fabric.fabric.Fabric` itself (its run record in
    :func:`machine_state_dir`, so ``fabriclab clean`` there, or the next run, removes what a
    dead actor left), runs processes in its hosts for the coordinator, and tears down."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.fabric = None  # this machine's part (testbed.fabric.fabric.Fabric)
        self.procs: dict[int, object] = {}  # pid -> subprocess.Popen started for the run
        self.monitor = None
        self._stop_monitor = None

    def probe(self) -> dict:
        import ray

        from testbed.linux.environment import software_versions
        from testbed.linux.netlink import Netlink

        ip = ray.util.get_node_ip_address()
        nl = Netlink()
        try:
            mtu = nl.mtu_of_address(ip)
        finally:
            nl.close()
        versions = software_versions()
        return {"name": self.name, "underlay": ip, "underlay_mtu": mtu,
                "fabriclab": versions["fabriclab"], "kernel": platform.release(),
                "cores": os.cpu_count(), "revision": versions["git_revision"]}

    # -- the fabric's part -----------------------------------------------------------------
    def build(self, spec: object, part: object, controller_at: object,
              controller_pki: object = None) -> dict:
        """Build this machine's part of a fabric, its switches connecting to
        ``controller_at`` (over TLS with ``controller_pki``, the switches' certificates);
        returns the run's id, directory, step timings and warnings. On failure nothing of it
        stays. Everything arrives as data and is checked before anything is built: ``spec``
        a :class:`testbed.model.partition.PartSpec` as plain data, ``part`` the names of the
        machine's share (:func:`testbed.model.partition.part_to_plain`), ``controller_at``
        an address and a port."""
        from testbed.fabric.fabric import Fabric
        from testbed.fabric.lifecycle import up_or_down
        from testbed.linux.pki import check_switch_pki
        from testbed.model.partition import PartSpec, part_from_plain
        from testbed.model.plain import from_plain

        if self.fabric is not None:
            raise TestbedError(f"{self.name}: a fabric part is already up here")
        try:
            typed = from_plain(PartSpec, spec)
            share = part_from_plain(typed.topology, part)
            pki = None if controller_pki is None else check_switch_pki(controller_pki)
        except (TypeError, ValueError) as err:  # (a ConfigError is a ValueError)
            raise ConfigError("build", f"{self.name}: refused: {err}") from None
        if share.machine != self.name:
            raise ConfigError("part.machine", f"this is machine {self.name}, not "
                                              f"{share.machine!r}")
        address = _controller_address(controller_at)
        fabric = Fabric(typed, machine_state_dir(self.name), part=share,
                        controller_at=address, controller_pki=pki)
        up_or_down(fabric)  # a failed build tears itself down
        self.fabric = fabric
        return {"run_id": fabric.record.run_id, "run_dir": str(fabric.run_dir),
                "timings": dict(fabric.timings), "warnings": list(fabric.warnings),
                "red_marking": fabric.red_marking, "datapath": fabric.datapath_type,
                "vswitchds": fabric.vswitchd_count}

    def settle(self) -> None:
        self._part().settle()

    def teardown(self) -> dict:
        """Take this machine's part down; returns its teardown time."""
        fabric, self.fabric = self.fabric, None
        if fabric is None:
            return {}
        self.stop_monitor()
        self.procs.clear()
        fabric.down()
        return {"down_total": fabric.timings.get("down_total", 0.0)}

    def _part(self):
        if self.fabric is None:
            raise TestbedError(f"{self.name}: no fabric part is up here")
        return self.fabric

    # -- processes in its hosts ---------------------------------------------------------------
    def spawn(self, host: str, argv: list[str], role: str) -> int:
        """Start ``argv`` in ``host`` (text pipes), in the run directory; returns its PID.
        Only what a fabric's plan runs is accepted (:func:`testbed.plan.remote.checked_argv`):
        whoever reaches the cluster reaches this method."""
        fabric = self._part()
        if host not in fabric.topo.nodes or fabric.topo.nodes[host].is_switch:
            raise TestbedError(f"refused to run on {host!r}: not a host of this fabric")
        argv = checked_argv(argv, sys.executable)
        proc = fabric.spawn(host, argv, role, cwd=str(fabric.run_dir))
        self.procs[proc.pid] = proc
        return proc.pid

    def communicate(self, pid: int, timeout_s: float):
        """``(returncode, stdout, stderr)`` once the process ends, or None after ``timeout_s``
        (call again: output read so far is kept)."""
        import subprocess

        proc = self.procs[pid]
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
        return proc.returncode, out, err

    def poll(self, pid: int) -> int | None:
        return self.procs[pid].poll()

    def stop(self, pid: int, timeout_s: float = 5.0) -> int | None:
        proc = self.procs.pop(pid, None)
        if proc is None or self.fabric is None:
            return None
        return self.fabric.stop(proc, timeout_s)

    def run_parallel(self, commands: dict[str, list[str]], timeout_s: float) -> dict:
        return self._part().run_parallel(commands, timeout_s)

    def write_file(self, name: str, text: str) -> None:
        self._part().write_file(name, text)

    def read_file(self, name: str) -> str:
        return self._part().read_file(name)

    # -- what the coordinator reads ----------------------------------------------------------
    def state(self) -> dict:
        """Port states, dead switches and service errors here (the coordinator's checks)."""
        fabric = self._part()
        return {"ports": fabric.port_states(), "dead": sorted(fabric.dead_switches()),
                "errors": list(fabric.service_errors)}

    def congestion(self) -> dict:
        return self._part().congestion()

    def link_counters(self, names: set[str]) -> dict:
        from testbed.linux.netlink import Netlink

        with Netlink() as nl:  # the exporter's scrape thread, not the build's socket
            return self._part().link_counters(names & self._part().switch_ports(), nl)

    def cpu_times(self) -> dict[str, dict]:
        return self._part().cpu_times()

    def set_links(self, pairs: list[tuple[str, str]], up: bool) -> dict[str, float]:
        """Fail or repair this machine's ends of the links (:meth:`Fabric.set_links`)."""
        from testbed.linux.netlink import Netlink

        with Netlink() as nl:  # this call's own sockets (the actor is threaded)
            return self._part().set_links(pairs, up, nl)

    def cut_drops(self, pairs: list[tuple[str, str]]) -> int | None:
        from testbed.linux.netlink import Netlink

        with Netlink() as nl:
            return self._part().cut_drops(pairs, nl)

    def set_rates(self, pairs: list[tuple[str, str]], factor: float) -> dict[str, float]:
        """Degrade this machine's ends of the links (:meth:`Fabric.set_rates`)."""
        from testbed.linux.netlink import Netlink

        with Netlink() as nl:
            return self._part().set_rates(pairs, factor, nl)

    def offered_bytes(self, names: set[str]) -> dict[str, int] | None:
        return self._part().offered_bytes(names & self._part().switch_ports())

    def switch_notices(self) -> list[tuple[float, str, int, tuple[int, ...]]]:
        return self._part().switch_notices()

    def largest_packets(self, names: set[str]) -> dict[str, int]:
        return self._part().largest_packets(names & self._part().switch_ports())

    def start_monitor(self, queue_interval_s: float) -> None:
        self.stop_monitor()
        self.monitor, self._stop_monitor = self._part().start_monitor(queue_interval_s)

    def monitor_read(self, what: str) -> dict:
        """The monitor's ``snapshot`` (queue samples), ``report`` (fidelity verdict) or
        ``timeline`` so far (empty without a monitor)."""
        if what not in ("snapshot", "report", "timeline"):
            raise ValueError(f"the monitor has no {what}")
        return getattr(self.monitor, what)() if self.monitor is not None else {}

    def stop_monitor(self) -> None:
        if self._stop_monitor is not None:
            self._stop_monitor()
        self._stop_monitor = None


def machine_state_dir(name: str, root: Path = DEFAULT_STATE_DIR) -> Path:
    """Where a cluster machine keeps its part's run records: apart from a single-machine
    fabric's (and from other namespace machines' of this host)."""
    return root / "machines" / name


def machine_state_dirs(root: Path = DEFAULT_STATE_DIR) -> list[Path]:
    """Every cluster machine's state directory under ``root`` (``fabriclab clean``)."""
    folder = machine_state_dir("-", root).parent
    return sorted(p for p in folder.glob("*") if p.is_dir()) if folder.is_dir() else []


def _controller_address(value: object) -> tuple[str, int]:
    """The controller's ``(address, port)`` as it arrives (a list of two).

    Raises:
        ConfigError: anything else.
    """
    import ipaddress

    try:
        host, port = value
        ipaddress.ip_address(host)
        if not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(port)
    except (TypeError, ValueError):
        raise ConfigError("controller_at", "the controller's address is [IP, port]") from None
    return host, port
