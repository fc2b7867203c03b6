"""Your own topology on the fabric: a containerlab lab and a networkx Clos come up, answer
every ping and run a collective; a fabric exported as a Mininet module starts under ``mn
--custom`` and every pair answers."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _cli(state_dir: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fabriclab.cli", "--state-dir", str(state_dir),
                           *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                          check=False)


@pytest.mark.parametrize("name,hosts", [("custom-lab", 4), ("custom-clos", 8)])
def test_a_drawn_fabric_comes_up_and_runs_its_collectives(state_dir, tmp_path, name, hosts):
    exp = ROOT / "experiments" / f"{name}.yaml"
    up = _cli(state_dir, "up", "--check", str(exp))
    assert up.returncode == 0 and "all pairs reachable" in up.stdout + up.stderr, up.stderr
    run = _cli(state_dir, "run", str(exp), "--out", str(tmp_path / "out"))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert doc["complete"] and doc["fabric"]["topology"] == "custom"
    assert all(len(c["ranks"]) == hosts and c["efficiency"] > 0.5 for c in doc["collectives"])


@pytest.mark.skipif(shutil.which("mn") is None or shutil.which("brctl") is None,
                    reason="Mininet's mn and bridge-utils' brctl (scripts/test-deps.sh)")
def test_the_quickstart_exported_for_mininet_starts_under_mn_and_every_pair_answers(
        state_dir, tmp_path):
    made = _cli(state_dir, "export", "--format", "mininet", "--out", str(tmp_path),
                str(ROOT / "experiments" / "quickstart.yaml"))
    assert made.returncode == 0, made.stderr
    module = tmp_path / "quickstart.py"
    # Mininet's own teardown ends it; its namespaces are the leak check's business too
    proc = subprocess.run(["mn", "--custom", str(module), "--topo", "fabriclab", "--switch",
                           "lxbr,stp=1", "--controller", "none", "--test", "settled_pingall"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "settled_pingall: every pair answered" in out, out[-3000:]
    assert "Results: 0% dropped (240/240 received)" in out
