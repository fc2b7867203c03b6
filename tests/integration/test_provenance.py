"""A run's record as a researcher reuses it: one seed, the same paths run after run; another
seed, other paths; the provenance says what ran (datapath, congestion control as the sockets
ran it, sysctls, qdiscs, software)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

#: 8 hosts on a 2-leaf, 2-spine fabric: an all-to-all's 56 transfers of 2 connections each,
#: every one hashed over the 2 spines
EXPERIMENT = """version: 1
name: seeded
fabric:
  topology: leaf_spine
  leaves: 2
  spines: 2
  hosts_per_leaf: 4
  host_link: {rate_mbps: 100}
  fabric_link: {rate_mbps: 100}
  queue: {size_kb: 1024}
  mtu: 9000
  hosts: {tcp_rmem_max_kb: 256}
emulator: {datapath: ebpf}
controller: {routing: ecmp}
workload:
  connections: 2
  collectives:
    - {op: all_to_all, size: 8MiB, ranks: 8}
"""


def _run(state_dir: Path, exp: Path, out: Path, seed: int) -> tuple[dict, list[dict]]:
    proc = subprocess.run([sys.executable, "-m", "fabriclab.cli", "--state-dir", str(state_dir),
                           "run", str(exp), "--out", str(out), "--seed", str(seed)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads((out / "results.json").read_text())
    with open(out / "flows.csv", encoding="utf-8") as fh:
        return doc, list(csv.DictReader(fh))


def _paths(flows: list[dict]) -> dict[tuple, tuple]:
    return {(f["src"], f["dst"]): (f["src_ports"], f["path"]) for f in flows}


def test_one_seed_takes_the_same_paths_and_another_seed_others(state_dir, tmp_path):
    exp = tmp_path / "seeded.yaml"
    exp.write_text(EXPERIMENT)
    first, flows1 = _run(state_dir, exp, tmp_path / "a", 5)
    again, flows2 = _run(state_dir, exp, tmp_path / "b", 5)
    other, flows3 = _run(state_dir, exp, tmp_path / "c", 6)
    assert len(flows1) == 56 and all(f["path"] and f["src_ports"] for f in flows1)
    assert _paths(flows1) == _paths(flows2)  # every connection: its ports and its path
    assert {p for _s, p in _paths(flows1).values()} != {p for _s, p in _paths(flows3).values()}
    assert all(float(f["slowdown"]) >= 1.0 for f in flows1 + flows2 + flows3)
    prov = first["provenance"]
    assert (prov["seed"], again["provenance"]["seed"], other["provenance"]["seed"]) == (5, 5, 6)
    assert prov["datapath"] == "ebpf" and prov["datapath_why"]
    assert prov["tcp_congestion_control"] and prov["software"]["kernel"]
    assert prov["host_sysctls"]["net.ipv4.tcp_rmem"].endswith(" 262144")
    assert prov["qdiscs"]["host NIC"].startswith("htb rate 100000 kbit")
    assert first["collectives"][0]["transport"]["congestion_control"] == "+".join(
        prov["tcp_congestion_control"])
