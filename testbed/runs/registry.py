"""What each fabriclab run created, on disk, so any later process can remove exactly that.

A run records a resource *before* creating it (so a SIGKILL in between leaks nothing), and its
record is deleted only once everything in it is gone. Processes are identified by PID and kernel
start time, so a recycled PID is never signalled.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import threading
import time
import uuid
import zlib
from dataclasses import asdict, dataclass, field
from contextlib import contextmanager
from collections.abc import Iterator
from pathlib import Path

from testbed.errors import TestbedError
from testbed.linux.files import write_json_atomic
from testbed.poll import wait_for
from testbed.linux.procfs import read_stat
from testbed.paths import DEFAULT_STATE_DIR

__all__ = ["DEFAULT_STATE_DIR", "Registry", "Role", "RunRecord", "TrackedProcess"]


def current_netns() -> str:
    """This process's network namespace (``net:[4026531840]``): interfaces a run records are
    found by name in the namespace it made them in."""
    try:
        return os.readlink("/proc/self/ns/net")
    except OSError:
        return ""


def proc_start_time(pid: int) -> int | None:
    """The kernel start time (clock ticks since boot) of ``pid``; None if gone or a zombie."""
    stat = read_stat(pid)
    return None if stat is None or stat.gone else stat.start_ticks


@dataclass(frozen=True)
class Role:
    """What a tracked process is: a kind (``host``, ``ovs``, ``agent``, ``controller``,
    ``prometheus``, ...) and which one of that kind (a host's name, ``ovs0:ovs-vswitchd``).
    A run record stores it as ``kind:which`` (``host:h1_1_1``), or the kind alone."""

    kind: str
    which: str = ""

    HOST = "host"  # a host's shell: the namespace every process of that host lives in
    OVS = "ovs"  # a private Open vSwitch daemon: ``ovs0:ovsdb-server``

    def __str__(self) -> str:
        return f"{self.kind}:{self.which}" if self.which else self.kind

    @classmethod
    def parse(cls, text: str) -> Role:
        kind, _, which = text.partition(":")
        return cls(kind, which)

    @classmethod
    def host(cls, name: str) -> Role:
        """The shell of host ``name``."""
        return cls(cls.HOST, name)

    @classmethod
    def ovs(cls, instance: str, daemon: str) -> Role:
        """A private Open vSwitch daemon (``ovsdb-server`` or ``ovs-vswitchd``)."""
        return cls(cls.OVS, f"{instance}:{daemon}")

    @property
    def is_host(self) -> bool:
        return self.kind == self.HOST


@dataclass
class TrackedProcess:
    pid: int
    start: int
    role: str  # str(Role): as the run record stores it

    @property
    def kind(self) -> Role:
        """The role, parsed."""
        return Role.parse(self.role)

    def alive(self) -> bool:
        return proc_start_time(self.pid) == self.start


@dataclass
class RunRecord:
    """The resources of one run."""

    run_id: str
    owner_pid: int
    owner_start: int
    run_dir: str
    created: float = field(default_factory=time.time)
    bridges: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)  # root-namespace interface names
    bpf_pins: list[str] = field(default_factory=list)  # bpffs folders of pinned programs/maps
    processes: list[TrackedProcess] = field(default_factory=list)
    sysctls: dict[str, str] = field(default_factory=dict)  # raised for a while: old values
    files: list[str] = field(default_factory=list)  # outside the run directory (discovery)
    netns_names: list[str] = field(default_factory=list)  # hosts' names in /run/netns
    netns_inodes: dict[str, int] = field(default_factory=dict)  # each name's namespace, once made
    netns: str = field(default_factory=current_netns)  # where its interfaces are
    link_group: int = 0  # the link group its veths are in (0: none; deleted by name)

    def here(self) -> bool:
        """Whether this process is in the network namespace the run made its interfaces in
        (a namespace machine's part is cleaned inside it)."""
        return not self.netns or self.netns == current_netns()

    def owner_alive(self) -> bool:
        return proc_start_time(self.owner_pid) == self.owner_start

    def topology(self):
        """The topology the run built (its run directory's ``topology.json``), for the
        commands that act on a running fabric (``fail``, ``capture``)."""
        from testbed.model.topology import from_dict

        return from_dict(json.loads((Path(self.run_dir) / "topology.json").read_text()))


def run_file_name(name: str) -> str:
    """``name`` if it is a plain file name for a run directory (one path component, not hidden,
    not ``.`` or ``..``): what a cluster machine's actor writes or reads there comes from the
    coordinator, which must not reach outside the run directory.

    Raises:
        TestbedError: naming the refused name.
    """
    if not name or "/" in name or "\0" in name or name.startswith(".") or len(name) > 255:
        raise TestbedError(f"not a file name of the run directory: {name!r}")
    return name


def link_group_of(run_id: str) -> int:
    """A run's own link group: from its id, never 0 (every interface's default group)."""
    return (zlib.crc32(run_id.encode()) & 0x7FFFFFFF) or 1


#: every state directory a run was recorded in on this machine, one path per line: the orphan
#: sweep spares what a live run of any of them tagged (under /run: a reboot empties it)
STATE_DIR_INDEX = DEFAULT_STATE_DIR / "state-dirs"


def known_state_dirs(index: Path | None = None) -> list[Path]:
    """The state directories runs were recorded in on this machine, those still there."""
    try:
        lines = (index or STATE_DIR_INDEX).read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    return [Path(line) for line in dict.fromkeys(lines) if line and Path(line).is_dir()]


def _index_state_dir(state_dir: Path, index: Path | None = None) -> None:
    """Add ``state_dir`` to the machine's index (dropping directories gone since); a user who
    cannot write the index (not root) builds no fabric whose bridges the sweep could meet."""
    index = index or STATE_DIR_INDEX
    line = str(state_dir.resolve())
    if line in map(str, known_state_dirs(index)):
        return
    try:
        index.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(index, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError:
        return
    with os.fdopen(fd, "r+", encoding="utf-8") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        kept = [p for p in dict.fromkeys(fh.read().splitlines()) if p and Path(p).is_dir()]
        fh.seek(0)
        fh.truncate()
        fh.write("".join(f"{p}\n" for p in dict.fromkeys([*kept, line])))


class Registry:
    """Run records in ``state_dir/runs``."""

    def __init__(self, state_dir: Path = DEFAULT_STATE_DIR) -> None:
        self.state_dir = Path(state_dir)
        self.runs_dir = self.state_dir / "runs"
        self._lock = threading.Lock()  # records are updated from start-up threads

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """The state directory to this process alone (other processes wait): the live-run
        check and a new run's record under it, so two invocations at once cannot both see no
        fabric up and both build."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.state_dir / "lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def new_run(self, run_dir: Path) -> RunRecord:
        _index_state_dir(self.state_dir)
        pid = os.getpid()
        run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        record = RunRecord(run_id, pid, proc_start_time(pid) or 0, str(run_dir),
                           link_group=link_group_of(run_id))
        self.save(record)
        return record

    def path(self, record: RunRecord) -> Path:
        return self.runs_dir / f"{record.run_id}.json"

    def save(self, record: RunRecord) -> None:
        with self._lock:
            self.runs_dir.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.path(record), asdict(record))

    def remove(self, record: RunRecord) -> None:
        self.path(record).unlink(missing_ok=True)

    def scan(self) -> tuple[list[RunRecord], list[str]]:
        """Every run record, and a description of each file that is not a readable record
        (its resources cannot be cleaned until someone looks at it)."""
        records, unreadable = [], []
        for path in sorted(self.runs_dir.glob("*.json")) if self.runs_dir.exists() else []:
            try:
                data = json.loads(path.read_text())
                data["processes"] = [TrackedProcess(**p) for p in data.get("processes", [])]
                records.append(RunRecord(**data))
            except (OSError, ValueError, TypeError, AttributeError) as err:
                unreadable.append(f"{path}: not a readable run record ({err}); check what it "
                                  "lists and remove it by hand")
        return records, unreadable

    def running(self, run_id: str | None = None) -> RunRecord:
        """The one fabric whose process is alive (or the one named ``run_id``).

        Raises:
            TestbedError: none running, or several and no ``run_id``.
        """
        runs = [r for r in self.runs() if r.owner_alive() and (run_id in (None, r.run_id))]
        if not runs:
            raise TestbedError("no running fabric" + (f" with id {run_id}" if run_id else "")
                               + ": start one with 'fabriclab up FILE'")
        if len(runs) > 1:
            raise TestbedError("several fabrics are running: name one with --run "
                               + ", ".join(r.run_id for r in runs))
        return runs[0]

    def runs(self) -> list[RunRecord]:
        """Every run record.

        Raises:
            TestbedError: when a record cannot be read (naming the file).
        """
        records, unreadable = self.scan()
        if unreadable:
            raise TestbedError("\n".join(unreadable))
        return records

    def track_process(self, record: RunRecord, pid: int, role: str | Role) -> None:
        start = proc_start_time(pid)
        if start is not None:
            with self._lock:
                record.processes.append(TrackedProcess(pid, start, str(role)))
            self.save(record)

    def track_file(self, record: RunRecord, path: str) -> None:
        """Record a file the run wrote outside its directory (a Prometheus discovery file)."""
        with self._lock:
            if path not in record.files:
                record.files.append(path)
        self.save(record)

    def track_netns_name(self, record: RunRecord, name: str) -> None:
        """Record a host namespace's name (before it is made)."""
        with self._lock:
            if name not in record.netns_names:
                record.netns_names.append(name)
        self.save(record)

    def netns_named(self, record: RunRecord, name: str, inode: int | None) -> None:
        """Record which namespace a name of the run stands for, once made (cleanup removes the
        name only while it still stands for that one)."""
        if inode is not None:
            with self._lock:
                record.netns_inodes[name] = inode
            self.save(record)

    def untrack_netns_name(self, record: RunRecord, name: str) -> None:
        """Forget a name that turned out to be someone else's (cleanup must not remove it)."""
        with self._lock:
            record.netns_names = [n for n in record.netns_names if n != name]
        self.save(record)

    def untrack_process(self, record: RunRecord, pid: int) -> None:
        """Forget a process that has ended (reaped by its owner)."""
        with self._lock:
            record.processes = [p for p in record.processes if p.pid != pid]
        self.save(record)


def stop_process(proc: TrackedProcess, timeout_s: float = 5.0) -> None:
    """SIGTERM a tracked process (its process group if it leads one), then SIGKILL."""
    stop_processes([proc], timeout_s)


def stop_processes(procs: list[TrackedProcess], timeout_s: float = 5.0) -> int:
    """SIGTERM tracked processes all at once, wait for them together, SIGKILL the stragglers.

    Returns:
        How many were alive.
    """
    alive = [p for p in procs if p.alive()]
    for proc in alive:
        _signal(proc, signal.SIGTERM)
    left = _wait_gone(alive, timeout_s)
    for proc in left:
        _signal(proc, signal.SIGKILL)
    _wait_gone(left, 2.0)
    return len(alive)


def _wait_gone(procs: list[TrackedProcess], timeout_s: float) -> list[TrackedProcess]:
    """Wait until every process is gone; returns those still alive after ``timeout_s``."""
    try:
        wait_for(lambda: not any(p.alive() for p in procs), timeout_s, "processes to end",
                 interval_s=0.02)
        return []
    except TestbedError:
        return [p for p in procs if p.alive()]


def _signal(proc: TrackedProcess, sig: int) -> None:
    try:
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
    except ProcessLookupError:
        pass
