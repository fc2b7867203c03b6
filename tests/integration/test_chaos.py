"""Chaos in ``make test``: ``bench/chaos.py`` for 10 rounds (every part of a run gets a random
signal at a random time once, and each fault of a shared machine comes once: a second run at
once, a full disk, a double SIGHUP, a rogue OpenFlow client, a squatted controller port): no
leak, no hang, no silent fault, no run broken by an earlier round's leftovers, no rogue
answered, nothing written lost."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.integration.conftest import ROOT


def test_ten_rounds_of_chaos_leave_nothing_hide_nothing_and_hang_nothing(tmp_path):
    out = tmp_path / "chaos.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "chaos.py"), "--rounds", "10",
                           "--seed", "2026", "--json", str(out)], capture_output=True,
                          text=True, cwd=ROOT, timeout=1800)
    assert out.exists(), proc.stdout[-4000:] + proc.stderr[-4000:]
    doc = json.loads(out.read_text())
    assert {r["part"] for r in doc["rounds"]} == {
        "orchestrator", "controller", "agent", "vswitchd", "prometheus", "twin", "full-disk",
        "double-hup", "rogue-switch", "squat"}
    assert doc["totals"]["delivered"] == 10, proc.stdout[-4000:]
    assert (doc["totals"]["leaks"], doc["totals"]["hangs"], doc["totals"]["silent"],
            doc["totals"]["next_run_failures"], doc["totals"]["rogue"],
            doc["totals"]["lost"]) == (0, 0, 0, 0, 0, 0), proc.stdout[-6000:]
    assert proc.returncode == 0, proc.stdout[-4000:]


def test_a_stop_at_any_moment_of_a_runs_start_ends_it_and_leaves_nothing(tmp_path):
    """HUP, TERM and INT to the orchestrator at 12 moments of its first 4 s (imports, the
    handlers' installation, the live-run check, the build): never exit 0, nothing left."""
    out = tmp_path / "start.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "chaos.py"), "--start", "12",
                           "--json", str(out)], capture_output=True, text=True, cwd=ROOT,
                          timeout=1200)
    assert out.exists(), proc.stdout[-4000:] + proc.stderr[-4000:]
    doc = json.loads(out.read_text())
    assert doc["totals"]["delivered"] == 12, proc.stdout[-4000:]
    assert [r["exit_code"] for r in doc["rounds"] if r["exit_code"] == 0] == [], proc.stdout
    assert (doc["totals"]["leaks"], doc["totals"]["hangs"], doc["totals"]["silent"],
            doc["totals"]["next_run_failures"]) == (0, 0, 0, 0), proc.stdout[-6000:]
    assert proc.returncode == 0, proc.stdout[-4000:]
