"""A running fabric: build a :class:`testbed.model.spec.TestbedSpec` on this machine, and take it down.

:class:`Fabric` is a context manager. Everything it creates is recorded in a run record before it
is created, and removed in ``__exit__`` (normal exit, exception, Ctrl-C, or SIGTERM turned into an
exception by the CLI). A run killed with SIGKILL is removed by ``fabriclab clean`` or by the next
fabric that comes up.

Fabric services: whatever lives exactly as long as the fabric (the controller, traffic agents,
iperf3, pollers, exporters) starts through :meth:`Fabric.spawn` (a process, in a host's
namespace or this machine's) or :meth:`Fabric.start_thread` (a thread given a stop event),
registered like every other resource and ended by :meth:`Fabric.down` (processes by PID).

The build's steps are :mod:`testbed.fabric.build`'s and the controller's :mod:`testbed.fabric.
controller`'s (mixins); what every kind of fabric shares :mod:`testbed.fabric.lifecycle`'s.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Self

from testbed.errors import TestbedError
from testbed.fabric.build import BuildSteps
from testbed.fabric.controller import ControllerProcess
from testbed.fabric.ecn import Marker
from testbed.fabric.lifecycle import probe_pairs, reap, signals_deferred, up_or_down
from testbed.fabric.linkfail import End, LinkCut, set_links
from testbed.fabric.monitor import RunMonitor
from testbed.fabric.pfc import PfcAgent
from testbed.linux import capabilities, ovs, procfs
from testbed.linux.cpu import machine_cpu_s, process_cpu_s
from testbed.linux.files import write_text_atomic
from testbed.linux.hosts import Hosts
from testbed.linux.netlink import Netlink
from testbed.linux.rawnl import LinkDump
from testbed.model.partition import MachinePart
from testbed.model.spec import TestbedSpec
from testbed.model.topology import Link
from testbed.plan.failplan import cut_off_reason
from testbed.plan.fidelity import FidelityVerdict
from testbed.plan.reachability import Reachability
from testbed.runs import cleanup
from testbed.runs.registry import (DEFAULT_STATE_DIR, Registry, RunRecord, run_file_name,
                                   stop_processes)

THREAD_JOIN_S = 10.0
LOOPBACK = "127.0.0.1"


class Fabric(BuildSteps, ControllerProcess):
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
        listen: the address the controller started here listens on (a cluster's coordinator:
            its underlay address).
        failable: links may be failed while it is up without a plan for it (``fabriclab
            fail`` on a fabric ``fabriclab up`` keeps): their cut is loaded (the eBPF
            toolchain installed when missing), as for an experiment with ``failures``.
    """

    def __init__(self, spec: TestbedSpec, state_dir: Path = DEFAULT_STATE_DIR,
                 log: Callable[[str], None] = lambda _msg: None,
                 part: MachinePart | None = None,
                 controller_at: tuple[str, int] | None = None,
                 listen: str = LOOPBACK, failable: bool = False) -> None:
        self.spec = spec
        self.topo = spec.topology
        self.part = part
        self.plan = None  # the whole fabric's partition over machines (a ClusterFabric's)
        self.controller_at = controller_at
        self.listen = listen
        self.failable = failable
        self.registry = Registry(state_dir)
        self.log = log
        self.timings: dict[str, float] = {}
        self.record: RunRecord | None = None
        self.hosts: Hosts | None = None
        self.netlink: Netlink | None = None
        self.caps: capabilities.Capabilities | None = None
        self._init_controller()
        self.instances: list[ovs.Instance] = []
        self.fidelity: FidelityVerdict | None = None
        self.warnings: list[str] = []
        self.datapath_choice = ""  # why the switches forward on the datapath they do
        self.switch_instance: dict[str, ovs.Instance] = {}
        self._processes: list[subprocess.Popen] = []
        self._threads: list[tuple[threading.Thread, threading.Event]] = []
        self.marker: Marker | None = None
        self.cut: LinkCut | None = None  # link failures' cut (linkfail.py)
        self.switch_agent = None  # the eBPF switches' OpenFlow agent (datapath ebpf)
        self.ebpf = None  # the eBPF switches' program and maps (datapath ebpf)
        self.pfc_agent: PfcAgent | None = None
        self.service_errors: list[str] = []  # what fabric service threads died of

    @property
    def datapath_type(self) -> str | None:
        """The datapath the switches here use: ``ebpf``, or Open vSwitch's (``system``,
        ``netdev``); None before the build."""
        if self.spec.emulator.datapath == "ebpf":
            return "ebpf"
        return self.caps.datapath_type if self.caps is not None else None

    @property
    def vswitchd_count(self) -> int:
        """The private vswitchds serving the switches here (0: the system's)."""
        return len(self.instances)

    @property
    def controller_address(self) -> str:
        """Where the switches here reach the controller (``host:port``)."""
        host, port = self.controller_at or (self.listen, self.of_port)
        return f"{host}:{port}"

    @property
    def run_dir(self) -> Path:
        assert self.record is not None
        return Path(self.record.run_dir)

    # -- lifecycle ----------------------------------------------------------------------------
    def __enter__(self) -> Self:
        up_or_down(self)
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self, wait: bool = True) -> None:
        """Build the fabric (or this machine's part) and, ``wait``: until it is ready."""
        start = time.monotonic()
        builds = self.part is None or bool(self.part.nodes)
        if builds:
            self.caps = self._check_machine()
        self._choose_datapath()
        if self.part is None:  # a cluster's coordinator checks each machine's share
            self._check_fidelity()
        self._prepare_run()
        waits = self.controller_at is None and wait  # not a cluster machine's part
        if self.controller_at is None and self.spec.controller.remote:  # none started here
            self.controller_at = self.spec.controller.remote_address
        elif self.controller_at is None:
            self._step("controller", self._start_controller)
            self.start_thread(self.watch_controller, "controller watch")
        if builds:
            self._build()
        if waits:
            self.wait_ready()
        self.timings["up_total"] = time.monotonic() - start

    def _build(self) -> None:
        """This machine's hosts, links, tunnels, markers and switches."""
        self._step("hosts", self._start_hosts)
        self._step("links", self._create_links)
        if self.part is not None and self.part.tunnels:
            self._step("tunnels", self._create_tunnels)
        if self.topo.scale_up:
            self._step("scale-up", self._create_scale_up)
        if self.spec.fabric.needs_marker:
            self._step("ecn", self._attach_markers)
        self._step("cut", self._load_cut)
        if self.spec.emulator.datapath != "ebpf":  # no switch sends through a socket there
            self._raise_send_buffer()
        if any(True for _ in self._switches()):
            self._step("switches", self._create_switches)

    def wait_ready(self) -> None:
        """Wait until the controller here has programmed every switch and probed every link,
        then put back the sysctls raised for the build; start the PFC agent."""
        self._step("programmed", self._wait_programmed)
        self._restore_sysctls()
        if self.spec.pfc is not None:
            self._step("pfc", self._start_pfc)

    def settle(self) -> None:
        """A cluster machine's part, once the coordinator saw every link probed: the sysctls
        raised for the build go back."""
        self._restore_sysctls(wait=False)

    def here(self, node: str) -> bool:
        """Whether ``node`` is built on this machine."""
        return self.part is None or node in self.part.nodes

    def _switches(self):
        return (sw for sw in self.topo.switches if self.here(sw.name))

    def local_links(self) -> list[Link]:
        """The fabric links with an end here: on a cluster, its part's and the cut ones."""
        if self.part is None:
            return list(self.topo.links)
        return [*self.part.links, *(cut.link for cut, _ in self.part.tunnels)]

    def down(self) -> None:
        """Remove everything this fabric created (safe to call more than once)."""
        if self.record is None:
            return
        start = time.monotonic()
        with signals_deferred():
            for thread, stop in self._threads:
                stop.set()
            for thread, _ in self._threads:
                thread.join(THREAD_JOIN_S)
            stuck = [t.name for t, _ in self._threads if t.is_alive()]
            self._threads.clear()
            if self.hosts is not None:
                self.hosts.stop()
                self.hosts = None
            if self.netlink is not None:
                self.netlink.close()
                self.netlink = None
            for service in ("switch_agent", "ebpf", "marker", "cut"):
                if getattr(self, service) is not None:
                    getattr(self, service).close()
                    setattr(self, service, None)
            report = cleanup.clean_record(self.record, self.registry, keep_run_dir=False)
            for proc in self._processes:  # ended by PID above: reap them
                reap(proc)
            self._processes.clear()
            self.controller = None
            if stuck:
                report.errors.append(f"service threads did not stop: {', '.join(stuck)}")
            if report.errors:
                raise TestbedError("teardown incomplete (run 'fabriclab clean'):\n  "
                                   + "\n  ".join(report.errors))
            self.record = None
        self.timings["down_total"] = time.monotonic() - start

    # -- fabric services ---------------------------------------------------------------------
    def spawn(self, host: str | None, argv: list[str], role: str,
              **popen_kwargs) -> subprocess.Popen:
        """Start a process that lives at most as long as the fabric.

        Args:
            host: the host whose network namespace it runs in; None: this machine's.
            argv: the command.
            role: what it is, for the run record and errors (``agent:17000:h1_1_1``).
            popen_kwargs: passed to ``subprocess.Popen`` (in a host: stdout and stderr default
                to text pipes).

        Returns:
            The process, tracked by PID in the run record; :meth:`stop` ends it early,
            :meth:`down` (or ``fabriclab clean`` after a SIGKILL) ends it otherwise.
        """
        if self.record is None:
            raise TestbedError(f"{role}: the fabric is not up")
        if host is None:
            popen_kwargs.setdefault("stdin", subprocess.DEVNULL)
            proc = subprocess.Popen(argv, start_new_session=True, **popen_kwargs)
        else:
            proc = self.hosts.popen(host, argv, **popen_kwargs)
        self._processes.append(proc)
        self.registry.track_process(self.record, proc.pid, role)
        return proc

    def stop(self, proc: subprocess.Popen, timeout_s: float = 5.0) -> int:
        """End a spawned process now (SIGTERM to its group, SIGKILL after ``timeout_s``; a
        process that already exited is only reaped) and drop it from the run record.

        Returns:
            Its exit code.
        """
        tracked = [p for p in self.record.processes if p.pid == proc.pid] if self.record else []
        stop_processes(tracked, timeout_s)
        reap(proc)
        if proc in self._processes:
            self._processes.remove(proc)
        if self.record is not None:
            self.registry.untrack_process(self.record, proc.pid)
        return proc.returncode

    def start_thread(self, target: Callable[[threading.Event], None],
                     role: str) -> threading.Thread:
        """Run ``target(stop)`` in a daemon thread until :meth:`down` sets ``stop``.

        The target must return soon after ``stop`` is set (it is joined for
        ``THREAD_JOIN_S``; one that is not done by then is reported as a teardown error). An
        exception that ends it is kept in :attr:`service_errors`, never lost.
        """
        if self.record is None:
            raise TestbedError(f"{role}: the fabric is not up")
        stop = threading.Event()

        def guarded(event: threading.Event) -> None:
            try:
                target(event)
            except Exception as err:  # noqa: BLE001 - kept for the caller, see service_errors
                self.service_errors.append(f"{role}: {type(err).__name__}: {err}")

        thread = threading.Thread(target=guarded, args=(stop,), name=role, daemon=True)
        self._threads.append((thread, stop))
        thread.start()
        return thread

    def start_monitor(self, queue_interval_s: float) -> tuple[RunMonitor, Callable[[], None]]:
        """The run's samples (:class:`testbed.fabric.monitor.RunMonitor`) as a fabric service; returns
        it and what stops it."""
        monitor = RunMonitor(self, queue_interval_s=queue_interval_s)
        thread = self.start_thread(monitor, "monitor")
        return monitor, lambda: self.stop_thread(thread)

    def stop_thread(self, thread: threading.Thread) -> None:
        """End one thread of :meth:`start_thread` now (a run's samplers on a fabric that
        outlives the run); one that does not stop within ``THREAD_JOIN_S`` is an error."""
        for item in [t for t in self._threads if t[0] is thread]:
            item[1].set()
            thread.join(THREAD_JOIN_S)
            self._threads.remove(item)
            if thread.is_alive():
                raise TestbedError(f"service thread {thread.name} did not stop")

    def track_process(self, pid: int, role: str) -> None:
        """Record a process started for this fabric (Prometheus), so that ``fabriclab clean``
        stops it if this process dies before its teardown does."""
        if self.record is None:
            raise TestbedError(f"{role}: the fabric is not up")
        self.registry.track_process(self.record, pid, role)

    def track_file(self, path: Path) -> None:
        """Record a file written for this fabric outside its run directory, so that
        ``fabriclab clean`` removes it if this process dies before removing it itself."""
        if self.record is None:
            raise TestbedError(f"{path}: the fabric is not up")
        self.registry.track_file(self.record, str(path))

    def _step(self, name: str, fn: Callable[[], None]) -> None:
        t0 = time.monotonic()
        fn()
        self.timings[name] = time.monotonic() - t0
        self.log(f"{name}: {self.timings[name]:.2f} s")

    # -- steps --------------------------------------------------------------------------------

    def vswitchd_pids(self) -> dict[str, int]:
        """Each vswitchd serving this fabric: its private ones (userspace datapath), else the
        system's; none for a cluster's coordinator, which has no switches."""
        if self.part is not None and not self.part.switches:
            return {}
        if self.spec.emulator.datapath == "ebpf":
            return {}  # no process forwards
        if self.instances:
            return {inst.name: inst.pids["ovs-vswitchd"] for inst in self.instances}
        return {f"system{i}": pid for i, pid in enumerate(ovs.vswitchd_pids())}

    @property
    def machine_name(self) -> str:
        """This machine as telemetry names it: its cluster name, else its host name."""
        return self.part.machine if self.part is not None else (socket.gethostname() or "local")

    def cpu_times(self) -> dict[str, dict]:
        """This machine's CPU seconds by mode, its cores and each vswitchd's CPU seconds, under
        its name (the fidelity exporter's; a cluster's has every machine)."""
        cpu = {name: process_cpu_s(pid) for name, pid in self.vswitchd_pids().items()}
        vswitchd = {name: seconds for name, seconds in cpu.items() if seconds is not None}
        serving = {name: ",".join(sorted(s for s, i in self.switch_instance.items()
                                         if i.name == name) or self.record.bridges)
                   for name in vswitchd}  # the system's vswitchd: every bridge
        return {self.machine_name: {"cpu": machine_cpu_s(), "cores": os.cpu_count() or 1,
                                    "vswitchd": vswitchd, "vswitchd_switches": serving}}

    def switch_ports(self) -> set[str]:
        """The root-namespace interface of every switch port (a server's scale-up switch's
        too)."""
        bridges = {s.switch for s in self.topo.servers if s.switch and self.here(s.switch)}
        return ({n for link in self.local_links() for n in self._root_ends(link)}
                | {e.ifname for l in self.topo.scale_up for e in (l.a, l.b) if e.node in bridges})

    def congestion(self, netlink: Netlink | None = None) -> dict[str, dict]:
        """Switch port -> its queue's counters and backlog now (summed over its priorities'
        leaves), per priority that leaf's, and with the marker its virtual queue and marking
        counters; with PFC, every paused port's (host NICs too) pause counters per priority.
        All cumulative since the build. Another thread passes its own ``netlink`` (pyroute2
        sockets are not shared across threads)."""
        ports: dict[str, dict] = {}
        nl = netlink or self.netlink
        for (name, prio), q in nl.leaf_queues(self.switch_ports()).items():
            port = ports.setdefault(name, {"queue": dict.fromkeys(q, 0)})
            for k, v in q.items():
                port["queue"][k] += v
            port.setdefault("priorities", {}).setdefault(prio, {})["queue"] = q
        if self.marker is not None:
            for name, (backlog, peak) in self.marker.queues().items():
                ports.setdefault(name, {})["virtual_queue"] = {"backlog_bytes": backlog,
                                                               "max_bytes": peak}
            for (name, prio), counts in self.marker.counters().items():
                ports.setdefault(name, {}).setdefault("priorities", {}).setdefault(
                    prio, {}).update(counts)
        if self.pfc_agent is not None:
            for (name, prio), counts in self.pfc_agent.counters().items():
                ports.setdefault(name, {}).setdefault("priorities", {}).setdefault(
                    prio, {})["pfc"] = counts
        return ports

    def placement(self) -> dict | None:
        """Where the fabric's nodes are built: None, every one on this machine (a cluster's
        :meth:`testbed.cluster.coordinator.ClusterFabric.placement` says)."""
        return None

    # -- operations on a running fabric ---------------------------------------------------------
    def reachability(self, count: int = 2, timeout_s: float = 120.0) -> Reachability:
        """Probe every ordered host pair ``count`` times, all sources at once (on a
        multi-plane fabric every pair of NICs of a plane)."""
        return probe_pairs(self.topo, self.run_parallel, count, timeout_s,
                           upcalls=self.datapath_type != "ebpf")

    def run_parallel(self, commands: dict[str, list[str]],
                     timeout_s: float) -> dict[str, tuple[int, str, str]]:
        """One command per host here, all at once: host -> (exit code, stdout, stderr)."""
        return self.hosts.run_parallel(commands, timeout_s)

    def dead_switches(self) -> set[str]:
        """Switches whose private vswitchd is gone (killed, crashed)."""
        dead = set()
        for name, inst in self.switch_instance.items():
            stat = procfs.read_stat(inst.pids.get("ovs-vswitchd", 0))
            if stat is None or stat.state in ("Z", "X"):
                dead.add(name)
        return dead

    def cut_off(self, hosts: list[str]) -> str | None:
        """Why some of ``hosts`` can no longer reach each other (switch ports without carrier,
        switches without their vswitchd), or None while every one reaches every other. Safe
        from any thread (its own netlink socket)."""
        return cut_off_reason(self.topo, self.port_states(), self.dead_switches(), hosts)

    def port_states(self) -> dict[str, bool]:
        """Every switch port here: whether it is up (one netlink dump, its own socket)."""
        names = {n for link in self.local_links() for n in self._root_ends(link)}
        dump = LinkDump()
        try:
            return {name: stats["up"] for name, stats in dump.read(names).items()}
        finally:
            dump.close()

    def link_counters(self, names: set[str], netlink: Netlink | None = None) -> dict:
        """Interface counters of ``names`` here (:meth:`testbed.linux.netlink.Netlink.counters`);
        another thread passes its own ``netlink``."""
        return (netlink or self.netlink).counters(names)

    def write_file(self, name: str, text: str) -> Path:
        """Write ``name`` into the run directory (atomically); returns its path."""
        write_text_atomic(path := self.run_dir / run_file_name(name), text)
        return path

    def read_file(self, name: str, host: str | None = None) -> str:
        """A file of the run directory (``host``: where a process of that host wrote it; one
        machine here). Raises OSError when there is none."""
        return (self.run_dir / run_file_name(name)).read_text()

    def set_link(self, node1: str, node2: str, up: bool) -> Link:
        """Fail the link between two nodes or repair it (:meth:`set_links`)."""
        link = self.topo.find_link(node1, node2)
        self.set_links([(node1, node2)], up)
        return link

    def set_links(self, pairs: list[tuple[str, str]], up: bool,
                  netlink: Netlink | None = None) -> dict[str, float]:
        """Fail links (cut, the switches told, the veths down: :mod:`testbed.fabric.linkfail`) or
        repair them, all at once; another thread passes its own ``netlink``. On a cluster
        machine, its ends of them (a cut link's other end is the other machine's). Returns
        each step's time after the call."""
        ends = [self.link_ends(self.topo.find_link(a, b)) for a, b in pairs]
        agent = self.switch_agent
        signal = None if agent is None else lambda end, lost: agent.signal(end.ifname, lost)
        return set_links(netlink or self.netlink, [e for e in ends if e], up, self.cut, signal)

    def cut_drops(self, pairs: list[tuple[str, str]],
                  netlink: Netlink | None = None) -> int | None:
        """Frames the cuts of these links dropped so far at their ends here (None without
        the cut program)."""
        if self.cut is None:
            return None
        return self.cut.dropped(netlink or self.netlink,
                                [e for a, b in pairs
                                 for e in self.link_ends(self.topo.find_link(a, b))])

    def link_ends(self, link: Link) -> tuple[End, ...]:
        """The ends of a link built here, as :mod:`testbed.fabric.linkfail` acts on them: both on
        one machine, on a cluster machine those of its part (one of a cut link)."""
        def end(e) -> End:
            if self.topo.nodes[e.node].is_switch:
                inst = self.switch_instance.get(e.node)
                return End(e.ifname, None, True, inst.db if inst else None)
            return End(e.ifname, self.hosts.pid(e.node), False)
        return tuple(end(e) for e in (link.a, link.b) if self.here(e.node))


