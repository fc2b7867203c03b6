#!/usr/bin/env python3
"""Benchmark (not a test): the telemetry's cost on idle k=4 and k=6 fat-trees. For each fabric:
the fabric exporter's scrape size and CPU per scrape, Prometheus's achieved scrape interval,
and its disk use per minute. Builds the fabric of an experiment file (no workload), runs
Prometheus at 1 s for ``--seconds``, prints one row per fabric.

Usage: bench/telemetry.py [--seconds 60] [experiments/routing-compare.yaml ...]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fabriclab.model import experiment as xp  # noqa: E402
from telemetry.exporter import RunTelemetry  # noqa: E402
from testbed.fabric.fabric import Fabric  # noqa: E402

DEFAULT = ["experiments/routing-compare.yaml", "experiments/fat-tree-k6.yaml"]


def measure(path: str, seconds: float) -> dict:
    exp = xp.load(ROOT / path)
    with tempfile.TemporaryDirectory() as tmp, Fabric(exp) as fabric, RunTelemetry(
            fabric, Path(tmp) / "prometheus", 1.0, {"experiment": exp.name},
            str(exp.controller.routing)) as tele:
        target = tele.targets["fabric"][0]
        with urllib.request.urlopen(f"http://{target}/metrics", timeout=10) as resp:
            size = len(resp.read())
        start_scrapes, start_cpu = tele.fabric_collector.scrapes, tele.fabric_collector.cpu_s
        time.sleep(seconds)
        prom = tele.prometheus
        scrapes = tele.fabric_collector.scrapes - start_scrapes
        cpu = tele.fabric_collector.cpu_s - start_cpu
        samples = prom.query(f'up{{job="fabric"}}[{int(seconds)}s]')[0]["values"]
        gaps = [b[0] - a[0] for a, b in zip(samples, samples[1:])]
        duration = prom.query('scrape_duration_seconds{job="fabric"}')[0]["value"][1]
        series = prom.query('scrape_samples_scraped{job="fabric"}')[0]["value"][1]
        data = Path(tmp) / "prometheus" / "data"
        disk = int(subprocess.run(["du", "-sb", str(data)], capture_output=True, text=True,
                                  check=True).stdout.split()[0])
        return {"fabric": exp.name, "ports": len(tele.fabric_collector.ports),
                "series": int(float(series)), "scrape_kib": size / 1024,
                "cpu_ms_per_scrape": 1000 * cpu / max(1, scrapes),
                "exporter_core_share": cpu / seconds,
                "scrape_ms": 1000 * float(duration),
                "interval_s_median": statistics.median(gaps),
                "interval_s_max": max(gaps), "disk_kib_per_min": disk / 1024 / (seconds / 60)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("files", nargs="*", default=DEFAULT)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    for path in args.files:
        row = measure(path, args.seconds)
        print("  ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                        for k, v in row.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
