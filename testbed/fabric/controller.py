"""The controller of a fabric, run on this machine: started as its own process (os-ken, by
``controllers.launcher``) on a free OpenFlow port, waited for until it listens and has
programmed every switch, read through its status document, watched (a death is an event; with
``controller.restart`` a new one takes over, warm), and replaced by a fresh one when the next
experiment runs on the same fabric.

:class:`Controller` is a part of :class:`testbed.fabric.fabric.Fabric` and of a cluster's
coordinator (:class:`testbed.cluster.coordinator.ClusterFabric`), which builds no switch."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import ssl
import subprocess
import sys
import time
import threading
from pathlib import Path
from typing import Protocol

from testbed.errors import TestbedError
from testbed.fabric.services import FabricRun
from testbed.linux.files import unix_address
from testbed.linux.pki import RunPki, make_run_pki
from testbed.model.spec import Datapath, TestbedSpec
from testbed.model.topology import Topology
from testbed.poll import wait_for


CONTROLLER_WATCH_S = 0.2  # the longest the controller's watch waits before looking again
#: ``controller.restart``: the wait before each take-over within :data:`RESTART_WINDOW_S` of
#: the first; one more death in the window is a service error (a controller that dies at once
#: is not restarted for ever)
RESTART_BACKOFF_S = (0.0, 0.5, 1.0, 2.0, 4.0)
RESTART_WINDOW_S = 60.0


def _exited(proc: subprocess.Popen, timeout_s: float) -> bool:
    """Whether ``proc`` ended within ``timeout_s`` (woken by its pidfd the moment it does)."""
    if proc.poll() is not None:
        return True
    try:
        fd = os.pidfd_open(proc.pid)
    except OSError:  # gone already (reaped elsewhere)
        return proc.poll() is not None
    try:  # poll, not select: a run with hundreds of agents holds descriptors past 1024
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.poll(timeout_s * 1000)
    finally:
        os.close(fd)
    return proc.poll() is not None


def _port_of(target: object) -> int:
    """The port of a ``host:port`` target (0: none)."""
    port = str(target or "").rpartition(":")[2]
    return int(port) if port.isdigit() else 0


def exit_cause(returncode: int) -> str:
    """How a process ended, from its Popen return code (negative: the signal)."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


class SwitchView(Protocol):
    """What the controller's waits read of the switches built here (their part)."""

    def states(self) -> dict[str, tuple[bool, int]]:
        """Each switch: connected to its controller, and how many flows it holds."""

    def notes(self) -> list[str]:
        """What the switches' own OpenFlow agent saw go wrong (the eBPF switches')."""

    def refusals(self) -> list[str]:
        """Version negotiations the switches refused: no waiting will make them connect."""


