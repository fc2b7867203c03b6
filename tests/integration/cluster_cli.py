"""Running ``fabriclab`` as a user does, on a namespace machine of a test cluster (a Ray driver
runs on a node of its cluster), for the cluster's integration tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def fabriclab_cli(argv: list[str], state_dir: Path, cluster=None, machine: str = "machine1",
         timeout_s: float = 600) -> subprocess.CompletedProcess:
    """``fabriclab ARGV --json`` as a user runs it: on a namespace machine of ``cluster``
    (a Ray driver must run on a node of the cluster), else on this host."""
    cmd = [sys.executable, "-m", "fabriclab.cli", "--state-dir", str(state_dir), *argv, "--json"]
    if cluster is not None:
        return cluster.run(machine, cmd, timeout_s=timeout_s, env={"PYTHONPATH": str(ROOT)})
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=timeout_s,
                          check=False)
