"""The ``vm`` backend: run a fabriclab job inside a full-kernel guest under QEMU.

The guest boots Debian 12's own kernel, which has what a module-less host kernel lacks (the Open
vSwitch kernel datapath, netem, RED, DCTCP). Its image is built from Debian packages by
``scripts/build-vm-image.sh`` and cached under ``/var/cache/fabriclab/vm/<key>``, the key being
a hash of everything that goes into it. A run carries the checkout and the job in on a raw tar
disk and the results out on another; the root disk is opened with ``-snapshot``, so every run
starts from the same image and nothing is written back. The QEMU process is a tracked process of
a run record: ``fabriclab clean`` ends it like any other.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from testbed.errors import TestbedError
from testbed.linux import packages
from testbed.linux.files import build_once
from testbed.runs.registry import Registry, stop_process

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "scripts" / "build-vm-image.sh"
INIT_SCRIPT = ROOT / "scripts" / "vm-init.sh"
DEFAULT_CACHE_DIR = Path("/var/cache/fabriclab/vm")
OUT_DISK_MB = 64
SKIP_DIRS = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", ".test-deps",
             ".hypothesis"}
#: the checkout's own output folders (top level only: testbed/runs/ is code)
SKIP_TOP = {"runs", ".vagrant"}


def image_key(root: Path = ROOT) -> str:
    """Hash of the inputs of the image: the build script, the init program, the dependencies."""
    digest = hashlib.sha256()
    for path in (root / "scripts" / "build-vm-image.sh", root / "scripts" / "debian-tree.sh",
                 root / "scripts" / "vm-init.sh", root / "pyproject.toml"):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


@dataclass(frozen=True)
class VmImage:
    """A built guest image: kernel, initrd and root file system."""

    directory: Path

    @property
    def kernel(self) -> Path:
        return self.directory / "vmlinuz"

    @property
    def initrd(self) -> Path:
        return self.directory / "initrd.img"

    @property
    def rootfs(self) -> Path:
        return self.directory / "root.img"

    def exists(self) -> bool:
        return all(p.is_file() for p in (self.kernel, self.initrd, self.rootfs))


def ensure_image(cache_dir: Path = DEFAULT_CACHE_DIR,
                 log: Callable[[str], None] = lambda _m: None) -> VmImage:
    """The cached image for this checkout, built first when missing (a few minutes).

    Raises:
        TestbedError: when the build fails (with the end of its log).
    """
    packages.ensure(packages.GUEST_TOOLS, "the full-kernel guest's tools", log)
    image = VmImage(cache_dir / image_key())

    def build() -> None:
        log(f"building the guest image into {image.directory} (Debian packages, once)")
        proc = subprocess.run(["bash", str(BUILD_SCRIPT), str(image.directory)],
                              capture_output=True, text=True, check=False, timeout=1800)
        if proc.returncode != 0 or not image.exists():
            raise TestbedError("building the guest image failed", str(BUILD_SCRIPT),
                               (proc.stdout + proc.stderr)[-3000:])

    build_once(image.exists, build, cache_dir)
    return image


def job_archive(project: Path, job_sh: str, files: dict[str, Path]) -> bytes:
    """The job disk: ``project/`` (the checkout, without venvs and caches), ``job.sh`` and
    ``files`` (archive name -> local path), as one tar padded to whole sectors."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for dirpath, dirnames, filenames in os.walk(project):
            top = Path(dirpath) == project
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS
                                 and not (top and d in SKIP_TOP)
                                 and not d.endswith(".egg-info"))
            for name in sorted(filenames):
                path = Path(dirpath) / name
                tar.add(path, arcname=f"project/{path.relative_to(project)}", recursive=False)
        for arcname, path in files.items():
            tar.add(path, arcname=arcname, recursive=False)
        info = tarfile.TarInfo("job.sh")
        data = job_sh.encode()
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    return raw + b"\0" * (-len(raw) % 512)


def qemu_command(image: VmImage, job_disk: Path, out_disk: Path, console: Path,
                 memory_mb: int, cpus: int, accel: str) -> list[str]:
    """The QEMU command line of one run: no network card, serial console to a file."""
    drive = "format=raw,if=virtio,cache=unsafe"
    return ["qemu-system-x86_64", "-accel", "tcg,thread=multi" if accel == "tcg" else accel,
            "-cpu", "max", "-smp", str(cpus), "-m", str(memory_mb),
            "-kernel", str(image.kernel), "-initrd", str(image.initrd),
            "-append", ("root=/dev/vda rw console=ttyS0 quiet panic=-1 "
                        "init=/sbin/fabriclab-init net.ifnames=0"),
            "-drive", f"file={image.rootfs},{drive},snapshot=on",
            "-drive", f"file={job_disk},{drive},readonly=on",
            "-drive", f"file={out_disk},{drive}",
            "-nic", "none", "-display", "none", "-monitor", "none",
            "-serial", f"file:{console}", "-no-reboot"]


@dataclass
class VmResult:
    """What a guest run left: its exit code, its output and the results directory."""

    returncode: int
    output: str
    out_dir: Path
    console: Path
    duration_s: float


