"""The lab VM adapter: Vagrant with vagrant-libvirt where there is no hardware virtualization
and no libvirt network (this machine, CI). It installs Debian's packages, starts libvirt's
daemons by hand and stops them by PID, builds the local box once per set of inputs (cached like
the ``vm`` backend's image), adds it, and brings the VM up, into use and down again with every
forward on 127.0.0.1. What the VM is and how it is provisioned is the Vagrantfile's business.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from testbed.errors import TestbedError
from testbed.linux.files import build_once
from testbed.poll import wait_for
from testbed.runs.registry import proc_start_time

ROOT = Path(__file__).resolve().parents[2]
APT_PACKAGES = ("vagrant", "vagrant-libvirt", "libvirt-daemon-system", "qemu-utils")
BOX_NAME = "fabriclab/bookworm-local"
BOX_FILE = "fabriclab-bookworm.box"
DEFAULT_BOX_CACHE = Path("/var/cache/fabriclab/box")
#: VAGRANT_HOME: libvirt's qemu (user libvirt-qemu) reads the box's kernel from here, so not
#: under /root.
DEFAULT_HOME = Path("/var/lib/fabriclab/vagrant")
RUN_DIR = Path("/run/fabriclab-lab")  # the daemons' PID files
LIBVIRT_URI = "qemu:///system"
BOX_VOLUME_PREFIX = BOX_NAME.replace("/", "-VAGRANTSLASH-") + "_vagrant_box_image"


def box_key(root: Path = ROOT) -> str:
    """Hash of the box's inputs: its build script, the shared tree, setup.sh's packages."""
    digest = hashlib.sha256()
    for name in ("build-box.sh", "debian-tree.sh", "setup.sh"):
        digest.update((root / "scripts" / name).read_bytes())
    return digest.hexdigest()[:12]


def _run(cmd: list[str], timeout_s: float, env: dict | None = None,
         check: bool = True) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env,
                              check=False)
    except subprocess.TimeoutExpired as err:
        raise TestbedError(f"timed out after {timeout_s:.0f} s", " ".join(cmd),
                           str(err.stderr or "")[-2000:]) from err
    if check and proc.returncode != 0:
        raise TestbedError(f"exit code {proc.returncode}", " ".join(cmd),
                           (proc.stdout + proc.stderr)[-3000:])
    return proc


def install_packages(log: Callable[[str], None] = lambda _m: None) -> list[str]:
    """Install what the lab needs from Debian (idempotent); the packages it installed."""
    missing = [p for p in APT_PACKAGES
               if "install ok installed" not in _run(
                   ["dpkg-query", "-W", "-f=${Status}", p], 30, check=False).stdout]
    if missing:
        log(f"installing {' '.join(missing)}")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        _run(["apt-get", "update", "-qq"], 600, env)
        _run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], 1800, env)
    return missing


def ensure_box(cache_dir: Path = DEFAULT_BOX_CACHE,
               log: Callable[[str], None] = lambda _m: None) -> Path:
    """The cached box for this checkout's inputs, built first when missing (a few minutes)."""
    box = cache_dir / box_key() / BOX_FILE

    def build() -> None:
        log(f"building the box into {box.parent} (Debian packages, once)")
        _run(["bash", str(ROOT / "scripts" / "build-box.sh"), str(box.parent)], 3600)

    build_once(box.is_file, build, cache_dir)
    return box


