"""CPU accounting from /proc: machine-wide busy/idle and per-process usage between two samples."""

from __future__ import annotations

import time
from dataclasses import dataclass

from testbed.linux.procfs import CLK_TCK, read_stat


@dataclass(frozen=True)
class CpuSample:
    """One reading: machine jiffies (busy, total) and per-pid CPU seconds, at ``time_s``."""

    time_s: float
    busy: int
    total: int
    proc_s: dict[int, float]


def _machine() -> tuple[int, int]:
    with open("/proc/stat", encoding="ascii") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields[:8])  # guest time is already in user/nice
    return total - idle, total


CPU_MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def machine_cpu_s() -> dict[str, float]:
    """The machine's CPU seconds by mode, summed over the cores (``/proc/stat``'s first line)."""
    with open("/proc/stat", encoding="ascii") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    return {mode: jiffies / CLK_TCK for mode, jiffies in zip(CPU_MODES, fields)}


def process_cpu_s(pid: int) -> float | None:
    """User+system CPU seconds of ``pid`` and its threads, None once it is gone."""
    stat = read_stat(pid)
    return None if stat is None else stat.cpu_s


def sample(pids: list[int]) -> CpuSample:
    """Read the machine counters and those of ``pids`` now."""
    busy, total = _machine()
    procs = {pid: cpu for pid in pids if (cpu := process_cpu_s(pid)) is not None}
    return CpuSample(time.monotonic(), busy, total, procs)


@dataclass(frozen=True)
class CpuUsage:
    """Usage between two samples: ``idle_pct`` of the whole machine (all cores), and per pid
    the percentage of one core (100 = one core fully busy)."""

    idle_pct: float
    busy_cores: float
    proc_pct: dict[int, float]


def usage(before: CpuSample, after: CpuSample) -> CpuUsage:
    """CPU usage between ``before`` and ``after``."""
    dt = max(after.time_s - before.time_s, 1e-6)
    total = max(after.total - before.total, 1)
    busy = after.busy - before.busy
    procs = {pid: 100.0 * (after.proc_s[pid] - before.proc_s[pid]) / dt
             for pid in after.proc_s if pid in before.proc_s}
    return CpuUsage(100.0 * (1 - busy / total), busy / CLK_TCK / dt, procs)