class Controller:
    """The controller's process on this machine, for the switches of a fabric.

    Args:
        spec: the fabric's settings (``controller``'s above all).
        topo: the model it programs (written to ``topology.json`` for it).
        run: the fabric's run (directory, record, services).
        listen: the address it listens on (a cluster's coordinator: its underlay address).
        switches: the switches built here (None: none, a cluster's coordinator).
    """

    def __init__(self, spec: TestbedSpec, topo: Topology, run: FabricRun, listen: str,
                 switches: SwitchView | None = None) -> None:
        self.spec = spec
        self.topo = topo
        self.run = run
        self.listen = listen
        self.switches = switches
        self.process: subprocess.Popen | None = None
        self.of_port = 0
        self.events: list[dict] = []  # its deaths (watch)
        self.pki: RunPki | None = None  # OpenFlow over TLS: the run's certificates
        self._ending = None  # a controller stopped on purpose (a restart)
        #: the OpenFlow listening socket, the fabric's: every controller of the run serves it
        #: (a restart leaves the port to no one) until :meth:`close`
        self._listener: socket.socket | None = None
        self._bound: Path | None = None  # the unix socket's file, once bound
        self.restarts: list[float] = []  # when each take-over began (rate-limited)
        self.metrics_port = 0  # the exporter's port a restarted controller serves again

    @property
    def channel(self) -> str:
        """How the switches reach it: ``tls`` (the run's own certificates, both ways), where
        the datapath can; else ``unix`` (a socket of root's only, in Open vSwitch's run
        directory: the machine's Open vSwitch keeps one SSL setting for all its bridges);
        ``tcp`` only when ``controller.tls`` is false (or for a cluster's coordinator whose
        machines may be on the kernel datapath)."""
        tls = self.spec.controller.tls
        if tls is False:
            return "tcp"
        kernel_ovs = getattr(self.switches, "kernel_ovs", None)
        if kernel_ovs is None:  # a cluster's coordinator: its switches are elsewhere, their
            # kernel unknown here; eBPF switches take TLS everywhere
            ebpf = self.spec.emulator.datapath == Datapath.EBPF
            return "tls" if tls or (tls is None and ebpf) else "tcp"
        return "unix" if kernel_ovs and tls is None else "tls"

    @property
    def socket_path(self) -> Path:
        """The unix socket of the ``unix`` channel: in the switches' Open vSwitch's run
        directory (where it agrees to connect), named after the run, 0600."""
        return Path(self.switches.socket_dir) / f"fabriclab-{self.run.record.run_id}.sock"

    @property
    def target(self) -> str:
        """The switches' controller target, as Open vSwitch writes it."""
        if self.channel == "unix":
            return f"unix:{self.socket_path}"
        return f"{'ssl' if self.channel == 'tls' else 'tcp'}:{self.listen}:{self.of_port}"

    def _listening(self, port: int) -> socket.socket:
        """The run's listening socket, made on first use: on ``port`` (0: the OS's choice)
        of the listen address, or the unix socket (0600, root's)."""
        if self._listener is not None:
            return self._listener
        if self.channel == "unix":
            self._bound = self.socket_path
            self.run.track_file(self._bound)  # (a crash leaves it to 'fabriclab clean')
            self._bound.unlink(missing_ok=True)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            with unix_address(self.socket_path) as address:  # a path may be a long one
                sock.bind(address)
            os.chmod(self.socket_path, 0o600)
        else:
            family = socket.AF_INET6 if ":" in self.listen else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.listen, port))
        sock.listen(128)
        self._listener = sock
        return sock

    def close(self) -> None:
        """The listening socket closed (the fabric is down: its controllers are gone)."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._bound is not None:
            self._bound.unlink(missing_ok=True)
            self._bound = None

    @property
    def run_dir(self) -> Path:
        return self.run.run_dir

    def watch(self, stop: threading.Event) -> None:
        """A fabric service (:meth:`FabricRun.start_thread`): the controller's process
        watched (its end is seen at once, through a pidfd). Its death (not a restart's stop)
        is an event in :attr:`events`. With ``controller.restart`` a new controller takes over
        at once, warm (it reads the switches' tables back and changes only what differs), and
        the control outage is measured; without it the death is a service error: a running
        job fails on it (the switches keep forwarding on what is installed, but failover,
        adaptive routing and spraying weights stop), and ``fabriclab up`` says it."""
        reported: set[int] = set()
        while not stop.is_set():
            proc = self.process
            if proc is None or proc is self._ending or proc.pid in reported:
                stop.wait(CONTROLLER_WATCH_S)
                continue
            if not _exited(proc, CONTROLLER_WATCH_S) or proc is not self.process \
                    or proc is self._ending:
                continue
            reported.add(proc.pid)
            died_at, cause = time.time(), exit_cause(proc.returncode)
            tail = self._keep_stderr(proc)
            self.events.append({"t": died_at, "event": "died", "cause": cause, "pid": proc.pid})
            if self.spec.controller.restart and not stop.is_set():
                recent = [t for t in self.restarts if died_at - t < RESTART_WINDOW_S]
                if len(recent) < len(RESTART_BACKOFF_S):
                    if not stop.wait(RESTART_BACKOFF_S[len(recent)]):
                        self.restarts.append(time.time())
                        self._take_over(proc, died_at, stop)
                    continue
                self.events.append({"t": time.time(), "event": "restart given up",
                                    "cause": cause})
                self.run.errors.append(
                    f"controller: {cause}, after {len(recent)} restarts within "
                    f"{RESTART_WINDOW_S:g} s: not restarted again (the switches forward on "
                    "what is installed)" + (f"; its stderr: {tail}" if tail else ""))
                continue
            self.run.errors.append(
                f"controller: {cause} (the switches forward on what is installed; failover, "
                "adaptive routing and spraying stop)" + (f"; its stderr: {tail}" if tail else ""))

    def _keep_stderr(self, dead: subprocess.Popen) -> str:
        """A dead controller's stderr kept under its PID (a restarted one writes its own);
        returns its last lines."""
        path = self.run_dir / "controller.stderr"
        try:
            text = path.read_text()
            if self.spec.controller.restart:
                path.rename(self.run_dir / f"controller-{dead.pid}.stderr")
        except OSError:
            return ""
        return text[-500:].strip()

    def _take_over(self, dead: subprocess.Popen, died_at: float, stop) -> None:
        """A new controller on the same port, warm; the outage of control (from the death to
        every switch programmed again) and what its warm start found and changed, as an event
        (a failure to take over is a service error)."""
        self.run.stop(dead)  # reaped, out of the run record
        self.metrics_port = _port_of(self.status().get("metrics")) or self.metrics_port
        self.status_path.unlink(missing_ok=True)  # the dead one's: not what the new one says
        try:
            self.start(self.of_port, warm=True)
            self.wait_listening(stop=stop)
            self.wait_programmed(stop=stop)
        except TestbedError as err:
            self.events.append({"t": time.time(), "event": "restart failed",
                                "cause": "the fabric went down first"
                                if stop.is_set() else str(err)})
            alive = self.process is not None and self.process.poll() is None
            if not stop.is_set() and alive:  # (a dead one is the watch's next death)
                self.run.errors.append(f"controller: restarting it failed: {err}")
            return
        now, warm = time.time(), self.status().get("warm_start", {})
        changes: dict[str, int] = {}
        for switch in warm.values():
            for kind, count in switch.get("changes", {}).items():
                changes[kind] = changes.get(kind, 0) + count
        self.events.append({
            "t": now, "event": "restarted", "pid": self.process.pid,
            "outage_s": round(now - died_at, 3), "switches_read": len(warm),
            "flows_read": sum(s.get("flows", 0) for s in warm.values()),
            "groups_read": sum(s.get("groups", 0) for s in warm.values()),
            "changes": changes})

    @property
    def status_path(self) -> Path:
        return self.run_dir / "controller-status.json"

    def replace(self, spec: TestbedSpec) -> None:
        """The next experiment's controller on this fabric (the caller checked that ``spec``
        builds the same fabric): a fresh one on the same OpenFlow port (no routing state,
        counters or log carried over); the switches reconnect (within their 1 s backoff) and
        are cleared and programmed again; the agents' logs of the previous run are removed.
        The user's remote controller stays: only waited for."""
        self.spec = spec
        if spec.controller.remote:  # the user's controller stays; it has the switches
            self.wait_programmed()
            return
        if self.process is not None:
            self._ending = self.process  # its end is no death
            self.run.stop(self.process)
            self.process = None
        for path in (self.status_path, self.run_dir / "controller.log",
                     *(self.run_dir / "logs").glob("*.log")):
            path.unlink(missing_ok=True)
        self.start(self.of_port)
        self.wait_listening()
        self.wait_programmed()

    def start(self, port: int = 0, warm: bool = False) -> None:
        """The controller process, serving the run's listening socket (made on ``port`` the
        first time, 0: one the OS gives; held by the fabric from then on)."""
        topo_path = self.run_dir / "topology.json"
        topo_path.write_text(json.dumps(self.topo.to_dict()))
        if self.channel == "tls" and self.pki is None:
            self.pki = make_run_pki(self.run_dir / "pki", self.run.record.run_id, self.listen)
        self.port_file.unlink(missing_ok=True)
        ctl = self.spec.controller
        listener = self._listening(port)
        if self.channel != "unix":
            port = listener.getsockname()[1]
        cmd = [sys.executable, "-m", "controllers.launcher", "--topology", str(topo_path),
               "--status", str(self.status_path), "--port", str(port),
               "--port-file", str(self.port_file), "--host", self.listen,
               "--listen-fd", str(listener.fileno()),
               "--log", str(self.run_dir / "controller.log")] + (
                   ["--user-app", ctl.app] if ctl.app else [
                       "--routing", ctl.routing, "--ecmp-seed", ctl.ecmp_seed,
                       "--ecmp-selection", ctl.ecmp_selection,
                       "--spray-weights", ctl.spray_weights,
                       "--poll-interval-s", str(ctl.poll_interval_s),
                       "--granularity", ctl.granularity,
                       "--flowlet-gap-us", str(ctl.flowlet_gap_us),
                       "--load", ctl.load,
                       "--rebalance", ",".join(map(str, ctl.rebalance))]) + (
                   ["--warm-start", "--metrics-port", str(self.metrics_port)] if warm
                   else []) + (
                   ["--tls-dir", str(self.pki.ca.parent)] if self.pki is not None else [])
        with open(self.run_dir / "controller.stderr", "w", encoding="utf-8") as err:
            self.process = self.run.spawn(None, cmd, "controller", stdout=subprocess.DEVNULL,
                                          stderr=err, pass_fds=(listener.fileno(),))
        self.of_port = port

    @property
    def port_file(self) -> Path:
        return self.run_dir / "controller.port"

    @property
    def address(self) -> tuple[str, int]:
        """Where the switches reach it."""
        return self.listen, self.of_port

    def wait_listening(self, timeout_s: float = 20.0, stop=None) -> None:
        """Until the controller listens: it writes its port once its socket does (a probe
        connection would be a failed TLS handshake in its log)."""
        def listening() -> bool:
            self._check_alive(stop)
            try:
                self.of_port = int(self.port_file.read_text())
            except (OSError, ValueError):
                return False
            return True

        wait_for(listening, timeout_s, f"the controller to listen on {self.listen} "
                                       f"(see {self.run_dir / 'controller.log'})")

    def client_tls(self) -> ssl.SSLContext | None:
        """The switches' side of OpenFlow over TLS (None: plain TCP)."""
        return self.pki.client_context() if self.pki is not None else None

    def _check_alive(self, stop=None) -> None:
        """Raises TestbedError when the controller exited, the switches refused its OpenFlow
        version (known at the first hello: no reason to wait), or the fabric's services are
        stopping (``stop``: a service thread's stop event)."""
        if stop is not None and stop.is_set():
            raise TestbedError("the fabric is going down")
        refused = self.switches.refusals() if self.switches is not None else []
        if refused:
            raise TestbedError(f"the switches refused the controller at its hello: "
                               f"{refused[0]}" + (f" (and {len(refused) - 1} more)"
                                                  if len(refused) > 1 else "")
                               + "; Open vSwitch's bridges (emulator.datapath: ovs) also "
                                 "take OpenFlow 1.0 and 1.4")
        if self.process is not None and self.process.poll() is not None:
            err = (self.run_dir / "controller.stderr").read_text()[-2000:]
            raise TestbedError(f"controller exited with code {self.process.returncode}",
                               stderr=err)

    def status(self) -> dict:
        """The controller's latest status document (empty before its first write)."""
        try:
            return json.loads(self.status_path.read_text())
        except (OSError, ValueError):
            return {}

    def wait_probed(self) -> None:
        """Until its LLDP probes have gone through every switch (fabriclab's controller)."""
        def probed() -> bool:
            status = self.status()
            return status.get("wiring_verified", 0) >= status.get("wiring_expected", 0)

        wait_for(probed, self.spec.controller.ready_timeout_s,
                 "the controller's LLDP probes through every switch")

    def _notes(self) -> list[str]:
        return self.switches.notes() if self.switches is not None else []

    def wait_programmed(self, stop=None) -> None:
        """Until every switch is programmed: by fabriclab's controller, as its status says; by
        a user's app or remote controller, once every switch is connected and no flow table
        has changed for ``controller.settle_s``."""
        if not self.spec.controller.own:
            self._wait_settled(stop)
            return
        expected = {sw.name for sw in self.topo.switches}
        missing: list[str] = sorted(expected)

        def programmed() -> bool:
            nonlocal missing
            self._check_alive(stop)
            status = self.status()
            problems = status.get("errors", []) + status.get("port_mismatches", [])
            if problems:
                raise TestbedError("controller reported problems:\n  " + "\n  ".join(problems))
            missing = sorted(expected - set(status.get("programmed", [])))
            return not missing

        try:
            wait_for(programmed, self.spec.controller.ready_timeout_s, "every switch to be "
                     "programmed")
        except TestbedError as err:
            seen = self._notes()[:5]
            said = "; the eBPF switches' agent: " + "; ".join(seen) if seen else ""
            raise TestbedError(f"{err}: {len(missing)} switch(es) are not: "
                               f"{', '.join(missing[:10])}{said}; see "
                               f"{self.run_dir / 'controller.log'}") from None

    def _wait_settled(self, stop=None) -> None:
        """A controller that is not fabriclab's says nothing of its progress: ready once every
        switch is connected and the flow tables stayed as they were for ``settle_s``."""
        ctl = self.spec.controller
        last: dict = {}
        since = time.monotonic()

        def settled() -> bool:
            nonlocal last, since
            self._check_alive(stop)
            now = time.monotonic()
            states = self.switches.states() if self.switches is not None else {}
            if states != last or not all(up for up, _ in states.values()):
                last, since = states, now
                return False
            return now - since >= ctl.settle_s

        try:
            wait_for(settled, ctl.ready_timeout_s + ctl.settle_s, "every switch connected to "
                     f"the {ctl.kind} controller, its flow tables settled", interval_s=0.25)
        except TestbedError as err:
            down = sorted(name for name, (up, _) in last.items() if not up)
            notes = self._notes()
            hint = f"; the eBPF switches' agent: {notes[-1]}" if down and notes else ""
            where = self.spec.controller.remote_address if ctl.remote else self.address
            raise TestbedError(f"{err}: " + (f"{len(down)} switch(es) not connected to "
                               f"{where[0]}:{where[1]}: {', '.join(down[:10])}" if down
                               else "the flow tables kept changing") + hint + (
                               f"; see {self.run_dir / 'controller.log'}" if ctl.app
                               else "")) from None
