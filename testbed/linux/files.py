"""Small file helpers shared by every layer: atomic, durable writes that follow no symbolic
link another user planted (a reader never sees half a file, a full disk leaves the old one),
and a cached artefact built once (the guest image, the lab's box)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from testbed.errors import TestbedError


def build_once(ready: Callable[[], bool], build: Callable[[], None], cache_dir: Path) -> None:
    """Run ``build`` unless ``ready()``: one builder at a time (a lock file in ``cache_dir``),
    and a process that waited for another's build finds it done and builds nothing."""
    if ready():
        return
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / ".lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not ready():
            build()


class WriteError(TestbedError):
    """A file could not be written (the disk full, a symbolic link not followed, ...): names
    the file and the cause; nothing half-written is left in its place."""

    def __init__(self, path: str | Path, cause: str, errno_: int | None = None) -> None:
        self.path, self.errno = str(path), errno_
        super().__init__(f"writing {path}: {cause}")


#: symbolic links followed on the way to one file, at most (the kernel's own limit)
MAX_LINKS = 40
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _trusted_link(st: os.stat_result) -> bool:
    """A symbolic link is followed only when this process's user or root made it: a link
    another user planted (in a checkout they own) cannot send root's writes elsewhere."""
    return st.st_uid in (0, os.geteuid())


def open_dir(path: str | Path, create: bool = False) -> int:
    """A file descriptor of directory ``path``, reached component by component from ``/``,
    following only symbolic links of this user's or root's (``create``: missing directories
    made, 0755 less the umask). Later writes relative to it cannot be redirected by a
    component swapped in between.

    Raises:
        WriteError: a component is missing (without ``create``), not a directory, or a link
            of another user's.
    """
    parts = list(Path(os.path.abspath(path)).parts[1:])
    fd, links = os.open("/", _DIR_FLAGS), 0
    try:
        while parts:
            part = parts.pop(0)
            if part in ("", "."):
                continue
            try:
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:  # made in between: look again
                    pass
                parts.insert(0, part)
                continue
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if not _trusted_link(st) or links > MAX_LINKS:
                    raise WriteError(path, f"{part} is a symbolic link of uid {st.st_uid} "
                                           "(only this user's and root's are followed)")
                target = os.readlink(part, dir_fd=fd)
                if target.startswith("/"):
                    os.close(fd)
                    fd = os.open("/", _DIR_FLAGS)
                parts[0:0] = [p for p in target.split("/") if p]
                continue
            new = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = new
        return fd
    except OSError as err:
        os.close(fd)
        if isinstance(err, WriteError):
            raise
        raise WriteError(path, err.strerror or str(err), err.errno) from err
    except BaseException:
        os.close(fd)
        raise


@contextlib.contextmanager
def unix_address(path: str | Path) -> Iterator[str]:
    """An AF_UNIX address for ``path`` however long it is (an address holds 107 bytes; a run
    directory's can be deeper): through its folder's descriptor in ``/proc/self/fd``, open
    while the caller binds or connects, as Open vSwitch binds its own sockets."""
    path = Path(path)
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{folder}/{path.name}"
    finally:
        os.close(folder)


def make_dirs(path: str | Path) -> Path:
    """``mkdir -p path`` through :func:`open_dir` (no link of another user's followed)."""
    os.close(open_dir(path, create=True))
    return Path(path)


def write_bytes_atomic(path: str | Path, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file or the whole new one, and
    a crash right after leaves the new one: a temporary file of an unguessable name made
    exclusively in the same directory (no link followed), synced, renamed over ``path``, and
    the directory synced.

    Raises:
        WriteError: naming ``path`` and the cause (``ENOSPC``: the disk is full); the
            temporary file is gone and ``path`` is as it was.
    """
    path = Path(path)
    dir_fd = open_dir(path.parent)
    tmp = f".{path.name[:200]}.{secrets.token_hex(6)}.tmp"
    made = False
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     mode, dir_fd=dir_fd)
        made = True
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.rename(tmp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        made = False
        os.fsync(dir_fd)
    except OSError as err:
        cause = err.strerror or str(err)
        if err.errno == errno.ENOSPC:
            cause += " (the disk is full; what was written before is intact)"
        raise WriteError(path, cause, err.errno) from err
    finally:
        if made:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
        os.close(dir_fd)


def write_text_atomic(path: str | Path, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` atomically and durably (:func:`write_bytes_atomic`).

    Args:
        path: the file to (re)place.
        text: its new content.
        mode: its permissions (less the umask).
    """
    write_bytes_atomic(path, text.encode("utf-8"), mode)


def copy_file(src: str | Path, dst: str | Path) -> None:
    """Copy ``src`` to ``dst`` (:func:`write_bytes_atomic`: no link at ``dst`` followed)."""
    try:
        data = Path(src).read_bytes()
    except OSError as err:
        raise WriteError(dst, f"reading {src}: {err.strerror or err}", err.errno) from err
    write_bytes_atomic(dst, data)


def copy_tree(src: str | Path, dst: str | Path) -> int:
    """Copy the regular files under ``src`` into ``dst`` (folders made as needed), each with
    :func:`copy_file`: links under ``src`` are not copied, none under ``dst`` followed.
    Returns how many files were copied."""
    src, count = Path(src), 0
    for folder, dirs, files in os.walk(src):
        rel = Path(folder).relative_to(src)
        make_dirs(Path(dst) / rel)
        for name in sorted(files):
            if (Path(folder) / name).is_file() and not (Path(folder) / name).is_symlink():
                copy_file(Path(folder) / name, Path(dst) / rel / name)
                count += 1
    return count


def open_append(path: str | Path) -> BinaryIO:
    """``path`` opened to append (made 0644 less the umask if missing), never through a
    symbolic link (a log file a child process writes)."""
    path = Path(path)
    dir_fd = open_dir(path.parent)
    try:
        fd = os.open(path.name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    except OSError as err:
        raise WriteError(path, err.strerror or str(err), err.errno) from err
    finally:
        os.close(dir_fd)
    return os.fdopen(fd, "ab")


def write_json_atomic(path: str | Path, doc: object, indent: int | None = 1) -> None:
    """Write ``doc`` as JSON to ``path`` atomically (see :func:`write_text_atomic`)."""
    write_text_atomic(path, json.dumps(doc, indent=indent))
