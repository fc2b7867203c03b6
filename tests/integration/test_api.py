"""The Python API and the pytest plugin as a user meets them: ``examples/api_tour.py`` (up,
exec, check, fail and restore, then run with typed results) and ``examples/test_my_fabric.py``
(the ``fabric`` fixture) run as written, and leave nothing behind (root: real fabrics)."""

from __future__ import annotations

import subprocess
import sys

from tests.integration.conftest import ROOT


def test_the_api_tour_runs_as_written():
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "api_tour.py")],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "small: 4 hosts, 4 switches"
    assert "h1_1 -> h2_2: exit 0" in lines and "all pairs: 12/12 reachable" in lines
    assert "leaf1-spine1 down: 12/12 reachable" in lines
    measured = [line for line in lines if line.startswith("all_reduce 2097152 B on 4 ranks")]
    assert len(measured) == 2 and all("GB/s" in line for line in measured), lines


def test_users_own_tests_get_a_live_fabric_from_the_plugin(tmp_path):
    """pytest finds the plugin by its entry point; each test gets its own fabric."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--rootdir", str(ROOT), str(ROOT / "examples" / "test_my_fabric.py")],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0 and "2 passed" in done.stdout, done.stdout + done.stderr
