"""eBPF adapter: build the project's BPF programs (from source, with Debian's clang and
libbpf-dev), load and pin them with ``bpftool``, and read or write their maps through libbpf
(Debian's ``libbpf1``, by ctypes), which knows the ``bpf()`` system call's number and argument
layout on every architecture. Attaching to an interface is netlink's job
(:meth:`testbed.linux.netlink.Netlink.attach_bpf_egress`).

Objects are built once per source version into ``state_dir/bpf/<hash>/``; nothing built is
checked in. A run pins its programs and maps under ``/sys/fs/bpf/fabriclab/<run id>/`` (recorded
in the run record, removed at teardown).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import hashlib
import mmap
import os
import platform
import shutil
import struct
import subprocess
from pathlib import Path

from testbed.errors import TestbedError
from testbed.linux import packages
from testbed.plan.platforms import multiarch

SOURCE_DIR = Path(__file__).resolve().parent / "progs"
BPFFS = Path("/sys/fs/bpf")
PIN_ROOT = BPFFS / "fabriclab"
LIBBPF = "libbpf.so.1"


def include_dir(machine: str | None = None) -> str:
    """The architecture's own kernel headers (``asm/types.h``) that the programs' includes
    reach, on Debian under its multiarch triplet."""
    try:
        return f"/usr/include/{multiarch(machine or platform.machine())}"
    except ValueError as err:
        raise TestbedError(f"building the eBPF programs: {err}") from None


@functools.cache
def _libbpf() -> ctypes.CDLL:
    """libbpf's map and object calls (each returns 0 or a file descriptor, or ``-errno``).
    Debian's ``libbpf1``, which ``iproute2`` depends on: every machine scripts/setup.sh sets
    up, and the full-kernel guest's image, has it."""
    try:
        lib = ctypes.CDLL(LIBBPF, use_errno=True)
    except OSError as err:
        raise TestbedError(f"cannot load {LIBBPF} ({err}): apt-get install libbpf1") from None
    ptr, fd = ctypes.c_void_p, ctypes.c_int
    for name, args in (("bpf_obj_get", [ctypes.c_char_p]),
                       ("bpf_map_lookup_elem", [fd, ptr, ptr]),
                       ("bpf_map_update_elem", [fd, ptr, ptr, ctypes.c_uint64]),
                       ("bpf_map_delete_elem", [fd, ptr]),
                       ("bpf_map_get_next_key", [fd, ptr, ptr])):
        getattr(lib, name).argtypes = args
        getattr(lib, name).restype = ctypes.c_int
    return lib


