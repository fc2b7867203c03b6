"""Machines as network namespaces on this host, the adapter: the cluster tests' machines (and
a way to try a partitioned run on one machine). Each machine is a namespace with its own underlay
address on a bridge in the root namespace, and runs a Ray node (the head in the first), with a
custom resource named after the machine so that work can be pinned to it. Every Ray process
(``ray start --block`` and the daemons it starts) is ended by PID, never by name: ``ray stop``
would end every Ray process of the host.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from testbed.errors import TestbedError
from testbed.poll import wait_for
from testbed.linux import procfs
from testbed.plan.portplan import SEND_BUFFER_MAX
from testbed.linux.procfs import descendants, read_stat

UNDERLAY_PREFIX = "10.250.0"
GATEWAY = f"{UNDERLAY_PREFIX}.254"  # the root namespace's address on the underlay bridge
RAY_PORT = 6379
OBJECT_STORE_BYTES = 80 * 1024 * 1024  # Ray's minimum is 75 MiB; the default is 30 % of RAM
#: The socket send buffer default is the host kernel's, read-only inside the machines'
#: namespaces, where a fabric part's switches need it raised (testbed.fabric.fabric): the cluster
#: raises it to the most a build would while it is up.
SEND_BUFFER_SYSCTL = "net.core.wmem_default"
#: ``sh -c`` program: an empty read-only tmpfs over each folder argument up to ``--``, then exec
#: the rest
HIDE_AND_EXEC = ('while [ "$1" != -- ]; do mount -t tmpfs -o ro,size=16k fabriclab-hidden "$1" '
                 '|| exit 97; shift; done; shift; exec "$@"')


@dataclass
class NsMachine:
    """One machine: its namespace, underlay address, Ray resource name and Ray node."""

    name: str  # the Ray resource (machine1, ...)
    netns: str
    ip: str
    ray: subprocess.Popen | None = None
    pids: list[tuple[int, int]] = field(default_factory=list)  # its Ray node's processes
    # (PID, start ticks), when stopped
    hidden: tuple[Path, ...] = ()  # folders its Ray node does not see (an empty tmpfs over each)


class NamespaceCluster:
    """``count`` machines (namespaces ``flm{i}-{tag}``) on the underlay bridge ``flu-{tag}``,
    Ray nodes in them; :meth:`stop` (or leaving the ``with``) ends and removes everything.

    Args:
        count: machines (at least 1).
        ray: the ``ray`` program (the venv's).
        underlay_mtu: the underlay's MTU (1550: a 1500-byte fabric in VXLAN).
        hidden: per machine name, folders its Ray node must not see (a machine without the
            project, say): its node runs in a mount namespace of its own with an empty tmpfs
            over each, which ends with its last process.
    """

    def __init__(self, count: int, ray: str, underlay_mtu: int = 1550,
                 hidden: dict[str, list[Path]] | None = None) -> None:
        if not 1 <= count <= 16:
            raise ValueError(f"1 to 16 machines, got {count}")
        self.tag = f"{os.getpid() % 100000}"
        self.bridge = f"flu-{self.tag}"
        self.ray = ray
        self.mtu = underlay_mtu
        self.temp = Path(tempfile.mkdtemp(prefix="fabriclab-ray-"))
        # Ray's token authentication, as docs/cluster.md asks of a real cluster: every node and
        # every driver (run()) holds the cluster's token; nothing else may call its actors
        self.auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
        self.errors: list[str] = []  # what stop() could not clean
        self.sysctl_old: str | None = None  # the send buffer default before start()
        self.machines = [NsMachine(f"machine{i}", f"flm{i}-{self.tag}",
                                   f"{UNDERLAY_PREFIX}.{i}") for i in range(1, count + 1)]
        for name, folders in (hidden or {}).items():
            m = next((x for x in self.machines if x.name == name), None)
            if m is None:
                raise ValueError(f"hidden: no machine {name} among {count}")
            m.hidden = tuple(Path(f).resolve() for f in folders)

    @property
    def address(self) -> str:
        """The Ray cluster's address (the head's GCS)."""
        return f"{self.machines[0].ip}:{RAY_PORT}"

    def __enter__(self) -> NamespaceCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, timeout_s: float = 120.0) -> None:
        """The underlay, then the head, then the workers; returns once every node has joined."""
        old = procfs.read_sysctl(SEND_BUFFER_SYSCTL)  # the machines' kernel setting: see
        if int(old) < SEND_BUFFER_MAX:                # Fabric._raise_send_buffer
            self.sysctl_old = old
            procfs.write_sysctl(SEND_BUFFER_SYSCTL, str(SEND_BUFFER_MAX))
        _ip("link", "add", self.bridge, "mtu", str(self.mtu), "type", "bridge")
        _ip("addr", "add", f"{GATEWAY}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, m in enumerate(self.machines, start=1):
            _ip("netns", "add", m.netns)
            outer = f"flu{i}-{self.tag}"
            _ip("link", "add", outer, "mtu", str(self.mtu), "type", "veth", "peer", "name",
                "underlay", "mtu", str(self.mtu), "netns", m.netns)
            _ip("link", "set", outer, "master", self.bridge, "up")
            _ip("addr", "add", f"{m.ip}/24", "dev", "underlay", netns=m.netns)
            _ip("link", "set", "underlay", "up", netns=m.netns)
            _ip("link", "set", "lo", "up", netns=m.netns)
        head = self.machines[0]
        head.ray = self._ray_node(head, ["--head", "--port", str(RAY_PORT)])
        wait_for(lambda: _listening(head.ip, RAY_PORT) or self._died(head), timeout_s,
                 "the Ray head to listen", interval_s=0.2)
        self._check_alive(head)
        for m in self.machines[1:]:
            m.ray = self._ray_node(m, ["--address", self.address])
        wait_for(lambda: self.nodes_alive() >= len(self.machines)
                 or any(self._died(m) for m in self.machines), timeout_s,
                 f"{len(self.machines)} Ray nodes to join", interval_s=1.0)
        for m in self.machines:
            self._check_alive(m)

    def stop(self) -> None:
        """End every Ray process of every machine by PID, remove the namespaces, the bridge and
        the Ray session files (safe to call more than once)."""
        for m in self.machines:
            if m.ray is not None:  # each by PID and start time: a PID reused since is not ours
                m.pids = [(pid, stat.start_ticks) for pid in [m.ray.pid, *descendants(m.ray.pid)]
                          if (stat := read_stat(pid)) is not None]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            alive = [p for m in self.machines for p in m.pids if _alive(*p)]
            for pid, start in alive:
                if not _alive(pid, start):
                    continue
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            try:
                wait_for(lambda: not any(_alive(*p) for p in alive), 15.0,
                         "the Ray processes to end", interval_s=0.1)
                break
            except TestbedError:
                continue
        for m in self.machines:
            if m.ray is not None:
                try:
                    m.ray.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
                for pipe in (m.ray.stdout, m.ray.stderr):
                    if pipe is not None:
                        pipe.close()
                m.ray = None
            self.clean_parts(m)
            _ip("netns", "del", m.netns, check=False)
        _ip("link", "del", self.bridge, check=False)
        shutil.rmtree(self.temp, ignore_errors=True)
        if self.sysctl_old is not None:
            procfs.write_sysctl(SEND_BUFFER_SYSCTL, self.sysctl_old)
            self.sysctl_old = None

    def clean_parts(self, m: NsMachine) -> None:
        """Remove what a fabric part left in machine ``m`` when its actor was killed (its
        hosts' shells, vswitchds, interfaces: by its run records, inside its namespace)."""
        if not (Path("/run/netns") / m.netns).exists():
            return
        code = ("from testbed.runs import cleanup; "
                "from testbed.cluster.agent import machine_state_dir; "
                "from testbed.runs.registry import Registry; "
                f"r = cleanup.clean(Registry(machine_state_dir({m.name!r})), orphans=False); "
                "print('; '.join(r.errors))")
        proc = subprocess.run(["ip", "netns", "exec", m.netns, sys.executable, "-c", code],
                              capture_output=True, text=True, timeout=120, check=False)
        if proc.returncode != 0 or proc.stdout.strip():
            self.errors.append(f"{m.name}: cleaning its fabric part: "
                               f"{(proc.stdout + proc.stderr).strip()[-500:]}")

    # -- inside the machines -----------------------------------------------------------------
    def run(self, machine: str, argv: list[str], timeout_s: float = 120.0,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """Run a command in a machine's namespace (a Ray driver: as on the head, say)."""
        m = next(x for x in self.machines if x.name == machine)
        return subprocess.run(["ip", "netns", "exec", m.netns, *argv], capture_output=True,
                              text=True, timeout=timeout_s, check=False,
                              env={**os.environ, **self.auth, **(env or {})})

    def nodes_alive(self) -> int:
        """How many Ray nodes the cluster knows alive (a driver on the head asks its GCS)."""
        python = str(Path(self.ray).parent / "python")
        proc = self.run(self.machines[0].name, [python, "-c", (
            "import ray; ray.init(address=%r, logging_level='ERROR', log_to_driver=False); "
            "print(sum(1 for n in ray.nodes() if n['Alive']))") % self.address], timeout_s=60)
        try:
            return int(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else 0
        except (ValueError, IndexError):
            return 0

    def _ray_node(self, m: NsMachine, role: list[str]) -> subprocess.Popen:
        argv = ["ip", "netns", "exec", m.netns, self.ray, "start", "--block", *role,
                "--node-ip-address", m.ip, "--num-cpus", "1",
                "--object-store-memory", str(OBJECT_STORE_BYTES),
                "--resources", json.dumps({m.name: 1}), "--disable-usage-stats"]
        if role[0] == "--head":
            argv += ["--include-dashboard", "false", "--temp-dir", str(self.temp)]
        if m.hidden:  # a mount namespace of its own (private: nothing reaches this host's)
            argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", HIDE_AND_EXEC,
                    "hide", *map(str, m.hidden), "--", *argv]
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True,
                                env={**os.environ, **self.auth})

    @staticmethod
    def _died(m: NsMachine) -> bool:
        return m.ray is not None and m.ray.poll() is not None

    def _check_alive(self, m: NsMachine) -> None:
        if self._died(m):
            err = m.ray.stderr.read() if m.ray.stderr else ""
            raise TestbedError(f"the Ray node of {m.name} ({m.ip}) ended "
                               f"(exit {m.ray.returncode})", "ray start", err[-2000:])


def _ip(*args: str, netns: str | None = None, check: bool = True) -> None:
    argv = ["ip", *(["-n", netns] if netns else []), *args]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    if check and proc.returncode != 0:
        raise TestbedError(f"{' '.join(argv)} failed", "", proc.stderr)


def _listening(ip: str, port: int) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=0.5):
            return True
    except OSError:
        return False


def _alive(pid: int, start_ticks: int) -> bool:
    """Whether the process that had ``pid`` and started at ``start_ticks`` still runs."""
    stat = read_stat(pid)
    return stat is not None and not stat.gone and stat.start_ticks == start_ticks
