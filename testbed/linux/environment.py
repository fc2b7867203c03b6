"""What a run ran on (adapter): software versions and machine facts, for the run directory's
``environment.json``. Each probe that fails says so in its value; none raises."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _first_line(argv: list[str], cwd: Path | None = None) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=10, cwd=cwd,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"unknown ({err})"
    if proc.returncode != 0:
        return f"unknown ({argv[0]} exit {proc.returncode}: {proc.stderr.strip()[:200]})"
    return (proc.stdout.strip().splitlines() or [""])[0]


def _package(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def software_versions() -> dict:
    """Kernel, Open vSwitch, os-ken, Python, and this project's git revision."""
    revision = _first_line(["git", "rev-parse", "HEAD"], ROOT)
    dirty = _first_line(["git", "status", "--porcelain", "--untracked-files=no"], ROOT)
    return {"kernel": platform.release(), "kernel_build": platform.version(),
            "openvswitch": _first_line(["ovs-vswitchd", "--version"]),
            "os_ken": _package("os-ken"), "python": platform.python_version(),
            "fabriclab": _package("fabriclab"),
            "git_revision": revision + (" (with local changes)" if dirty and not
                                        dirty.startswith("unknown") else "")}


def machine_facts() -> dict:
    """Cores, CPU model, memory."""
    model, mem_kib = "unknown", None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
                break
    except OSError:
        pass
    return {"cores": os.cpu_count(), "cpu_model": model, "machine": platform.machine(),
            "memory_mib": mem_kib // 1024 if mem_kib else None,
            "hostname": platform.node()}


@functools.cache
def document() -> dict:
    """``environment.json``: :func:`software_versions` and :func:`machine_facts`, probed once
    per process (a sweep's cells share them)."""
    return {"software": software_versions(), "machine": machine_facts()}
