"""Run directories on disk: which runs a directory holds (a run, its variants, a sweep's
cells), whether one is complete, refusing to overwrite one by accident, and every run of
several directories side by side (``fabriclab compare``)."""

from __future__ import annotations

import fcntl
import json
import os
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fabriclab.model import document
from fabriclab.model.rundir import experiment_document
from testbed.errors import ConfigError
from testbed.linux.files import WriteError, make_dirs, open_dir

#: the files that make a directory a run directory (one run, variants, a sweep)
PREVIOUS_RUN = ("results.json", "variants.json", "sweep.json")


def require_run(out: Path) -> None:
    """Raises ConfigError (naming ``out``) unless it holds a run."""
    if not any((out / name).is_file() for name in PREVIOUS_RUN):
        raise ConfigError(str(out), "holds no run (results.json, variants.json or sweep.json)")


def check_out_dir(out: Path, resume: bool, force: bool) -> None:
    """An output directory holding an earlier run is refused unless the run resumes it or
    is forced to overwrite it."""
    if resume and force:
        raise ConfigError("--resume", "give --resume or --force, not both")
    earlier = [name for name in PREVIOUS_RUN if (out / name).exists()]
    if earlier and not (resume or force):
        raise ConfigError("--out", f"{out} already holds a run ({', '.join(earlier)}); "
                                   "--resume finishes it, --force overwrites it")


@contextmanager
def writing_to(out: Path, resume: bool, force: bool) -> Iterator[Path | None]:
    """``out`` to this run alone while it runs (a lock on the directory itself: a second run
    into it, a ``--resume`` too, is refused rather than running the same cells), checked
    under that lock (:func:`check_out_dir`); with ``force``, an earlier run's files moved
    aside first, so that nothing of it is taken for this run's. Yields where they went (None:
    nothing was there).

    Raises:
        ConfigError: (``--out``) another run writes there, or it holds a run and neither
            ``resume`` nor ``force`` was given.
    """
    make_dirs(out)
    fd = open_dir(out)
    try:
        _refuse_shared(out, os.fstat(fd))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError("--out", f"{out} is being written by another fabriclab run "
                                       "right now: wait for it, or give another --out") from None
        check_out_dir(out, resume, force)
        yield _set_aside(out, fd) if force else None
    finally:
        os.close(fd)


def _refuse_shared(out: Path, st: os.stat_result) -> None:
    """Root writes no results into a folder others may change under it: one writable by its
    group or by everyone (unless sticky, as /tmp is, where no one may replace another's
    file)."""
    if os.geteuid() != 0:
        return
    shared = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX
    if shared:
        raise ConfigError("--out", f"{out} is writable by others (mode "
                                   f"{stat.S_IMODE(st.st_mode):04o}): a run as root writes its "
                                   "results only where no other user can change them; "
                                   "'chmod go-w' it or give another --out")


def _set_aside(out: Path, fd: int) -> Path | None:
    """Every entry of ``out`` (open as ``fd``) moved into a sibling ``NAME.replaced-DATE``."""
    entries = sorted(os.listdir(fd))
    if not entries:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        aside = out.with_name(f"{out.name}.replaced-{stamp}" + (f"-{n}" if n else ""))
        if not os.path.lexists(aside):
            break
    aside_fd = open_dir(aside, create=True)
    try:
        for name in entries:
            os.rename(name, name, src_dir_fd=fd, dst_dir_fd=aside_fd)
    except OSError as err:
        raise WriteError(out, f"moving the earlier run aside to {aside}: "
                              f"{err.strerror or err}", err.errno) from err
    finally:
        os.close(aside_fd)
    return aside


def is_complete(path: Path, raw: dict | None = None) -> bool:
    """Whether ``path`` is a results document of a complete run; with ``raw`` (the data of
    the experiment to resume), a complete run of another experiment is an error, by the
    SHA-256 the run recorded (a run that recorded none is taken as it is).

    Raises:
        ConfigError: (``--resume``) the run there is of a different experiment.
    """
    doc = read_document(path)
    if doc is None:
        return False
    complete = doc.complete
    recorded = doc.experiment_sha256  # (runs before it was recorded: not compared)
    if complete and raw is not None and recorded is not None:
        want = experiment_document(raw)["sha256"]
        if recorded != want:
            raise ConfigError("--resume", f"{path.parent} holds a complete run of a different "
                                          f"experiment (experiment_sha256 "
                                          f"{recorded[:12]}, this one "
                                          f"{want[:12]}): resume with the file it ran, or use "
                                          "--force or another --out")
    return complete


def read_document(path: Path) -> document.RunDocument | None:
    """The results document at ``path``, None when there is none (or it is unreadable, or
    not a results document)."""
    try:
        return document.read(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def load_document(path: Path) -> document.RunDocument:
    """The results document at ``path``.

    Raises:
        ConfigError: none there, unreadable, or not a results document (the field named).
    """
    try:
        return document.read(json.loads(path.read_text()))
    except OSError as e:
        raise ConfigError(str(path), f"cannot be read: {e.strerror}") from None
    except document.DocumentError as e:
        raise ConfigError(f"{path}: {e.field}", e.message) from None
    except ValueError as e:
        raise ConfigError(str(path), f"is not JSON: {e}") from None
