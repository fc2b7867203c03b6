#!/usr/bin/env python3
"""Benchmark (not a test): time from `fabriclab up --check` start to all-pairs reachable, and to
teardown done, for k=4/6(/8) fat-trees and a leaf-spine. Prints one row per fabric; reads the
CLI's JSON document (``--json``), never its console text.

Usage: bench/bringup.py [--k 4 6 8] [--repeat 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_once(experiment: Path) -> dict:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "fabriclab.cli", "up", "--check", "--json",
                           str(experiment)], check=False, capture_output=True, text=True,
                          cwd=ROOT, timeout=600)
    total = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"{experiment.name}: fabriclab up --check failed ({proc.returncode}):\n"
                         f"{proc.stdout}{proc.stderr[-3000:]}")
    doc = json.loads(proc.stdout)
    reach = doc["reachability"]
    return {"reachable_s": reach["reachable_s"], "teardown_s": doc["timings_s"]["down_total"],
            "total_s": total, "pairs": f"{reach['ok']}/{reach['pairs']}"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--k", type=int, nargs="+", default=[4, 6])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    warn = "emulator: {fidelity: warn}\n"  # bring-up only: no traffic, so no load budget
    fabrics = {f"fat_tree k={k}": f"version: 1\nfabric: {{topology: fat_tree, k: {k}}}\n{warn}"
               for k in args.k}
    fabrics["leaf_spine 4x2x4"] = ("version: 1\nfabric: {topology: leaf_spine, leaves: 4, "
                                   "spines: 2, hosts_per_leaf: 4}\n" + warn)
    rows = []
    print(f"{'fabric':<18} {'pairs':>11} {'reachable_s':>12} {'teardown_s':>11} {'total_s':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in fabrics.items():
            path = Path(tmp) / f"{name.replace(' ', '_')}.yaml"
            path.write_text(text)
            runs = [run_once(path) for _ in range(args.repeat)]
            med = {k: statistics.median(r[k] for r in runs)
                   for k in ("reachable_s", "teardown_s", "total_s")}
            rows.append({"fabric": name, "pairs": runs[0]["pairs"], **med})
            print(f"{name:<18} {runs[0]['pairs']:>11} {med['reachable_s']:>12.2f} "
                  f"{med['teardown_s']:>11.2f} {med['total_s']:>8.2f}", flush=True)
    print(f"(median of {args.repeat} runs; reachable_s counts from the start of 'fabriclab up')")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