def _need(tool: str, package: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise TestbedError(f"{tool} not found: apt-get install {package}")
    return path


def build(name: str, state_dir: Path) -> Path:
    """The object of ``testbed/linux/progs/<name>.c``, compiled when its source changed.

    The eBPF toolchain is installed the first time a program is built (as root).

    Raises:
        TestbedError: the toolchain missing and not installable, or the compiler failing.
    """
    source = SOURCE_DIR / f"{name}.c"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    out = state_dir / "bpf" / digest / f"{name}.o"
    if out.exists():
        return out
    packages.ensure(packages.EBPF_TOOLCHAIN, "the eBPF toolchain")
    clang = _need("clang", "clang")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    cmd = [clang, "-O2", "-g", "-target", "bpf", f"-I{include_dir()}", "-c", str(source),
           "-o", str(tmp)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
    if proc.returncode != 0:
        raise TestbedError(f"building {source.name} failed", " ".join(cmd), proc.stderr)
    os.replace(tmp, out)
    return out


def ensure_bpffs() -> None:
    """Mount the BPF file system on /sys/fs/bpf when it is not (pins live there)."""
    if os.path.ismount(BPFFS):
        return
    BPFFS.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "bpf", "bpf", str(BPFFS)], capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        raise TestbedError("cannot mount the BPF file system", "mount -t bpf bpf /sys/fs/bpf",
                           proc.stderr)


def load(obj: Path, pin_dir: Path) -> Path:
    """Load an object's programs and maps, pinned in ``pin_dir`` (each program under
    ``progs/<its function name>``, one file per map).

    Returns:
        The directory of the pinned programs.
    """
    bpftool = _need("bpftool", "bpftool")
    ensure_bpffs()
    pin_dir.mkdir(parents=True, exist_ok=True)
    cmd = [bpftool, "prog", "loadall", str(obj), str(pin_dir / "progs"), "type", "classifier",
           "pinmaps", str(pin_dir)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=60)
    if proc.returncode != 0:
        raise TestbedError(f"loading {obj.name} failed (the verifier's log follows)",
                           " ".join(cmd), proc.stderr[-3000:])
    return pin_dir / "progs"


def unpin(pin_dir: str | Path) -> None:
    """Remove a run's pins (programs stay attached until their interfaces go)."""
    shutil.rmtree(pin_dir, ignore_errors=True)


def _checked(ret: int) -> int:
    """A libbpf call's result; its negative errno raised as OSError."""
    if ret < 0:
        raise OSError(-ret, os.strerror(-ret))
    return ret


def obj_get(path: str | Path) -> int:
    """A new file descriptor for a pinned program or map (close it with ``os.close``)."""
    try:
        return _checked(_libbpf().bpf_obj_get(os.fsencode(str(path))))
    except OSError as err:
        raise TestbedError(f"cannot open pinned BPF object {path}: {err.strerror}") from None


class Map:
    """A pinned BPF map, read and written with ctypes structures as keys and values."""

    def __init__(self, path: str | Path, key_type: type, value_type: type) -> None:
        self.path = Path(path)
        self.key_type, self.value_type = key_type, value_type
        self.fd = obj_get(path)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Map:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _op(self, ret: int, what: str) -> bool:
        """A map call's result: False when the key is not there (ENOENT), TestbedError for
        any other error."""
        try:
            _checked(ret)
        except OSError as err:
            if err.errno == errno.ENOENT:
                return False
            raise TestbedError(f"BPF map {self.path.name}: {what} failed: {err.strerror}") \
                from None
        return True

    def update(self, key, value) -> None:
        ret = _libbpf().bpf_map_update_elem(self.fd, ctypes.byref(key), ctypes.byref(value), 0)
        if not self._op(ret, "update"):
            raise TestbedError(f"BPF map {self.path.name}: update failed: no such entry")

    def delete(self, key) -> bool:
        """Remove ``key``; False when it was not there."""
        return self._op(_libbpf().bpf_map_delete_elem(self.fd, ctypes.byref(key)), "delete")

    def lookup(self, key):
        value = self.value_type()
        ret = _libbpf().bpf_map_lookup_elem(self.fd, ctypes.byref(key), ctypes.byref(value))
        return value if self._op(ret, "lookup") else None

    def items(self) -> list[tuple]:
        """Every (key, value), read now."""
        out, key = [], None
        lib = _libbpf()
        while self._op(lib.bpf_map_get_next_key(
                self.fd, None if key is None else ctypes.byref(key),
                ctypes.byref(nxt := self.key_type())), "iteration"):
            value = self.lookup(nxt)
            if value is not None:
                out.append((nxt, value))
            key = nxt
        return out


class RingBuffer:
    """A pinned ``BPF_MAP_TYPE_RINGBUF`` of ``size`` bytes, read from user space as libbpf does:
    the consumer position on a writable page, the producer position and the data (mapped twice
    in a row, so a record never wraps) read-only after it. Its :meth:`fileno` is readable when
    records wait (for a selector)."""

    BUSY, DISCARD = 1 << 31, 1 << 30
    HEADER = 8  # the kernel's record header: length (with the two flags) and a page offset

    def __init__(self, path: str | Path, size: int) -> None:
        self.path, self.size = Path(path), size
        self.fd = obj_get(path)
        page = mmap.PAGESIZE
        try:
            self.consumer = mmap.mmap(self.fd, page, mmap.MAP_SHARED,
                                      mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
            self.producer = mmap.mmap(self.fd, page + 2 * size, mmap.MAP_SHARED,
                                      mmap.PROT_READ, offset=page)
        except OSError as err:
            os.close(self.fd)
            raise TestbedError(f"cannot map the ring buffer {path}: {err.strerror}") from None
        self.data_at = page

    def fileno(self) -> int:
        return self.fd

    def read(self) -> list[bytes]:
        """Every record committed since the last read, in order (discarded ones skipped)."""
        out = []
        (cons,) = struct.unpack_from("<Q", self.consumer, 0)
        (prod,) = struct.unpack_from("<Q", self.producer, 0)
        while cons < prod:
            at = self.data_at + (cons & (self.size - 1))
            (head,) = struct.unpack_from("<I", self.producer, at)
            if head & self.BUSY:
                break
            length = head & ~(self.BUSY | self.DISCARD)
            if not head & self.DISCARD:
                out.append(self.producer[at + self.HEADER:at + self.HEADER + length])
            cons += (length + self.HEADER + 7) & ~7
            struct.pack_into("<Q", self.consumer, 0, cons)
        return out

    def close(self) -> None:
        if self.fd >= 0:
            self.consumer.close()
            self.producer.close()
            os.close(self.fd)
            self.fd = -1
