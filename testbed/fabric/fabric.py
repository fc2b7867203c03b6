"""A running fabric: build a :class:`testbed.model.spec.TestbedSpec` on this machine, and take it down.

:class:`Fabric` is a context manager made of parts, each given what it needs when the machine
has been checked and the run recorded:

- :class:`~testbed.fabric.services.FabricRun`: the run record (everything is recorded before
  it is created), the run directory, and the fabric services (processes and threads that live
  exactly as long as the fabric, ended by PID or stop event at teardown);
- :class:`~testbed.fabric.hostlinks.HostsAndLinks`: hosts, links, tunnels, scale-up domains;
- :class:`~testbed.fabric.switches.Switches`: the switches on the datapath chosen;
- :class:`~testbed.fabric.portservices.PortServices`: the ECN marker, link cuts, PFC or CBFC;
- :class:`~testbed.fabric.controller.Controller`: the controller's process and its watch;
- :class:`~testbed.fabric.hostdelay.HostDelay`: the hosts' delay relay (``delay_line: hosts``).

Everything is removed in ``__exit__`` (normal exit, exception, Ctrl-C, or SIGTERM turned into
an exception by the CLI); after a SIGKILL, by ``fabriclab clean`` or the next fabric's build.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Self

from testbed.errors import TestbedError
from testbed.fabric.controller import Controller
from testbed.fabric.hostdelay import HostDelay
from testbed.fabric.hostlinks import HostsAndLinks
from testbed.fabric.lifecycle import probe_pairs, signals_deferred, up_or_down
from testbed.fabric.linkfail import End
from testbed.fabric.machine import check_fidelity, check_requirements, resolve_datapath
from testbed.fabric.monitor import RunMonitor
from testbed.fabric.portservices import PortServices
from testbed.fabric.services import FabricRun
from testbed.fabric.switches import Switches
from testbed.linux import capabilities
from testbed.linux.cpu import machine_cpu_s, process_cpu_s
from testbed.linux.netlink import Netlink
from testbed.linux.pki import write_switch_pki
from testbed.model.partition import MachinePart
from testbed.model.share import LocalShare
from testbed.model.spec import EcnMarker, TestbedSpec
from testbed.model.topology import Link
from testbed.plan.failplan import cut_off_reason
from testbed.plan.fidelity import FidelityVerdict
from testbed.plan.portplan import applied
from testbed.plan.reachability import Reachability
from testbed.runs.registry import DEFAULT_STATE_DIR, Registry, RunRecord

LOOPBACK = "127.0.0.1"


class Fabric:
    """One emulated fabric, up between ``__enter__`` and ``__exit__``.

    Args:
        spec: what to build (an experiment is one).
        state_dir: where run records and the capability cache live.
        log: called with progress lines.
        part: on a cluster (:mod:`testbed.cluster.coordinator`), this machine's share of the build
            (:func:`testbed.model.partition.machine_part`: its hosts, switches, links and its ends of
            the cut links as VXLAN devices); None: the whole fabric.
        controller_at: the controller's ``(address, port)`` when it runs elsewhere (a cluster's
            coordinator): the switches here connect to it, and :meth:`up` returns once they
            are made (the coordinator waits until they are programmed). None: start the
            controller here, listening on ``listen``.
        listen: the address the controller started here listens on.
        failable: links may be failed while it is up without a plan for it (``fabriclab
            fail`` on a fabric ``fabriclab up`` keeps): their cut is loaded (the eBPF
            toolchain installed when missing), as for an experiment with ``failures``.
        controller_pki: with ``controller_at``, the switches' certificates of the run
            (:meth:`testbed.linux.pki.RunPki.switch_side`): they reach it over TLS.
    """

    def __init__(self, spec: TestbedSpec, state_dir: Path = DEFAULT_STATE_DIR,
                 log: Callable[[str], None] = lambda _msg: None,
                 part: MachinePart | None = None,
                 controller_at: tuple[str, int] | None = None,
                 listen: str = LOOPBACK, failable: bool = False,
                 controller_pki: dict[str, str] | None = None) -> None:
        self.spec = spec
        self.controller_pki = controller_pki
        self.topo = spec.topology
        self.share = LocalShare(spec.topology, part)
        self.plan = None  # the whole fabric's partition over machines (a ClusterFabric's)
        self.controller_at = controller_at
        self.listen = listen
        self.failable = failable
        self.log = log
        self.run = FabricRun(Registry(state_dir), log)
        self.timings: dict[str, float] = {}
        self.warnings: list[str] = []
        self.caps: capabilities.Capabilities | None = None
        self.fidelity: FidelityVerdict | None = None
        self.datapath_choice = ""  # why the switches forward on the datapath they do
        self.netlink: Netlink | None = None
        self.links: HostsAndLinks | None = None
        self.switches: Switches | None = None
        self.ports: PortServices | None = None
        self.controller: Controller | None = None  # None: it runs elsewhere
        self.delay_relay: HostDelay | None = None  # the hosts' delay relay (delay_line: hosts)

    # -- what it is ----------------------------------------------------------------------------
    @property
    def record(self) -> RunRecord | None:
        """The run record (None before the build and once down)."""
        return self.run.record

    @property
    def run_dir(self) -> Path:
        return self.run.run_dir

    @property
    def service_errors(self) -> list[str]:
        return self.run.errors

    @property
    def controller_events(self) -> list[dict]:
        return self.controller.events if self.controller is not None else []

    @property
    def hosts(self):
        """The hosts' namespaces (:class:`testbed.linux.hosts.Hosts`)."""
        return self.links.hosts if self.links is not None else None

    @property
    def marker(self):
        return self.ports.marker if self.ports is not None else None

    @property
    def pfc_agent(self):
        return self.ports.pfc_agent if self.ports is not None else None

    @property
    def datapath_type(self) -> str | None:
        """The datapath the switches here use: ``ebpf``, or Open vSwitch's (``system``,
        ``netdev``); None before the build."""
        if self.spec.emulator.datapath == "ebpf":
            return "ebpf"
        return self.caps.datapath_type if self.caps is not None else None

    def provenance(self) -> dict:
        """What this fabric runs on, for a run's record: the datapath and why, the hosts'
        sysctls and what tc holds at each kind of link end."""
        return {"datapath": self.datapath_type or "", "datapath_why": self.datapath_choice,
                "host_sysctls": dict(self.links.sysctls) if self.links is not None else {},
                "qdiscs": applied(self.spec, self.red_marking)}

    @property
    def vswitchd_count(self) -> int:
        """The private vswitchds serving the switches here (0: the system's)."""
        return len(self.switches.instances) if self.switches is not None else 0

    @property
    def controller_address(self) -> str:
        """Where the switches here reach the controller (``host:port``)."""
        if self.controller_at is None and self.controller.channel == "unix":
            return f"unix:{self.controller.socket_path}"
        host, port = self.controller_at or self.controller.address
        return f"{host}:{port}"

    def controller_status(self) -> dict:
        return self.controller.status() if self.controller is not None else {}

    @property
    def red_marking(self) -> bool:
        """Whether the switch ports' lossy classes mark ECN with the kernel's RED qdisc (the
        experiment's ``emulator.ecn_marker``; ``auto``: where the kernel has RED)."""
        choice = self.spec.emulator.ecn_marker
        if not self.spec.fabric.marks_ecn or choice == EcnMarker.EBPF:
            return False
        return choice == EcnMarker.RED or bool(self.caps and self.caps.has_qdisc("red"))

    def placement(self) -> dict | None:
        return None  # every node on this machine

    def delay_relay_counters(self) -> dict | None:
        return self.delay_relay.counters() if self.delay_relay is not None else None

    # -- lifecycle -----------------------------------------------------------------------------
    def __enter__(self) -> Self:
        up_or_down(self)
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self, wait: bool = True) -> None:
        """Build the fabric (or this machine's part) and, ``wait``: until it is ready."""
        start = time.monotonic()
        if self.share.builds:
            self.caps = capabilities.probe(self.run.registry.state_dir)
            check_requirements(self.spec, self.caps)
        asked = self.spec.emulator.datapath
        self.spec, self.datapath_choice = resolve_datapath(self.spec, self.caps)
        if self.spec.emulator.datapath != asked:
            self.log(f"datapath {self.datapath_choice}")
        if self.share.part is None:  # a cluster's coordinator checks each machine's share
            self.fidelity, warning = check_fidelity(self.spec, self.caps.datapath_type)
            self.warnings += [warning] if warning else []
        self.run.open(orphans=self.share.part is None)
        self._make_parts()
        waits = self.controller_at is None and wait  # not a cluster machine's part
        if self.controller is not None and self.spec.controller.remote:  # none started here
            self.controller_at = self.spec.controller.remote_address
        elif self.controller is not None:
            self._step("controller", self.controller.start)
            self.run.start_thread(self.controller.watch, "controller watch")
        if self.share.builds:
            self._build()
        if waits:
            self.wait_ready()
        self.timings["up_total"] = time.monotonic() - start

    def _make_parts(self) -> None:
        self.netlink = Netlink()
        self.links = HostsAndLinks(self.spec, self.share, self.run, self.netlink,
                                   self.red_marking, self.warnings)
        self.switches = Switches(self.spec, self.share, self.run, self.netlink,
                                 self.caps.datapath_type if self.caps else "netdev",
                                 self.warnings)
        self.ports = PortServices(self.spec, self.share, self.run, self.netlink, self.links.pid,
                                  self.links.shaping, self.switches, self.warnings)
        if self.controller_at is None:
            self.controller = Controller(self.spec, self.topo, self.run, self.listen,
                                         self.switches)
        if self.spec.fabric.delay_line == "hosts":
            self.delay_relay = HostDelay(self.spec, self.share, self.run, self.netlink,
                                         self.links.pid)

    def _build(self) -> None:
        """This machine's hosts, links, tunnels, markers and switches."""
        links, ports = self.links, self.ports
        self._step("hosts", links.start_hosts)
        self._step("links", links.create_links)
        if self.share.tunnels:
            self._step("tunnels", links.create_tunnels)
        if self.topo.scale_up:
            self._step("scale-up", links.create_scale_up)
        if self.delay_relay is not None:
            self._step("delay relay", self.delay_relay.start)
        if self.spec.fabric.needs_marker:
            self._step("ecn", ports.attach_markers)
        self._step("cut", lambda: ports.load_cut(self.failable))
        self.switches.raise_send_buffer(self.red_marking)
        if any(True for _ in self.share.switches()):
            self._step("switches", self._create_switches)

    def _create_switches(self) -> None:
        ctl = self.controller
        if self.controller_at is not None:  # a cluster's coordinator's, or the user's remote
            pki = None if self.controller_pki is None else \
                write_switch_pki(self.run_dir / "pki", self.controller_pki)
            self.switches.create(self.controller_at, pki,
                                 pki.client_context if pki is not None else lambda: None)
            return
        ctl.wait_listening()
        self.switches.create(ctl.address, ctl.pki, ctl.client_tls, ctl.target)

    def wait_ready(self) -> None:
        """Wait until the controller here has programmed every switch and probed every link,
        then put back the sysctls raised for the build; start the PFC agent."""
        self._step("programmed", self.controller.wait_programmed)
        if self.spec.controller.own and self.run.record.sysctls:
            self.controller.wait_probed()  # every switch has sent: its socket exists
        self.switches.restore_sysctls()
        if self.spec.pfc is not None:
            self._step("pfc", lambda: self.ports.start_lossless(self.datapath_type or ""))

    def settle(self) -> None:
        """A cluster machine's part, once the coordinator saw every link probed: the sysctls
        raised for the build go back."""
        self.switches.restore_sysctls()

    def restart_controller(self, spec: TestbedSpec) -> None:
        """Run the next experiment on this fabric: ``spec`` builds the same fabric (the caller
        checked) with its own controller settings (:meth:`Controller.replace`)."""
        if self.run.record is None:
            raise TestbedError("restart the controller: the fabric is not up")
        start = time.monotonic()
        if self.caps is not None:  # the workload's (a TCP congestion control)
            check_requirements(spec, self.caps)
        if spec.controller.remote != self.spec.controller.remote and \
                (spec.controller.remote or self.spec.controller.remote):
            raise TestbedError("controller.remote: the next experiment's switches would need "
                               "another controller address; run it on a fabric of its own")
        # the datapath stays the one built (``auto`` was resolved when the fabric came up)
        self.spec = replace(spec, emulator=replace(spec.emulator,
                                                   datapath=self.spec.emulator.datapath))
        self.controller.replace(self.spec)
        if not spec.controller.remote:
            self.timings["controller_restart"] = time.monotonic() - start

    def down(self) -> None:
        """Remove everything this fabric created (safe to call more than once)."""
        if self.run.record is None:
            return
        start = time.monotonic()
        with signals_deferred():
            stuck = self.run.stop_threads()
            if self.links is not None:
                self.links.close()
            if self.netlink is not None:
                self.netlink.close()
                self.netlink = None
            for part in (self.switches, self.ports):
                if part is not None:
                    part.close()
            self.run.close(stuck)
            if self.controller is not None:
                self.controller.close()
        self.timings["down_total"] = time.monotonic() - start

    def _step(self, name: str, fn: Callable[[], None]) -> None:
        t0 = time.monotonic()
        fn()
        self.timings[name] = time.monotonic() - t0
        self.log(f"{name}: {self.timings[name]:.2f} s")

    # -- services (FabricRun's) ----------------------------------------------------------------
    def spawn(self, host: str | None, argv: list[str], role: str,
              **popen_kwargs) -> subprocess.Popen:
        """A process that lives at most as long as the fabric (:meth:`FabricRun.spawn`)."""
        return self.run.spawn(host, argv, role, **popen_kwargs)

    def stop(self, proc: subprocess.Popen, timeout_s: float = 5.0) -> int:
        return self.run.stop(proc, timeout_s)

    def start_thread(self, target: Callable[[threading.Event], None],
                     role: str) -> threading.Thread:
        return self.run.start_thread(target, role)

    def stop_thread(self, thread: threading.Thread) -> None:
        self.run.stop_thread(thread)

    def track_process(self, pid: int, role: str) -> None:
        self.run.track_process(pid, role)

    def track_file(self, path: Path) -> None:
        self.run.track_file(path)

    def write_file(self, name: str, text: str) -> Path:
        return self.run.write_file(name, text)

    def read_file(self, name: str, host: str | None = None) -> str:
        """A file of the run directory (``host``: where a process of that host wrote it; one
        machine here). Raises OSError when there is none."""
        return self.run.read_file(name)

    def start_monitor(self, queue_interval_s: float) -> tuple[RunMonitor, Callable[[], None]]:
        """The run's samples (:class:`testbed.fabric.monitor.RunMonitor`) as a fabric service;
        returns it and what stops it."""
        monitor = RunMonitor(self, queue_interval_s=queue_interval_s)
        thread = self.run.start_thread(monitor, "monitor")
        return monitor, lambda: self.run.stop_thread(thread)

    def run_parallel(self, commands: dict[str, list[str]],
                     timeout_s: float) -> dict[str, tuple[int, str, str]]:
        return self.links.run_parallel(commands, timeout_s)

    # -- readings ------------------------------------------------------------------------------
    def vswitchd_pids(self) -> dict[str, int]:
        return self.switches.vswitchd_pids() if self.switches is not None else {}

    def cpu_times(self) -> dict[str, dict]:
        """This machine's CPU seconds by mode, its cores and each vswitchd's CPU seconds, under
        its name (the fidelity exporter's; a cluster's has every machine)."""
        cpu = {name: process_cpu_s(pid) for name, pid in self.vswitchd_pids().items()}
        vswitchd = {name: seconds for name, seconds in cpu.items() if seconds is not None}
        serving = {name: self.switches.serving(name) for name in vswitchd}
        part = self.share.part  # this machine as telemetry names it
        machine = part.machine if part is not None else (socket.gethostname() or "local")
        return {machine: {"cpu": machine_cpu_s(), "cores": os.cpu_count() or 1,
                          "vswitchd": vswitchd, "vswitchd_switches": serving}}

    def switch_ports(self) -> set[str]:
        return self.share.switch_ports()

    def congestion(self, netlink: Netlink | None = None) -> dict[str, dict]:
        """Every switch port's queue, marking and pause counters
        (:meth:`PortServices.congestion`); another thread passes its own ``netlink``."""
        return self.ports.congestion(netlink)

    def link_counters(self, names: set[str], netlink: Netlink | None = None) -> dict:
        """Interface counters of ``names`` here (:meth:`testbed.linux.netlink.Netlink.counters`);
        another thread passes its own ``netlink``."""
        return (netlink or self.netlink).counters(names)

    def reachability(self, count: int = 2, timeout_s: float = 120.0) -> Reachability:
        """Probe every ordered host pair ``count`` times, all sources at once (on a
        multi-plane fabric every pair of NICs of a plane)."""
        return probe_pairs(self.topo, self.run_parallel, count, timeout_s,
                           upcalls=self.datapath_type != "ebpf")

    def dead_switches(self) -> set[str]:
        return self.switches.dead() if self.switches is not None else set()

    def port_states(self) -> dict[str, bool]:
        return self.links.port_states()

    def cut_off(self, hosts: list[str]) -> str | None:
        """Why some of ``hosts`` can no longer reach each other (switch ports without carrier,
        switches without their vswitchd), or None while every one reaches every other. Safe
        from any thread (its own netlink socket)."""
        return cut_off_reason(self.topo, self.port_states(), self.dead_switches(), hosts)

    # -- failures (PortServices') -------------------------------------------------------------
    def link_ends(self, link: Link) -> tuple[End, ...]:
        return self.ports.link_ends(link)

    def set_link(self, node1: str, node2: str, up: bool) -> Link:
        """Fail the link between two nodes or repair it (:meth:`set_links`)."""
        link = self.topo.find_link(node1, node2)
        self.set_links([(node1, node2)], up)
        return link

    def set_links(self, pairs: list[tuple[str, str]], up: bool,
                  netlink: Netlink | None = None) -> dict[str, float]:
        """Fail links or repair them, all at once (:meth:`PortServices.set_links`)."""
        return self.ports.set_links(pairs, up, netlink)

    def cut_drops(self, pairs: list[tuple[str, str]],
                  netlink: Netlink | None = None) -> int | None:
        return self.ports.cut_drops(pairs, netlink)

    def set_rates(self, pairs: list[tuple[str, str]], factor: float,
                  netlink: Netlink | None = None) -> dict[str, float]:
        """Degrade links to ``factor`` of their rate (:meth:`PortServices.set_rates`)."""
        return self.ports.set_rates(pairs, factor, netlink)

    def offered_bytes(self, names: set[str]) -> dict[str, int] | None:
        return self.ports.offered_bytes(names)

    def rate_factors(self) -> dict[str, float]:
        """Switch port -> the share of its configured rate it has now, for degraded links."""
        return dict(self.ports.rate_factors) if self.ports is not None else {}

    def switch_notices(self) -> list[tuple[float, str, int, tuple[int, ...]]]:
        """The switches' fault notices so far: (seconds ago, switch, group, ports out)."""
        return self.switches.notices() if self.switches is not None else []

    def largest_packets(self, names: set[str]) -> dict[str, int]:
        """Switch port -> the largest packet offered to it so far (eBPF switches only)."""
        return self.ports.switches.largest_packets(names) if self.ports is not None else {}
