"""The vm backend: the same CLI inside a full-kernel guest, where netem exists."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.integration.conftest import ROOT

DELAYED = """version: 1
name: vm-delay
fabric:
  topology: leaf_spine
  leaves: 2
  spines: 1
  hosts_per_leaf: 1
  host_link: {rate_mbps: 10, delay_us: 2000}
  fabric_link: {rate_mbps: 10}
emulator: {backend: vm}
"""


def test_a_delayed_fabric_runs_in_the_guest_with_its_delay(state_dir, tmp_path):
    exp = tmp_path / "delay.yaml"
    exp.write_text(DELAYED)
    proc = subprocess.run([sys.executable, "-m", "fabriclab.cli", "--state-dir", str(state_dir),
                           "up", "--check", "--json", str(exp)], capture_output=True, text=True,
                          cwd=ROOT, timeout=1800, check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["backend"] == "vm" and doc["vm"]["exit"] == 0
    assert doc["datapath"] == "system"  # the guest's kernel datapath
    reach = doc["reachability"]
    assert (reach["pairs"], reach["ok"], reach["sent"], reach["lost"]) == (2, 2, 4, 0)
    # each probe crosses two host links each way, each delayed 2 ms: RTT >= 8 ms
    assert 8.0 <= reach["rtt_ms"]["min"] < 60.0, reach  # without the delay: about 1 ms
    assert not list((state_dir / "runs").glob("*.json"))  # the guest's run record is gone


def test_a_workload_runs_in_the_guest_and_its_results_come_out(state_dir, tmp_path):
    exp = tmp_path / "run.yaml"
    exp.write_text(DELAYED.replace("hosts_per_leaf: 1", "hosts_per_leaf: 2")
                   + "workload:\n  collectives:\n    - {op: all_reduce, size: 1MiB, ranks: 4}\n")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "fabriclab.cli", "--state-dir", str(state_dir),
                           "run", str(exp), "--out", str(out), "--json"], capture_output=True,
                          text=True, cwd=ROOT, timeout=1800, check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    doc = json.loads((out / "results.json").read_text())
    assert json.loads(proc.stdout)["collectives"] == doc["collectives"]
    assert doc["complete"] and [r["op"] for r in doc["collectives"]] == ["all_reduce"]
    assert 0.3 < doc["collectives"][0]["efficiency"] <= 1.15