def run(image: VmImage, job_sh: str, files: dict[str, Path], work_dir: Path,
        registry: Registry, timeout_s: float = 1800, memory_mb: int = 3072, cpus: int = 2,
        accel: str = "tcg", on_console: Callable[[str], None] | None = None) -> VmResult:
    """Boot the guest on one job and wait for it to power off.

    Args:
        image: the guest image.
        job_sh: the bash script the guest runs in ``project/``.
        files: extra files for the job disk (archive name -> local path).
        work_dir: where the disks (removed at the end), the console log and ``out/`` go
            (created).
        registry: run records; the QEMU process is tracked there until it is gone.
        timeout_s: hard limit; the guest is stopped after it.
        memory_mb: guest memory.
        cpus: guest CPUs.
        accel: ``tcg`` (emulation; works everywhere) or ``kvm``.
        on_console: called with each new console line while the guest runs.

    Returns:
        The result; ``out_dir`` holds what the job left in ``$FABRICLAB_OUT``.
    """
    work_dir.mkdir(parents=True, exist_ok=True)
    job_disk, out_disk = work_dir / "job.tar", work_dir / "out.img"
    try:  # the disks (64 MiB, in the state directory's tmpfs) go; the console and out/ stay
        return _boot(image, job_sh, files, (job_disk, out_disk), work_dir, registry,
                     timeout_s, memory_mb, cpus, accel, on_console)
    finally:
        job_disk.unlink(missing_ok=True)
        out_disk.unlink(missing_ok=True)


def _boot(image: VmImage, job_sh: str, files: dict[str, Path], disks: tuple[Path, Path],
          work_dir: Path, registry: Registry, timeout_s: float, memory_mb: int, cpus: int,
          accel: str, on_console: Callable[[str], None] | None) -> VmResult:
    """:func:`run`'s boot and wait on its job and results ``disks``."""
    job_disk, out_disk = disks
    console, out_dir = work_dir / "console.log", work_dir / "out"
    job_disk.write_bytes(job_archive(ROOT, job_sh, files))
    with open(out_disk, "wb") as fh:
        fh.truncate(OUT_DISK_MB << 20)
    console.write_text("")
    record = registry.new_run(work_dir)
    start = time.monotonic()
    cmd = qemu_command(image, job_disk, out_disk, console, memory_mb, cpus, accel)
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True)
    except FileNotFoundError as err:
        registry.remove(record)
        raise TestbedError("qemu-system-x86_64 not found: apt-get install qemu-system-x86 "
                           "(scripts/setup.sh does)") from err
    registry.track_process(record, proc.pid, "vm:qemu")
    try:
        _wait(proc, console, start + timeout_s, on_console)
    finally:
        for tracked in record.processes:
            if tracked.alive():
                stop_process(tracked)
        proc.wait()
        registry.remove(record)
    if proc.returncode != 0:
        raise TestbedError(f"qemu exited with {proc.returncode}", " ".join(cmd[:12]) + " ...",
                           proc.stderr.read().decode(errors="replace")[-2000:])
    proc.stderr.close()
    return _collect(out_disk, out_dir, console, time.monotonic() - start)


def _wait(proc: subprocess.Popen, console: Path, deadline: float,
          on_console: Callable[[str], None] | None) -> None:
    offset, pending = 0, ""
    while proc.poll() is None:
        if time.monotonic() > deadline:
            raise TestbedError(f"the guest did not finish in time; console: {console}")
        if on_console is not None:
            with open(console, "rb") as fh:
                fh.seek(offset)
                chunk = fh.read()
            offset += len(chunk)
            pending += chunk.decode(errors="replace").replace("\r", "")
            *lines, pending = pending.split("\n")
            for line in lines:
                on_console(line)
        time.sleep(0.2)


def _safe_members(tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
    """What may be extracted from a tar the guest wrote: regular files and directories whose
    path stays inside the target (no absolute path, no ``..``; links, devices and FIFOs are
    dropped), owned by us, without setuid/setgid bits."""
    out = []
    for member in tar.getmembers():
        path = Path(member.name)
        if not (member.isfile() or member.isdir()) or path.is_absolute() or ".." in path.parts:
            continue
        member.mode &= 0o755
        member.uid, member.gid, member.uname, member.gname = os.getuid(), os.getgid(), "", ""
        out.append(member)
    return out


def _collect(out_disk: Path, out_dir: Path, console: Path, duration_s: float) -> VmResult:
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(out_disk, mode="r:") as tar:
            tar.extractall(out_dir, members=_safe_members(tar))
    except tarfile.TarError as err:
        tail = console.read_text(errors="replace")[-3000:]
        raise TestbedError(f"the guest wrote no results ({err}); end of its console:", "",
                           tail) from err
    rc_file = out_dir / "rc"
    try:
        returncode = int(rc_file.read_text().strip())
    except (OSError, ValueError):  # no exit code, or not a number: the job did not end well
        returncode = 3
    output_file = out_dir / "output.txt"
    output = output_file.read_text(errors="replace") if output_file.is_file() else ""
    return VmResult(returncode, output, out_dir, console, duration_s)
