"""A fabric's run on this machine: its record (everything it creates, recorded before it is
created), its run directory, and the services that live exactly as long as it: processes (in
a host's network namespace or this machine's) and threads given a stop event, each ended at
teardown (processes by PID).

:class:`FabricRun` is what every kind of fabric has, a cluster's coordinator too (its
controller is such a process); the parts of :class:`testbed.fabric.fabric.Fabric` receive it.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from testbed import stops
from testbed.errors import TestbedError
from testbed.fabric.lifecycle import reap
from testbed.linux import bpf
from testbed.linux.files import write_text_atomic
from testbed.runs import cleanup
from testbed.runs.registry import Registry, RunRecord, run_file_name, stop_processes

THREAD_JOIN_S = 10.0
#: how a process starts in a host's namespace: (host, argv, Popen keywords) -> the process
HostPopen = Callable[..., subprocess.Popen]


class FabricRun:
    """One fabric's run record, run directory and services.

    Args:
        registry: the machine's run records (``STATE_DIR/runs``).
        log: progress lines.
    """

    def __init__(self, registry: Registry, log: Callable[[str], None]) -> None:
        self.registry = registry
        self.log = log
        self.record: RunRecord | None = None
        #: what fabric service threads died of
        self.errors: list[str] = []
        self.host_popen: HostPopen | None = None  # set once the hosts exist
        self._processes: list[subprocess.Popen] = []
        self._threads: list[tuple[threading.Thread, threading.Event]] = []

    # -- the record ----------------------------------------------------------------------------
    def open(self, orphans: bool = True) -> RunRecord:
        """Clean what runs killed with SIGKILL left (``orphans``: also unrecorded leftovers;
        a cluster machine's registry knows only its own runs), refuse while another fabric
        is up, and record a new run with its private run directory."""
        with self.registry.exclusive():  # from the check until the run is recorded
            report = cleanup.clean(self.registry, orphans=orphans)
            if report.runs:
                self.log(f"cleaned {len(report.runs)} stale run(s)")
            if report.errors:
                raise TestbedError("cannot clean what earlier runs left behind (see "
                                   "'fabriclab clean'):\n  " + "\n  ".join(report.errors))
            live = [r for r in self.registry.runs() if r.owner_alive()]
            if live:
                raise TestbedError(f"another fabric is up (run {live[0].run_id}, pid "
                                   f"{live[0].owner_pid}); 'fabriclab down' tears it down")
            work = self.registry.state_dir / "work"
            self.record = record = self.registry.new_run(work)
        record.run_dir = str(work / record.run_id)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir.chmod(0o700)  # job specs, sockets, logs: the run's own, nobody else's
        self.registry.save(record)
        return record

    def pin_dir(self) -> Path:
        """The run's BPF pins, recorded for teardown and ``fabriclab clean``."""
        pins = bpf.PIN_ROOT / self.record.run_id
        if str(pins) not in self.record.bpf_pins:
            self.record.bpf_pins.append(str(pins))
            self.save()
        return pins

    def save(self) -> None:
        """Write the record as it stands (before creating what it now names)."""
        self.registry.save(self.record)

    @property
    def run_dir(self) -> Path:
        assert self.record is not None
        return Path(self.record.run_dir)

    def write_file(self, name: str, text: str) -> Path:
        """Write ``name`` into the run directory (atomically); returns its path."""
        write_text_atomic(path := self.run_dir / run_file_name(name), text)
        return path

    def read_file(self, name: str) -> str:
        """A file of the run directory. Raises OSError when there is none."""
        return (self.run_dir / run_file_name(name)).read_text()

    def _require(self, what: str) -> RunRecord:
        if self.record is None:
            raise TestbedError(f"{what}: the fabric is not up")
        return self.record

    def track_process(self, pid: int, role: str) -> None:
        """Record a process started for this fabric, so that ``fabriclab clean`` stops it if
        this process dies before its teardown does."""
        self.registry.track_process(self._require(role), pid, role)

    def track_file(self, path: Path) -> None:
        """Record a file written for this fabric outside its run directory, so that
        ``fabriclab clean`` removes it if this process dies before removing it itself."""
        self.registry.track_file(self._require(str(path)), str(path))

    # -- services ------------------------------------------------------------------------------
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
            :meth:`close` (or ``fabriclab clean`` after a SIGKILL) ends it otherwise.
        """
        record = self._require(role)
        if host is not None and self.host_popen is None:
            raise TestbedError(f"{role}: no host {host} on this machine")
        # a stop landing between the fork and the tracking would leave an untracked process
        # that no teardown ends: it waits until the process is tracked (testbed.stops)
        with stops.held():
            if host is None:
                popen_kwargs.setdefault("stdin", subprocess.DEVNULL)
                proc = subprocess.Popen(argv, start_new_session=True, **popen_kwargs)
            else:
                proc = self.host_popen(host, argv, **popen_kwargs)
            self._processes.append(proc)
            self.registry.track_process(record, proc.pid, role)
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
        """Run ``target(stop)`` in a daemon thread until :meth:`close` sets ``stop``.

        The target must return soon after ``stop`` is set (it is joined for
        ``THREAD_JOIN_S``; one that is not done by then is reported as a teardown error). An
        exception that ends it is kept in :attr:`errors`, never lost.
        """
        self._require(role)
        stop = threading.Event()

        def guarded(event: threading.Event) -> None:
            try:
                target(event)
            except Exception as err:  # noqa: BLE001 - kept for the caller, see errors
                self.errors.append(f"{role}: {type(err).__name__}: {err}")

        thread = threading.Thread(target=guarded, args=(stop,), name=role, daemon=True)
        self._threads.append((thread, stop))
        thread.start()
        return thread

    def stop_thread(self, thread: threading.Thread) -> None:
        """End one thread of :meth:`start_thread` now; one that does not stop within
        ``THREAD_JOIN_S`` is an error."""
        for item in [t for t in self._threads if t[0] is thread]:
            item[1].set()
            thread.join(THREAD_JOIN_S)
            self._threads.remove(item)
            if thread.is_alive():
                raise TestbedError(f"service thread {thread.name} did not stop")

    def stop_threads(self) -> list[str]:
        """Every service thread told to stop and joined; returns those that did not stop."""
        for _thread, stop in self._threads:
            stop.set()
        for thread, _ in self._threads:
            thread.join(THREAD_JOIN_S)
        stuck = [t.name for t, _ in self._threads if t.is_alive()]
        self._threads.clear()
        return stuck

    def close(self, stuck: list[str]) -> None:
        """Remove everything the record names (processes by PID, links, bridges, pins, the
        run directory) and reap the processes; ``stuck``: threads that did not stop.

        Raises:
            TestbedError: what could not be removed (``fabriclab clean`` tries again).
        """
        report = cleanup.clean_record(self.record, self.registry, keep_run_dir=False)
        for proc in self._processes:  # ended by PID above: reap them
            reap(proc)
        self._processes.clear()
        self.host_popen = None
        if stuck:
            report.errors.append(f"service threads did not stop: {', '.join(stuck)}")
        if report.errors:
            raise TestbedError("teardown incomplete (run 'fabriclab clean'):\n  "
                               + "\n  ".join(report.errors))
        self.record = None
