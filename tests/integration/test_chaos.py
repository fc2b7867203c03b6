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
