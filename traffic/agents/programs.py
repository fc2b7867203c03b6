"""A user's program on the fabric's hosts (:class:`traffic.workloads.program.Program`): every
rank spawned in its host, all started at one moment (:mod:`traffic.agents.startat`), each
rank's stdout and stderr into ``ranks/RANK.out`` and ``ranks/RANK.err``, rank 0's stdout also
shown as it comes. The first rank that exits non-zero, or the program's timeout, ends the
others; nothing is left running when this returns or raises (an interrupt included).

The processes come from a ``spawn(host, argv, popen_kwargs)`` and end through ``stop(proc)``:
a fabric's own (``fabriclab run``) or those of a fabric kept up in the background
(``fabriclab launch``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from traffic.workloads.program import Program

#: the ranks start this long after the first is spawned, plus PER_RANK_S for each rank
START_DELAY_S = 1.0
PER_RANK_S = 0.08
#: how much of a failed rank's stderr its error quotes
TAIL_CHARS = 800

Spawn = Callable[[str, list[str], dict], subprocess.Popen]


@dataclass
class RankResult:
    """How one rank went: its exit code (None: still running when it was ended), when it
    ended, and how (``exited``, ``timed out``, ``ended``: by the program's failure or an
    interrupt)."""

    rank: int
    host: str
    exit_code: int | None
    end_unix_s: float | None
    ended: str = "exited"


@dataclass
class ProgramOutcome:
    """The program's ranks, when they started, and why it failed (None: every rank exited 0)."""

    ranks: list[RankResult]
    started_unix_s: float
    error: str | None = None

    @property
    def ended_unix_s(self) -> float:
        return max((r.end_unix_s for r in self.ranks if r.end_unix_s), default=time.time())

    @property
    def time_s(self) -> float:
        """From the common start to the last rank's end."""
        return self.ended_unix_s - self.started_unix_s


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with {code}"


def tail(path: Path, chars: int = TAIL_CHARS) -> str:
    """The end of a rank's output file (its last lines, at most ``chars``)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - chars))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return text.strip()


def run_program(program: Program, addresses: dict[str, str], spawn: Spawn,
                stop: Callable[[subprocess.Popen], object], out_dir: Path,
                echo: Callable[[str], None] | None = None,
                poll_s: float = 0.05, env: dict[str, str] | None = None) -> ProgramOutcome:
    """Run ``program`` on its hosts (``addresses``: each host's IPv4 address; ``env``: more
    of every rank's environment) and wait for it.

    Returns:
        Every rank's result; ``error`` names the first rank that failed (its exit code and
        the end of its stderr), or the ranks still running at the timeout.
    """
    ranks = program.ranks(addresses)
    rank_dir = Path(out_dir) / "ranks"
    rank_dir.mkdir(parents=True, exist_ok=True)
    at = time.time() + START_DELAY_S + PER_RANK_S * len(ranks)
    procs: list[subprocess.Popen] = []
    ends: dict[int, float] = {}
    threads: list[threading.Thread] = []
    files = []
    results: dict[int, RankResult] = {}
    error = None
    try:
        for r in ranks:
            out = open(rank_dir / f"{r.rank}.out", "wb")  # noqa: SIM115 - closed below
            err = open(rank_dir / f"{r.rank}.err", "wb")  # noqa: SIM115
            files += [out, err]
            argv = [sys.executable, "-m", "traffic.agents.startat", repr(at),
                    program.cwd or "-", "--", *r.argv]
            streamed = r.rank == 0 and echo is not None
            proc = spawn(r.host, argv, {"stdout": subprocess.PIPE if streamed else out,
                                        "stderr": err, "stdin": subprocess.DEVNULL,
                                        "env": {**os.environ, **(env or {}), **r.env},
                                        "text": False})
            procs.append(proc)
            if streamed:
                threads.append(_start(_copy, proc.stdout, out, echo))
            threads.append(_start(_wait, proc, r.rank, ends))
        deadline = at + program.timeout_s
        while True:
            failed = sorted((ends[r.rank], r.rank) for r, p in zip(ranks, procs)
                            if r.rank in ends and p.returncode)
            if failed:
                rank = ranks[failed[0][1]]
                code = procs[rank.rank].returncode
                said = tail(rank_dir / f"{rank.rank}.err")
                error = (f"rank {rank.rank} on {rank.host} {_exit_text(code)}"
                         + (" (the other ranks were ended)" if len(ranks) > 1 else "")
                         + (f"; the end of its stderr:\n{said}" if said else
                            "; its stderr is empty"))
                break
            if len(ends) == len(ranks):
                break
            if time.time() > deadline:
                late = [r.rank for r in ranks if r.rank not in ends]
                error = (f"rank(s) {_ranges(late)} still running {program.timeout_s:g} s after "
                         "the start (timeout_s): every rank was ended")
                for rank in late:
                    results[rank] = RankResult(rank, ranks[rank].host, None, None, "timed out")
                break
            time.sleep(poll_s)
    finally:
        for rank, proc in zip(ranks, procs):
            if rank.rank not in ends:
                stop(proc)
                results.setdefault(rank.rank, RankResult(rank.rank, rank.host, None, None,
                                                         "ended"))
        for thread in threads:
            thread.join(5.0)
        for fh in files:
            fh.close()
    for rank, proc in zip(ranks, procs):
        if rank.rank not in results:
            results[rank.rank] = RankResult(rank.rank, rank.host, proc.returncode,
                                            ends.get(rank.rank))
    return ProgramOutcome([results[r.rank] for r in ranks], at, error)


def _start(target, *args) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


def _wait(proc: subprocess.Popen, rank: int, ends: dict[int, float]) -> None:
    proc.wait()
    ends[rank] = time.time()


def _copy(source, into, echo: Callable[[str], None]) -> None:
    """Rank 0's stdout into its file, and line by line to ``echo``."""
    for line in iter(source.readline, b""):
        into.write(line)
        into.flush()
        echo(line.decode(errors="replace").rstrip("\n"))


def _ranges(ranks: list[int]) -> str:
    """``0-3, 7``."""
    out, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            out.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ", ".join(out)
