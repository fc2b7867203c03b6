"""A running fabric: build a :class:`testbed.model.spec.TestbedSpec` on this machine, and take it down.

:class:`Fabric` is a context manager. Everything it creates is recorded in a run record before it
is created, and removed in ``__exit__`` (normal exit, exception, Ctrl-C, or SIGTERM turned into an
exception by the CLI). A run killed with SIGKILL is removed by ``fabriclab clean`` or by the next
fabric that comes up.

Fabric services: whatever lives exactly as long as the fabric (the controller, traffic agents,
iperf3, and the pollers, exporters and agents of later features) starts through
:meth:`Fabric.spawn` (a process, in a host's namespace or this machine's) or
:meth:`Fabric.start_thread` (a thread given a stop event). Both are registered like every other
resource and ended by :meth:`Fabric.down`, processes by their recorded PID.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Self

from testbed.linux import bpf

from testbed.linux import capabilities

from testbed.runs import cleanup

from testbed.linux import ovs

from testbed.linux import procfs
from testbed.linux.cpu import machine_cpu_s, process_cpu_s
from testbed.fabric.ecn import Marker, PortMarking
from testbed.errors import ConfigError, TestbedError
from testbed.plan.failplan import cut_off_reason
from testbed.linux.files import write_text_atomic
from testbed.plan.fidelity import FidelityVerdict, assess
from testbed.fabric.linkfail import End, LinkCut, set_links
from testbed.linux.hosts import Hosts
from testbed.fabric.monitor import RunMonitor
from testbed.linux.netlink import Netlink
from testbed.linux.rawnl import LinkDump
from testbed.fabric.pfc import PfcAgent
from testbed.poll import wait_for
from testbed.plan.portplan import (
    link_plan,
    marker_thresholds,
    scale_up_mac,
    scale_up_plan,
    send_buffer_bytes,
    switch_queue_bytes,
)
from testbed.plan.reachability import (
    Reachability,
    evaluate,
    fping_command,
    probe_interval_ms,
)
from testbed.model.partition import MachinePart
from testbed.runs.registry import DEFAULT_STATE_DIR, Registry, Role, RunRecord, stop_processes
from testbed.model.spec import EcnMarker, Fidelity, TestbedSpec
from testbed.model.servers import scale_up_routes
from testbed.model.topology import HOST_PREFIX_LEN, PLANE_PREFIX_LEN, Link, shard_switches


STARTUP_WORKERS = 16
THREAD_JOIN_S = 10.0
LOOPBACK = "127.0.0.1"


def _free_port(host: str = LOOPBACK) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def up_or_down(fabric) -> None:
    """``fabric.up()``; when it fails, ``fabric.down()`` removes what it built, and the build
    error stays the one raised (a teardown error is added to it as a note)."""
    try:
        fabric.up()
    except BaseException as err:
        try:
            fabric.down()
        except Exception as down_err:  # noqa: BLE001 - noted on the build error
            err.add_note(f"and tearing down after it failed too: {down_err}")
        raise


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Ignore SIGINT/SIGTERM while tearing down, so a second Ctrl-C cannot leak resources."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for sig in saved:
            signal.signal(sig, signal.SIG_IGN)
    except ValueError:  # not the main thread: nothing to defer
        saved = {}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


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
        listen: the address the controller started here listens on (a cluster's coordinator:
            its underlay address).
    """

    def __init__(self, spec: TestbedSpec, state_dir: Path = DEFAULT_STATE_DIR,
                 log: Callable[[str], None] = lambda _msg: None,
                 part: MachinePart | None = None,
                 controller_at: tuple[str, int] | None = None,
                 listen: str = LOOPBACK) -> None:
        self.spec = spec
        self.topo = spec.topology
        self.part = part
        self.plan = None  # the whole fabric's partition over machines (a ClusterFabric's)
        self.controller_at = controller_at
        self.listen = listen
        self.registry = Registry(state_dir)
        self.log = log
        self.timings: dict[str, float] = {}
        self.record: RunRecord | None = None
        self.hosts: Hosts | None = None
        self.netlink: Netlink | None = None
        self.controller: subprocess.Popen | None = None
        self.caps: capabilities.Capabilities | None = None
        self.of_port = 0
        self.instances: list[ovs.Instance] = []
        self.fidelity: FidelityVerdict | None = None
        self.warnings: list[str] = []
        self.switch_instance: dict[str, ovs.Instance] = {}
        self._processes: list[subprocess.Popen] = []
        self._threads: list[tuple[threading.Thread, threading.Event]] = []
        self.marker: Marker | None = None
        self.cut: LinkCut | None = None  # link failures' cut (linkfail.py)
        self.pfc_agent: PfcAgent | None = None
        self.service_errors: list[str] = []  # what fabric service threads died of

    @property
    def datapath_type(self) -> str | None:
        """The Open vSwitch datapath the switches here use (None before the build)."""
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

    @property
    def status_path(self) -> Path:
        return self.run_dir / "controller-status.json"

    # -- lifecycle ----------------------------------------------------------------------------
    def __enter__(self) -> Self:
        up_or_down(self)
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self, wait: bool = True) -> None:
        """Build the fabric (or this machine's part of it) and, with the controller here and
        ``wait``, wait until it has programmed every switch (:meth:`wait_ready`)."""
        start = time.monotonic()
        builds = self.part is None or bool(self.part.nodes)
        if builds:
            self.caps = self._check_machine()
        if self.part is None:  # a cluster's coordinator checks each machine's share
            self._check_fidelity()
        self._prepare_run()
        if self.controller_at is None:
            self._step("controller", self._start_controller)
        if builds:
            self._build()
        if self.controller_at is None and wait:
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
            for service in ("marker", "cut"):
                if getattr(self, service) is not None:
                    getattr(self, service).close()
                    setattr(self, service, None)
            report = cleanup.clean_record(self.record, self.registry, keep_run_dir=False)
            for proc in self._processes:  # ended by PID above: reap them
                _reap(proc)
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
        _reap(proc)
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

    def restart_controller(self, spec: TestbedSpec) -> None:
        """Run the next experiment on this fabric: ``spec`` builds the same fabric (the caller
        checked) with its own controller settings. The controller is replaced by a fresh one on
        the same OpenFlow port (no routing state, counters or log carried over), the switches
        reconnect (within their 1 s backoff) and are cleared and programmed again; the agents'
        logs of the previous run are removed."""
        if self.record is None:
            raise TestbedError("restart the controller: the fabric is not up")
        start = time.monotonic()
        if self.caps is not None:  # the workload's (a TCP congestion control)
            self._check_requirements(self.caps, spec)
        self.spec = spec
        if self.controller is not None:
            self.stop(self.controller)
            self.controller = None
        for path in (self.status_path, self.run_dir / "controller.log",
                     *(self.run_dir / "logs").glob("*.log")):
            path.unlink(missing_ok=True)
        self._start_controller(self.of_port)
        self._wait_listening()
        self._wait_programmed()
        self.timings["controller_restart"] = time.monotonic() - start

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
    def _check_machine(self) -> capabilities.Capabilities:
        ovs.check_running()
        caps = capabilities.probe(self.registry.state_dir)
        self._check_requirements(caps)
        return caps

    def _check_requirements(self, caps: capabilities.Capabilities,
                            spec: TestbedSpec | None = None) -> None:
        for need in (spec or self.spec).requirements():
            if not caps.has(need):
                raise ConfigError(need.field, caps.explain_missing(need))

    def _check_fidelity(self) -> None:
        """Refuse (or warn about) a fabric whose full load exceeds this machine's budget."""
        mode = self.spec.emulator.fidelity
        if self.caps.datapath_type != "netdev" or mode == Fidelity.OFF:
            return
        self.fidelity = verdict = assess(self.topo, self.spec.fabric.mtu)
        if verdict.overloaded and mode == Fidelity.STRICT:
            raise ConfigError("fabric.host_link.rate_mbps",
                              f"too fast for this machine: {verdict.explain()}. Lower the rates, "
                              "or set emulator.fidelity: warn to measure the emulator anyway")
        if not verdict.fits:
            self.warnings.append(f"fidelity: {verdict.explain()}; measured numbers may describe "
                                 "the emulator rather than the fabric")

    def _prepare_run(self) -> None:
        # runs killed with SIGKILL (a cluster machine's registry knows only its own runs)
        report = cleanup.clean(self.registry, orphans=self.part is None)
        if report.runs:
            self.log(f"cleaned {len(report.runs)} stale run(s)")
        if report.errors:
            raise TestbedError("cannot clean what earlier runs left behind (see 'fabriclab "
                               "clean'):\n  " + "\n  ".join(report.errors))
        live = [r for r in self.registry.runs() if r.owner_alive()]
        if live:
            raise TestbedError(f"another fabric is up (run {live[0].run_id}, pid "
                               f"{live[0].owner_pid}); stop it or run 'fabriclab clean --all'")
        run_dir = self.registry.state_dir / "work"
        self.record = self.registry.new_run(run_dir)
        self.record.run_dir = str(run_dir / self.record.run_id)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.registry.save(self.record)
        self.netlink = Netlink()

    def _start_controller(self, port: int = 0) -> None:
        topo_path = self.run_dir / "topology.json"
        topo_path.write_text(json.dumps(self.topo.to_dict()))
        self.of_port = port or _free_port(self.listen)
        cmd = [sys.executable, "-m", "controllers.launcher", "--topology", str(topo_path),
               "--status", str(self.status_path), "--port", str(self.of_port),
               "--host", self.listen,
               "--routing", self.spec.controller.routing,
               "--ecmp-seed", self.spec.controller.ecmp_seed,
               "--ecmp-selection", self.spec.controller.ecmp_selection,
               "--spray-weights", self.spec.controller.spray_weights,
               "--poll-interval-s", str(self.spec.controller.poll_interval_s),
               "--log", str(self.run_dir / "controller.log")]
        with open(self.run_dir / "controller.stderr", "w", encoding="utf-8") as err:
            self.controller = self.spawn(None, cmd, "controller", stdout=subprocess.DEVNULL,
                                         stderr=err)

    def _start_hosts(self) -> None:
        def track(name: str, pid: int) -> None:
            self.registry.track_process(self.record, pid, Role.host(name))

        sysctls = {"net.ipv4.tcp_ecn": "1"} if self.spec.fabric.host_ecn else {}
        if self.topo.servers:  # a GPU's scale-up peers answer on other interfaces than its NIC
            sysctls |= {"net.ipv4.conf.all.rp_filter": "0",
                        "net.ipv4.conf.default.rp_filter": "0"}
            if any(s.scale_up == "cube_mesh" for s in self.topo.servers):
                sysctls["net.ipv4.ip_forward"] = "1"  # a GPU relays for its cube-mesh pairs
        topo = self.topo
        nics = {h.name: topo.nic_owner(h.name) for h in topo.hosts
                if topo.nic_owner(h.name) != h.name and self.here(h.name)}  # planes' NICs
        self.hosts = Hosts([h.name for h in topo.hosts if h.name not in nics
                            and self.here(h.name)], on_spawn=track, sysctls=sysctls,
                           aliases=nics)

    def _root_ends(self, link: Link) -> list[str]:
        return [e.ifname for e in (link.a, link.b)
                if self.topo.nodes[e.node].is_switch and self.here(e.node)]

    def shaping(self, link: Link, host_end: bool = False):
        """The tc plan of a link's switch ends, or of its host NIC (:func:`link_plan`)."""
        return link_plan(self.spec, link, host_end, self.red_marking)

    @property
    def red_marking(self) -> bool:
        """Whether the switch ports' lossy classes mark ECN with the kernel's RED qdisc (the
        experiment's ``emulator.ecn_marker``; ``auto``: where the kernel has RED)."""
        choice = self.spec.emulator.ecn_marker
        if not self.spec.fabric.marks_ecn or choice == EcnMarker.EBPF:
            return False
        return choice == EcnMarker.RED or bool(self.caps and self.caps.has_qdisc("red"))

    def _create_links(self) -> None:
        fab = self.spec.fabric
        links = self.topo.links if self.part is None else self.part.links
        self.record.links = [n for l in self.local_links() for n in self._root_ends(l)]
        self.registry.save(self.record)
        nl, mtu = self.netlink, fab.mtu
        for link in links:
            plan = self.shaping(link)
            if link.tier == "host":
                host = self.topo.nodes[link.a.node]
                pid = self.hosts.pid(host.name)
                nl.create_veth(link.b.ifname, link.a.ifname, peer_pid=pid, peer_mac=host.mac,
                               mtu=mtu)
                nl.shape(link.a.ifname, self.shaping(link, host_end=True), pid=pid)
            else:
                nl.create_veth(link.b.ifname, link.a.ifname, mtu=mtu)
                nl.shape(link.a.ifname, plan)
                nl.set_state(link.a.ifname, True)
            nl.shape(link.b.ifname, plan)
            nl.set_state(link.b.ifname, True)
        for host in self.topo.hosts:  # each NIC on-link with its plane's, as ARP resolved
            if not self.here(host.name):
                continue
            plane = self.topo.plane_of(host.name)
            nl.configure_host(self.hosts.pid(host.name), self.topo.host_link(host.name).a.ifname,
                              host.ip, HOST_PREFIX_LEN if plane == 1 else PLANE_PREFIX_LEN,
                              [(h.ip, h.mac) for h in self.topo.hosts if h is not host
                               and self.topo.plane_of(h.name) == plane])

    def _create_tunnels(self) -> None:
        """This machine's ends of the cut links: VXLAN devices on the underlay, named and
        shaped as the link's veth end would be (recorded with the links, so teardown and
        ``fabriclab clean`` remove them)."""
        nl, mtu = self.netlink, self.spec.fabric.mtu
        for cut, _node in self.part.tunnels:
            ifname, local, remote = cut.end(self.part.machine)
            nl.create_vxlan(ifname, cut.vni, local, remote, mtu)
            nl.shape(ifname, self.shaping(cut.link))
            nl.set_state(ifname, True)

    def _create_scale_up(self) -> None:
        """Every server's scale-up domain: veths between its GPUs' namespaces (meshes) or from
        each GPU to the server's Linux bridge (switch), shaped at both ends, and in every GPU
        /32 routes to its server's other GPUs through them, so that traffic inside a server
        never meets the scale-out fabric."""
        topo, nl, mtu = self.topo, self.netlink, self.spec.fabric.mtu
        bridges = [s.switch for s in topo.servers if s.switch and self.here(s.switch)]
        scale_up = [l for l in topo.scale_up if self.here(l.a.node)]
        self.record.links += bridges + [e.ifname for l in scale_up for e in (l.a, l.b)
                                        if e.node in bridges]
        self.registry.save(self.record)
        for bridge in bridges:
            nl.create_bridge(bridge, mtu)
        mac = {}  # a GPU's scale-up interface -> its MAC
        for link in scale_up:
            plan = scale_up_plan(self.spec, link)
            a = topo.nodes[link.a.node]
            mac[link.a.ifname] = scale_up_mac(a.ip, link.a.port)
            nl.create_veth(link.b.ifname, link.a.ifname, peer_pid=self.hosts.pid(a.name),
                           peer_mac=mac[link.a.ifname], mtu=mtu)
            nl.shape(link.a.ifname, plan, pid=self.hosts.pid(a.name))
            if link.b.node in bridges:
                nl.shape(link.b.ifname, plan)
                nl.set_master(link.b.ifname, link.b.node)
                nl.set_state(link.b.ifname, True)
                continue
            b = topo.nodes[link.b.node]
            mac[link.b.ifname] = scale_up_mac(b.ip, link.b.port)
            nl.move(link.b.ifname, self.hosts.pid(b.name), mac[link.b.ifname])
            nl.shape(link.b.ifname, plan, pid=self.hosts.pid(b.name))
        # where each GPU's scale-up interfaces lead: the peer GPU (mesh) or the bridge
        ends: dict[str, str] = {}  # a GPU's interface -> the peer GPU's interface on that link
        for link in scale_up:
            if link.b.node not in bridges:
                ends[link.a.ifname], ends[link.b.ifname] = link.b.ifname, link.a.ifname
        owner = {e.ifname: e.node for l in topo.scale_up for e in (l.a, l.b)}
        for gpu, table in scale_up_routes(topo).items():
            if not self.here(gpu):
                continue
            by_if: dict[str, list[tuple[str, str | None]]] = {}
            for peer, hop in table.items():
                via = topo.nodes[hop.via].ip if hop.via else None
                by_if.setdefault(hop.ifname, []).append((topo.nodes[peer].ip, via))
            for ifname, routes in by_if.items():
                if ifname in ends:  # a mesh link: its one neighbour
                    peer_if = ends[ifname]
                    neighbours = [(topo.nodes[owner[peer_if]].ip, mac[peer_if])]
                else:  # the bridge: every GPU of the server
                    server = topo.server_of(gpu)
                    neighbours = [(topo.nodes[g].ip, mac[topo.scale_up_ports(g)[1].end(g).ifname])
                                  for g in server.gpus if g != gpu]
                nl.host_routes(self.hosts.pid(gpu), ifname, routes, neighbours)

    def _pin_dir(self) -> Path:
        """The run's BPF pins, recorded for teardown and ``fabriclab clean``."""
        pins = bpf.PIN_ROOT / self.record.run_id
        if str(pins) not in self.record.bpf_pins:
            self.record.bpf_pins.append(str(pins))
            self.registry.save(self.record)
        return pins

    def _load_cut(self) -> None:
        """Load the program a link failure cuts the link with (:mod:`testbed.fabric.linkfail`);
        without the eBPF toolchain a failure takes the veths down alone, later to show."""
        if not ovs.has_ovsdb_client():  # a failure tells the switches through it: imported now
            self.warnings.append("no Open vSwitch Python library (apt-get install "
                                 "python3-openvswitch): a failure tells the switches through "
                                 "ovs-vsctl, about 10 ms slower")
        try:
            self.cut = LinkCut(self._pin_dir() / "cut", self.registry.state_dir)
        except TestbedError as err:
            self.warnings.append(f"link failures take the veths down only, which the switches "
                                 f"see 10-80 ms late: {err}")

    def _attach_markers(self) -> None:
        """The eBPF marker at the egress of every switch port, with its link tier's marking,
        steering packets into per-priority classes where there are some (and at host NICs);
        with PFC, its arrival counter at every switch port's ingress."""
        self.marker = Marker(self.registry.state_dir, self._pin_dir())
        fab = self.spec.fabric
        table = tuple(fab.traffic_classes.table())
        pfc = self.spec.pfc is not None
        for link in self.local_links():
            plan = self.shaping(link)
            limit = plan.queue_limit if plan.queue_kind == "bfifo" else 0  # bytes only
            marking = marker_thresholds(self.spec, link, plan)
            loss = fab.link(link.tier).loss_percent
            for ifname in self._root_ends(link):
                self.marker.attach(self.netlink, ifname, PortMarking(
                    link.rate_mbps, plan.burst_bytes, limit, table, marking,
                    classes=bool(plan.classes), loss_percent=loss), count_rx=pfc)
            if link.tier == "host" and (plan.classes or loss):
                host = link.a.node
                self.marker.classify_host(self.netlink, host, self.hosts.pid(host),
                                          link.a.ifname, table, bool(plan.classes), loss)

    def _raise_send_buffer(self) -> None:
        """Let the switches' sockets hold every queue full at once, while they are created.

        The userspace datapath sends every packet of a vswitchd through one AF_PACKET socket,
        and a packet in a port's queue counts against that socket's send buffer until it
        leaves. With the kernel's default buffer (net.core.wmem_default, 208 KiB) the queues of
        an instance together hold about 110 KiB of jumbo frames; beyond that the switch drops
        in silence (no qdisc or interface counter sees it). The socket takes the default when it
        is created, during the build (the controller's first LLDP probes): raise it until the
        fabric is programmed, then restore it (the run record keeps the old value until then).
        """
        want = send_buffer_bytes(switch_queue_bytes(self.spec, self.red_marking))
        name = "net.core.wmem_default"
        old = procfs.read_sysctl(name)
        if want <= int(old):
            return
        if not os.access(procfs.sysctl_path(name), os.W_OK):
            # the machine's own setting, read-only in a namespace machine (its host sets it:
            # testbed.cluster.nscluster does)
            self.warnings.append(f"{name} is {old} here and cannot be raised from this network "
                                 f"namespace: the switches' queues may drop in silence beyond "
                                 f"about half of it; raise it to {want} on the host")
            return
        self.record.sysctls[name] = old
        self.registry.save(self.record)
        procfs.write_sysctl(name, str(want))

    def _restore_sysctls(self, wait: bool = True) -> None:
        """Put back the sysctls raised for the build, once every switch has sent (its LLDP
        probes: its socket exists). A cluster's coordinator always waits for the probes (its
        machines put theirs back after, :meth:`settle`); a machine's part waits for nothing."""
        if wait and (self.record.sysctls or self.part is not None):
            def probed() -> bool:
                status = self.controller_status()
                return status.get("wiring_verified", 0) >= status.get("wiring_expected", 0)

            wait_for(probed, self.spec.controller.ready_timeout_s,
                     "the controller's LLDP probes through every switch")
        for name, value in self.record.sysctls.items():
            procfs.write_sysctl(name, value)
        if self.record.sysctls:
            self.record.sysctls = {}
            self.registry.save(self.record)

    def _start_pfc(self) -> None:
        self.pfc_agent = PfcAgent(self, self.spec.pfc)
        self.start_thread(self.pfc_agent, "pfc agent")

    def vswitchd_pids(self) -> dict[str, int]:
        """Each vswitchd serving this fabric: its private ones (userspace datapath), else the
        system's; none for a cluster's coordinator, which has no switches."""
        if self.part is not None and not self.part.switches:
            return {}
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
        vswitchd = {}
        for instance, pid in self.vswitchd_pids().items():
            seconds = process_cpu_s(pid)
            if seconds is not None:
                vswitchd[instance] = seconds
        return {self.machine_name: {"cpu": machine_cpu_s(), "cores": os.cpu_count() or 1,
                                    "vswitchd": vswitchd}}

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

    def _create_switches(self) -> None:
        if self.controller_at is None:
            self._wait_listening()
        specs = {sw.name: ovs.BridgeSpec(sw.name, sw.dpid_hex,
                                         tuple((l.end(sw.name).ifname, p)
                                               for p, l in self.topo.ports(sw.name).items()))
                 for sw in self._switches()}
        self.record.bridges = sorted(specs)
        self.registry.save(self.record)
        address, port = self.controller_at or (self.listen, self.of_port)
        target = f"tcp:{address}:{port}"
        mtu = self.spec.fabric.mtu
        if self.caps.datapath_type != "netdev":
            ovs.create_bridges(list(specs.values()), self.record.run_id, self.caps.datapath_type,
                               target, mtu)
            return
        wanted = self.spec.emulator.vswitchd_instances
        shards = shard_switches(self.topo, len(specs) if wanted == "auto" else int(wanted),
                                frozenset(specs))
        instances = [ovs.Instance(self.run_dir / f"ovs{i}", f"ovs{i}")
                     for i in range(len(shards))]
        self.instances = instances
        self.switch_instance = {n: inst for inst, names in zip(instances, shards) for n in names}

        def start(inst: ovs.Instance, names: list[str]) -> None:
            inst.start_db({"userspace-tso-enable": "true",
                           **self.spec.emulator.ovs_other_config})
            self.registry.track_process(self.record, inst.pids["ovsdb-server"],
                                        Role.ovs(inst.name, "ovsdb-server"))
            inst.start_switch()
            self.registry.track_process(self.record, inst.pids["ovs-vswitchd"],
                                        Role.ovs(inst.name, "ovs-vswitchd"))
            ovs.create_bridges([specs[n] for n in names], self.record.run_id,
                               ovs.PRIVATE_DATAPATH_TYPE, target, mtu, db=inst.db)

        # daemons start mostly asleep (vswitchd calibrates its TSC for 0.5 s): in parallel
        with ThreadPoolExecutor(max_workers=STARTUP_WORKERS) as pool:
            for future in [pool.submit(start, i, n) for i, n in zip(instances, shards)]:
                future.result()
        self.registry.save(self.record)

    def _wait_listening(self, timeout_s: float = 20.0) -> None:
        def listening() -> bool:
            self._check_controller_alive()
            try:
                with socket.create_connection((self.listen, self.of_port), timeout=0.2):
                    return True
            except OSError:
                return False

        wait_for(listening, timeout_s, f"the controller to listen on {self.listen}:{self.of_port} "
                                       f"(see {self.run_dir / 'controller.log'})")

    def _check_controller_alive(self) -> None:
        if self.controller is not None and self.controller.poll() is not None:
            err = (self.run_dir / "controller.stderr").read_text()[-2000:]
            raise TestbedError(f"controller exited with code {self.controller.returncode}",
                               stderr=err)

    def placement(self) -> dict | None:
        """Where the fabric's nodes are built: None, every one on this machine (a cluster's
        :meth:`testbed.cluster.coordinator.ClusterFabric.placement` says)."""
        return None

    def controller_status(self) -> dict:
        """The controller's latest status document (empty before its first write)."""
        try:
            return json.loads(self.status_path.read_text())
        except (OSError, ValueError):
            return {}

    def _wait_programmed(self) -> None:
        expected = {sw.name for sw in self.topo.switches}
        missing: list[str] = sorted(expected)

        def programmed() -> bool:
            nonlocal missing
            self._check_controller_alive()
            status = self.controller_status()
            problems = status.get("errors", []) + status.get("port_mismatches", [])
            if problems:
                raise TestbedError("controller reported problems:\n  " + "\n  ".join(problems))
            missing = sorted(expected - set(status.get("programmed", [])))
            return not missing

        try:
            wait_for(programmed, self.spec.controller.ready_timeout_s, "every switch to be "
                     "programmed")
        except TestbedError as err:
            raise TestbedError(f"{err}: {len(missing)} switch(es) are not: "
                               f"{', '.join(missing[:10])}; see "
                               f"{self.run_dir / 'controller.log'}") from None

    # -- operations on a running fabric ---------------------------------------------------------
    def reachability(self, count: int = 2, timeout_s: float = 120.0) -> Reachability:
        """Probe every ordered host pair ``count`` times, all sources at once (on a
        multi-plane fabric every pair of NICs of a plane)."""
        return probe_pairs(self.topo, self.run_parallel, count, timeout_s)

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
        path = self.run_dir / name
        write_text_atomic(path, text)
        return path

    def read_file(self, name: str, host: str | None = None) -> str:
        """A file of the run directory (``host``: where a process of that host wrote it; one
        machine here). Raises OSError when there is none."""
        return (self.run_dir / name).read_text()

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
        return set_links(netlink or self.netlink, [e for e in ends if e], up, self.cut)

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


def probe_pairs(topo, run_parallel: Callable[[dict, float], dict], count: int,
                timeout_s: float) -> Reachability:
    """Every ordered host pair of a plane probed ``count`` times, all sources at once, the
    commands run by ``run_parallel`` (:meth:`Fabric.run_parallel`, or a cluster's)."""
    hosts, plane = topo.hosts, topo.plane_of
    expected = {h.name: {o.ip: o.name for o in hosts
                         if o is not h and plane(o.name) == plane(h.name)} for h in hosts}
    interval = probe_interval_ms(len(hosts), len(topo.switches))
    commands = {src: fping_command(sorted(targets), count, interval)
                for src, targets in expected.items()}
    results = run_parallel(commands, timeout_s)
    return evaluate(expected, {name: out + err for name, (_, out, err) in results.items()})


def _reap(proc: subprocess.Popen) -> None:
    """Wait for an ended process and close its pipes."""
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
