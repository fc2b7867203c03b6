"""The controller of a fabric built on this machine: started as its own process (os-ken, by
``controllers.launcher``) on a free OpenFlow port, waited for until it listens and has
programmed every switch, read through its status document, and replaced by a fresh one when
the next experiment runs on the same fabric."""

from __future__ import annotations

import json
import os
import select
import signal
import ssl
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from testbed.errors import TestbedError
from testbed.linux import ovs
from testbed.linux.pki import RunPki, make_run_pki
from testbed.model.spec import TestbedSpec
from testbed.poll import wait_for


CONTROLLER_WATCH_S = 0.2  # the longest the controller's watch waits before looking again


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


def exit_cause(returncode: int) -> str:
    """How a process ended, from its Popen return code (negative: the signal)."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


class ControllerProcess:
    """The controller's part of :class:`testbed.fabric.fabric.Fabric` (a mixin)."""

    def _init_controller(self) -> None:
        self.controller: subprocess.Popen | None = None
        self.of_port = 0
        self.controller_events: list[dict] = []  # its deaths (watch_controller)
        self.pki: RunPki | None = None  # OpenFlow over TLS: the run's certificates
        self._controller_ending = None  # a controller stopped on purpose (a restart)

    def watch_controller(self, stop) -> None:
        """A fabric service (:meth:`start_thread`): the controller's process watched (its end
        is seen at once, through a pidfd). Its death (not a restart's stop) is an event in
        :attr:`controller_events`. With ``controller.restart`` a new controller takes over at
        once, warm (it reads the switches' tables back and changes only what differs), and
        the control outage is measured; without it the death is a service error: a running
        job fails on it (the switches keep forwarding on what is installed, but failover,
        adaptive routing and spraying weights stop), and ``fabriclab up`` says it."""
        reported: set[int] = set()
        while not stop.is_set():
            proc = self.controller
            if proc is None or proc is self._controller_ending or proc.pid in reported:
                stop.wait(CONTROLLER_WATCH_S)
                continue
            if not _exited(proc, CONTROLLER_WATCH_S) or proc is not self.controller \
                    or proc is self._controller_ending:
                continue
            reported.add(proc.pid)
            died_at, cause = time.time(), exit_cause(proc.returncode)
            tail = self._keep_stderr(proc)
            self.controller_events.append({"t": died_at, "event": "died", "cause": cause,
                                           "pid": proc.pid})
            if self.spec.controller.restart and not stop.is_set():
                self._take_over(proc, died_at, stop)
                continue
            self.service_errors.append(
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
        self.stop(dead)  # reaped, out of the run record
        self.status_path.unlink(missing_ok=True)  # the dead one's: not what the new one says
        try:
            self._start_controller(self.of_port, warm=True)
            self._wait_listening(stop=stop)
            self._wait_programmed(stop=stop)
        except TestbedError as err:
            self.controller_events.append({"t": time.time(), "event": "restart failed",
                                           "cause": "the fabric went down first"
                                           if stop.is_set() else str(err)})
            if not stop.is_set():
                self.service_errors.append(f"controller: restarting it failed: {err}")
            return
        now, warm = time.time(), self.controller_status().get("warm_start", {})
        changes: dict[str, int] = {}
        for switch in warm.values():
            for kind, count in switch.get("changes", {}).items():
                changes[kind] = changes.get(kind, 0) + count
        self.controller_events.append({
            "t": now, "event": "restarted", "pid": self.controller.pid,
            "outage_s": round(now - died_at, 3), "switches_read": len(warm),
            "flows_read": sum(s.get("flows", 0) for s in warm.values()),
            "groups_read": sum(s.get("groups", 0) for s in warm.values()),
            "changes": changes})

    @property
    def status_path(self) -> Path:
        return self.run_dir / "controller-status.json"

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
        if spec.controller.remote != self.spec.controller.remote and \
                (spec.controller.remote or self.spec.controller.remote):
            raise TestbedError("controller.remote: the next experiment's switches would need "
                               "another controller address; run it on a fabric of its own")
        # the datapath stays the one built (``auto`` was resolved when the fabric came up)
        self.spec = replace(spec, emulator=replace(spec.emulator,
                                                   datapath=self.spec.emulator.datapath))
        if spec.controller.remote:  # the user's controller stays; it has the switches
            self._wait_programmed()
            return
        if self.controller is not None:
            self._controller_ending = self.controller  # its end is no death
            self.stop(self.controller)
            self.controller = None
        for path in (self.status_path, self.run_dir / "controller.log",
                     *(self.run_dir / "logs").glob("*.log")):
            path.unlink(missing_ok=True)
        self._start_controller(self.of_port)
        self._wait_listening()
        self._wait_programmed()
        self.timings["controller_restart"] = time.monotonic() - start

    def _start_controller(self, port: int = 0, warm: bool = False) -> None:
        """The controller process, listening on ``port`` (0: one the OS gives it, held from
        bind to listen; its number comes back in ``controller.port``)."""
        topo_path = self.run_dir / "topology.json"
        topo_path.write_text(json.dumps(self.topo.to_dict()))
        if self.spec.controller.tls and self.pki is None:
            self.pki = make_run_pki(self.run_dir / "pki", self.record.run_id, self.listen)
        self.port_file.unlink(missing_ok=True)
        ctl = self.spec.controller
        cmd = [sys.executable, "-m", "controllers.launcher", "--topology", str(topo_path),
               "--status", str(self.status_path), "--port", str(port),
               "--port-file", str(self.port_file), "--host", self.listen,
               "--log", str(self.run_dir / "controller.log")] + (
                   ["--user-app", ctl.app] if ctl.app else [
                       "--routing", ctl.routing, "--ecmp-seed", ctl.ecmp_seed,
                       "--ecmp-selection", ctl.ecmp_selection,
                       "--spray-weights", ctl.spray_weights,
                       "--poll-interval-s", str(ctl.poll_interval_s)]) + (
                   ["--warm-start"] if warm else []) + (
                   ["--tls-dir", str(self.pki.ca.parent)] if self.pki is not None else [])
        with open(self.run_dir / "controller.stderr", "w", encoding="utf-8") as err:
            self.controller = self.spawn(None, cmd, "controller", stdout=subprocess.DEVNULL,
                                         stderr=err)
        self.of_port = port
        if not port:  # what the switches are told: known once it listens
            self._wait_listening()

    @property
    def port_file(self) -> Path:
        return self.run_dir / "controller.port"

    def _wait_listening(self, timeout_s: float = 20.0, stop=None) -> None:
        """Until the controller listens: it writes its port once its socket does (a probe
        connection would be a failed TLS handshake in its log)."""
        def listening() -> bool:
            self._check_controller_alive(stop)
            try:
                self.of_port = int(self.port_file.read_text())
            except (OSError, ValueError):
                return False
            return True

        wait_for(listening, timeout_s, f"the controller to listen on {self.listen} "
                                       f"(see {self.run_dir / 'controller.log'})")

    def client_tls(self) -> ssl.SSLContext | None:
        """The switches' side of OpenFlow over TLS (None: plain TCP)."""
        if self.pki is None:
            return None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_verify_locations(self.pki.ca)
        ctx.load_cert_chain(self.pki.switch_cert, self.pki.switch_key)
        return ctx

    def _check_controller_alive(self, stop=None) -> None:
        """Raises TestbedError when the controller exited, or the fabric's services are
        stopping (``stop``: a service thread's stop event)."""
        if stop is not None and stop.is_set():
            raise TestbedError("the fabric is going down")
        if self.controller is not None and self.controller.poll() is not None:
            err = (self.run_dir / "controller.stderr").read_text()[-2000:]
            raise TestbedError(f"controller exited with code {self.controller.returncode}",
                               stderr=err)

    def controller_status(self) -> dict:
        """The controller's latest status document (empty before its first write)."""
        try:
            return json.loads(self.status_path.read_text())
        except (OSError, ValueError):
            return {}

    def _wait_programmed(self, stop=None) -> None:
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
            self._check_controller_alive(stop)
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
            agent = getattr(self, "switch_agent", None)
            seen = (agent.errors + agent.disconnects)[:5] if agent is not None else []
            said = "; the eBPF switches' agent: " + "; ".join(seen) if seen else ""
            raise TestbedError(f"{err}: {len(missing)} switch(es) are not: "
                               f"{', '.join(missing[:10])}{said}; see "
                               f"{self.run_dir / 'controller.log'}") from None

    def switch_states(self) -> dict[str, tuple[bool, int]]:
        """Each switch here: connected to its controller, and how many flows it holds."""
        if self.switch_agent is not None:
            return self.switch_agent.states()
        return ovs.switch_states({name: self.switch_instance.get(name)
                                  for name in self.record.bridges})

    def _wait_settled(self, stop=None) -> None:
        """A controller that is not fabriclab's says nothing of its progress: ready once every
        switch is connected and the flow tables stayed as they were for ``settle_s``."""
        ctl = self.spec.controller
        last: dict = {}
        since = time.monotonic()

        def settled() -> bool:
            nonlocal last, since
            self._check_controller_alive(stop)
            now, states = time.monotonic(), self.switch_states()
            if states != last or not all(up for up, _ in states.values()):
                last, since = states, now
                return False
            return now - since >= ctl.settle_s

        try:
            wait_for(settled, ctl.ready_timeout_s + ctl.settle_s, "every switch connected to "
                     f"the {ctl.kind} controller, its flow tables settled", interval_s=0.25)
        except TestbedError as err:
            down = sorted(name for name, (up, _) in last.items() if not up)
            agent = self.switch_agent
            refused = [d for d in (agent.disconnects if agent is not None else [])
                       if "speaks 1.5 (0x06) only" in d]
            hint = (f"; {refused[-1]}: a controller of OpenFlow 1.3 (os-ken's LLDP discovery "
                    "too) needs emulator.datapath: ovs" if down and refused else "")
            raise TestbedError(f"{err}: " + (f"{len(down)} switch(es) not connected to "
                               f"{self.controller_address}: {', '.join(down[:10])}" if down
                               else "the flow tables kept changing") + hint + (
                               f"; see {self.run_dir / 'controller.log'}" if ctl.app
                               else "")) from None
