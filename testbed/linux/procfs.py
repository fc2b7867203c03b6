"""``/proc``, read in one place: process state, CPU time and kernel start time
(``/proc/PID/stat``), and sysctls."""

from __future__ import annotations

import os
from dataclasses import dataclass

CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcStat:
    """The fields of ``/proc/PID/stat`` fabriclab uses."""

    state: str  # R, S, D, Z (zombie), X (dead), ...
    utime_ticks: int
    stime_ticks: int
    start_ticks: int  # clock ticks after boot: with the PID, identifies a process for good

    @property
    def cpu_s(self) -> float:
        """User + system CPU seconds of the process and its threads."""
        return (self.utime_ticks + self.stime_ticks) / CLK_TCK

    @property
    def gone(self) -> bool:
        """A zombie or dead process: it no longer runs."""
        return self.state in ("Z", "X")


def parse_stat(text: str) -> ProcStat:
    """Parse the text of ``/proc/PID/stat`` (the command name may hold spaces and parentheses).

    Raises:
        ValueError: when the text is not such a line.
    """
    try:
        fields = text.rsplit(")", 1)[1].split()
        return ProcStat(fields[0], int(fields[11]), int(fields[12]), int(fields[19]))
    except (IndexError, ValueError) as err:
        raise ValueError(f"not a /proc/PID/stat line: {text[:80]!r}") from err


def read_stat(pid: int) -> ProcStat | None:
    """The stat of ``pid``, or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return parse_stat(fh.read())
    except (OSError, ValueError):
        return None


def sysctl_path(name: str) -> str:
    """``net.core.wmem_default`` -> ``/proc/sys/net/core/wmem_default``."""
    return "/proc/sys/" + name.replace(".", "/")


def read_sysctl(name: str) -> str:
    with open(sysctl_path(name), encoding="ascii") as fh:
        return fh.read().strip()


def write_sysctl(name: str, value: str) -> None:
    with open(sysctl_path(name), "w", encoding="ascii") as fh:
        fh.write(value)


def descendants(pid: int) -> list[int]:
    """Every living process below ``pid`` (children, theirs, ...), read from ``/proc`` now:
    what a process that starts daemons of its own (a Ray node) leaves to be ended by PID."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] not in ("Z", "X"):
            parent[int(entry)] = int(fields[1])
    out, frontier = [], [pid]
    while frontier:
        below = [p for p, pp in parent.items() if pp in frontier]
        out += below
        frontier = below
    return out