def console_tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a guest's console log (terminal escape sequences dropped,
    systemd's status line redrawn after a carriage return as a line of its own), or why there
    are none."""
    try:
        text = path.read_bytes().decode("utf-8", "replace")
    except OSError as err:
        return f"(no console log at {path}: {err.strerror})"
    text = re.sub(r"\x1b(\[[0-9;?]*[A-Za-z]|.)", "", text).replace("\r", "\n")
    kept = [line for line in text.splitlines() if line.strip()][-lines:]
    return "\n".join(kept) if kept else f"(the console log {path} is empty)"


class LibvirtDaemons:
    """libvirtd and virtlogd for the lab (a context manager). Daemons that already answer are
    used as they are and left running; those it starts it stops by PID, after removing the
    storage it saw vagrant-libvirt create (the box's volumes, and the pool when it was new)."""

    def __init__(self, run_dir: Path = RUN_DIR) -> None:
        self.run_dir = run_dir
        self.started: list[tuple[int, int, str]] = []  # pid, start time, name
        self.pools_before: set[str] = set()

    def __enter__(self) -> LibvirtDaemons:
        if not self.answers():
            self.run_dir.mkdir(parents=True, exist_ok=True)
            try:
                for daemon in ("virtlogd", "libvirtd"):
                    pidfile = self.run_dir / f"{daemon}.pid"
                    _run([daemon, "-d", "-p", str(pidfile)], 60)
                    pid = int(wait_for(lambda p=pidfile: p.is_file() and p.read_text().strip(),
                                       30, f"{daemon}'s PID file"))
                    self.started.append((pid, proc_start_time(pid) or 0, daemon))
                wait_for(self.answers, 60, "libvirtd to answer on " + LIBVIRT_URI)
            except BaseException:
                self._stop()
                raise
        self.pools_before = set(self.pools())
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.remove_storage()
        finally:
            self._stop()

    def answers(self) -> bool:
        return _run(["virsh", "-c", LIBVIRT_URI, "version"], 30, check=False).returncode == 0

    def virsh(self, *args: str, check: bool = True) -> str:
        return _run(["virsh", "-c", LIBVIRT_URI, *args], 60, check=check).stdout

    def pools(self) -> list[str]:
        return self.virsh("pool-list", "--all", "--name").split()

    def domains(self) -> list[str]:
        return self.virsh("list", "--all", "--name").split()

    def remove_storage(self) -> None:
        """Delete the box's volumes (vagrant-libvirt uploads the box into a pool) and any pool
        that appeared while the lab ran."""
        if not self.answers():
            return
        for pool in self.pools():
            volumes = self.virsh("vol-list", pool, check=False).splitlines()[2:]
            for line in volumes:
                name = line.split()[0] if line.split() else ""
                if name.startswith(BOX_VOLUME_PREFIX):
                    self.virsh("vol-delete", name, "--pool", pool)
            if pool not in self.pools_before:
                self.virsh("pool-destroy", pool, check=False)
                self.virsh("pool-undefine", pool)

    def _stop(self) -> None:
        for pid, start, name in reversed(self.started):
            if proc_start_time(pid) != start:
                continue
            os.kill(pid, signal.SIGTERM)
            try:
                wait_for(lambda p=pid, s=start: proc_start_time(p) != s, 20, f"{name} to stop")
            except TestbedError:
                if proc_start_time(pid) == start:  # still the same process
                    os.kill(pid, signal.SIGKILL)
        self.started.clear()


class Vagrant:
    """``vagrant`` on the repository's Vagrantfile with the local box and the given forwards.

    Args:
        dotfile: the machine's state folder (``VAGRANT_DOTFILE_PATH``: per lab, not the
            checkout's ``.vagrant``).
        ports: ``{"ssh": N, "grafana": N, "prometheus": N}`` on the host's 127.0.0.1.
        home: ``VAGRANT_HOME`` (where boxes are added).
        settings: more environment (``FABRICLAB_VM_MEMORY``...).
    """

    def __init__(self, dotfile: Path, ports: dict[str, int], home: Path = DEFAULT_HOME,
                 settings: dict[str, str] | None = None) -> None:
        if shutil.which("vagrant") is None:
            raise TestbedError("the lab needs Vagrant: apt-get install " + " ".join(APT_PACKAGES))
        self.home, self.ports = home, ports
        self.console_log = dotfile / "console.log"
        self.env = {**os.environ, "VAGRANT_HOME": str(home), "VAGRANT_DOTFILE_PATH": str(dotfile),
                    "VAGRANT_CWD": str(ROOT), "FABRICLAB_BOX": "local",
                    "VAGRANT_DEFAULT_PROVIDER": "libvirt", "VAGRANT_CHECKPOINT_DISABLE": "1",
                    "FABRICLAB_VM_SSH_PORT": str(ports["ssh"]),
                    "FABRICLAB_VM_GRAFANA_PORT": str(ports["grafana"]),
                    "FABRICLAB_VM_PROMETHEUS_PORT": str(ports["prometheus"]),
                    "FABRICLAB_VM_CONSOLE_LOG": str(self.console_log),
                    **(settings or {})}

    def run(self, *args: str, timeout_s: float = 600, check: bool = True,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return _run(["vagrant", *args], timeout_s, {**self.env, **(env or {})}, check)

    def add_box(self, box: Path) -> bool:
        """Add ``box`` unless this very file is the one added; whether it added it."""
        stamp = self.home / "fabriclab-box.source"
        source = f"{box} {box.stat().st_mtime_ns}"
        listed = BOX_NAME in self.run("box", "list", timeout_s=60).stdout
        if listed and stamp.is_file() and stamp.read_text() == source:
            return False
        self.home.mkdir(parents=True, exist_ok=True)
        self.run("box", "add", "--force", "--name", BOX_NAME, str(box), timeout_s=600)
        stamp.write_text(source)
        return True

    def up(self, *flags: str, timeout_s: float = 3600, env: dict[str, str] | None = None) -> str:
        """``vagrant up`` (``env``: more settings); when it fails, the error carries the guest
        console's last lines (what the guest was doing when SSH did not answer)."""
        started = time.time()
        try:
            return self.run("up", "--provider", "libvirt", *flags, timeout_s=timeout_s,
                            env=env).stdout
        except TestbedError as err:
            try:  # libvirt truncates the log as it starts a guest: an older log is another boot's
                fresh = self.console_log.stat().st_mtime >= started - 1
            except OSError:
                fresh = False
            tail = (console_tail(self.console_log) if fresh else
                    f"(no guest wrote {self.console_log} during this up)")
            raise TestbedError(str(err), None, "the guest's console, last lines:\n" + tail) from err

    def ssh(self, command: str, timeout_s: float = 600,
            check: bool = True) -> subprocess.CompletedProcess:
        return self.run("ssh", "-c", command, timeout_s=timeout_s, check=check)

    def destroy(self) -> None:
        self.run("destroy", "-f", timeout_s=300)

