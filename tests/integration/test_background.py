"""Fabrics in the background: ``fabriclab up -d`` returns once the fabric is up with its run
id, ``ls`` lists it, a second one is refused by name, ``down`` tears it down and nothing is
left (root: real fabrics)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.integration.conftest import ROOT

EXPERIMENT = """version: 1
name: background
fabric: {topology: leaf_spine, leaves: 2, spines: 1, hosts_per_leaf: 2}
emulator: {datapath: ebpf}
"""


def _cli(state, *args: str, timeout_s: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fabriclab.cli", "--state-dir", str(state),
                           *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout_s)


def test_a_fabric_kept_up_in_the_background_is_listed_and_taken_down(tmp_path):
    exp = tmp_path / "bg.yaml"
    exp.write_text(EXPERIMENT)
    state = tmp_path / "state"
    up = _cli(state, "up", "-d", str(exp))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        run_id = up.stdout.strip()
        listed = json.loads(_cli(state, "ls", "--json").stdout)
        assert [(r["run"], r["experiment"], r["hosts"]) for r in listed] == \
            [(run_id, "background", 4)]
        assert listed[0]["controller"].startswith("127.0.0.1:")
        again = _cli(state, "up", "-d", str(exp))
        assert again.returncode == 3 and f"another fabric is up (run {run_id}" in again.stderr
        table = _cli(state, "ls").stdout
        assert run_id in table and "background" in table
    finally:
        down = _cli(state, "down", "--json")
    assert down.returncode == 0, down.stdout + down.stderr
    assert json.loads(down.stdout) == {"down": [run_id]}
    assert json.loads(_cli(state, "ls", "--json").stdout) == []
    gone = _cli(state, "down")
    assert gone.returncode == 3 and "no running fabric" in gone.stdout + gone.stderr
