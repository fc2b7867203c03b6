"""A program's rank, started at a given moment: ``python -m traffic.agents.startat UNIX_TIME
CWD -- ARGV...`` waits until the wall clock reads ``UNIX_TIME``, enters ``CWD`` (``-``: stays)
and runs ``ARGV`` in its process group, ending as it ends (its exit code, or the signal that
killed it). Every rank of a program is spawned with the same moment, so they start within
the clock's resolution of each other however long spawning them took
(:mod:`traffic.agents.programs`).

It stays as the rank's supervisor: if the process that spawned it dies, even by SIGKILL
(``PR_SET_PDEATHSIG``), it ends the rank's whole process group (SIGTERM, then SIGKILL after
``GRACE_S``), children the program started included, so a launcher killed outright leaves no
rank behind. A SIGTERM or SIGINT it receives goes to the group the same way.

A program that cannot be run (not found, not executable) ends with 127 or 126, as a shell's
would, its reason on stderr.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

EXIT_NOT_FOUND, EXIT_NOT_EXECUTABLE = 127, 126
PR_SET_PDEATHSIG = 1
#: how long the group has between SIGTERM and SIGKILL
GRACE_S = 5.0


class _Ending(Exception):
    """Raised by the signal handler: it interrupts a blocking wait (PEP 475 would retry it)."""


def _prctl_pdeathsig(sig: int) -> None:
    """``sig`` to this process when its parent dies (best effort: without prctl, none)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _run(argv: list[str]) -> None:
    """In the child: become the program (or say why not and exit as a shell would)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        os.execvp(argv[0], argv)
    except FileNotFoundError:
        print(f"fabriclab: {argv[0]}: program not found", file=sys.stderr, flush=True)
        os._exit(EXIT_NOT_FOUND)
    except OSError as err:
        print(f"fabriclab: {argv[0]}: cannot run it: {err.strerror}", file=sys.stderr,
              flush=True)
        os._exit(EXIT_NOT_EXECUTABLE)


def main(args: list[str]) -> int:
    if len(args) < 4 or args[2] != "--":
        print("usage: python -m traffic.agents.startat UNIX_TIME CWD -- ARGV...",
              file=sys.stderr)
        return 2
    at, cwd, argv = float(args[0]), args[1], args[3:]
    ending = {"at": None}

    def end_group(_sig, _frame) -> None:  # the parent died, or the rank is to end
        if ending["at"] is None:
            ending["at"] = time.monotonic()
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            os.killpg(os.getpgrp(), signal.SIGTERM)
            raise _Ending

    signal.signal(signal.SIGTERM, end_group)
    signal.signal(signal.SIGINT, end_group)
    try:
        _prctl_pdeathsig(signal.SIGTERM)
        if os.getppid() == 1:  # the parent died before the line above
            return 128 + signal.SIGTERM
        if cwd != "-":
            try:
                os.chdir(cwd)
            except OSError as err:
                print(f"fabriclab: cannot enter {cwd}: {err.strerror}", file=sys.stderr)
                return EXIT_NOT_FOUND
        while (left := at - time.time()) > 0:
            time.sleep(min(left, 0.5))
        sys.stdout.flush()
    except _Ending:
        return 128 + signal.SIGTERM
    child = os.fork()
    if child == 0:
        _run(argv)
    while True:
        try:
            pid, status = os.waitpid(child, os.WNOHANG if ending["at"] else 0)
            if pid:
                break
            if time.monotonic() - ending["at"] > GRACE_S:
                os.killpg(os.getpgrp(), signal.SIGKILL)  # this process too: the rank is over
            time.sleep(0.05)
        except _Ending:
            continue
        except ChildProcessError:
            return 128 + signal.SIGTERM
    if os.WIFSIGNALED(status):  # end as the program did: by its signal
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        return 128 + sig
    return os.WEXITSTATUS(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
