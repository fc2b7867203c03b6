"""The report page built from run directories' files (no fabric): every plot present as an
inlined PNG, the fidelity table, failed links marked, and runs found in variants and sweeps."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

from fabriclab import report

from fabriclab.model import rundir
from fabriclab.model.document import read

PORTS = {  # a 2-leaf, 1-spine fabric's switch ports
    "leaf1-eth1": {"node": "leaf1", "peer": "h1_1", "link": "h1_1-leaf1", "tier": "leaf->host"},
    "leaf1-eth2": {"node": "leaf1", "peer": "spine1", "link": "leaf1-spine1",
                   "tier": "leaf->spine"},
    "leaf2-eth1": {"node": "leaf2", "peer": "h2_1", "link": "h2_1-leaf2", "tier": "leaf->host"},
    "leaf2-eth2": {"node": "leaf2", "peer": "spine1", "link": "leaf2-spine1",
                   "tier": "leaf->spine"},
    "spine1-eth1": {"node": "spine1", "peer": "leaf1", "link": "leaf1-spine1",
                    "tier": "spine->leaf"},
    "spine1-eth2": {"node": "spine1", "peer": "leaf2", "link": "leaf2-spine1",
                    "tier": "spine->leaf"},
}


def _run_dir(path: Path, eff: float, failed_link: str | None = None) -> None:
    path.mkdir(parents=True)
    ports = {k: {**v, "rate_bps": 10e6} for k, v in PORTS.items()}
    samples = [{"t_s": float(t), "idle_pct": 50.0, "vswitchd_pct": {"ovs0": 30.0},
                "ports": {p: [int(1_000_000 * t * eff), 20_000 * (t % 3), t, 2 * t, 0]
                          for p in ports}} for t in range(8)]
    (path / "timeline.json").write_text(json.dumps(
        {"interval_s": 1.0, "fields": [], "ports": ports, "samples": samples,
         "started_unix_s": 1000.0}))
    doc = {"experiment": "rep", "complete": True, "fabric": {"variant": path.name},
           "collectives": [{"job": 0, "repetition": 0, "op": "all_reduce", "algorithm": "ring",
                            "bytes": 1 << 20, "communicator_size": 2, "time_us": 1e6,
                            "algbw_GBps": eff * 0.01, "busbw_GBps": eff * 0.01,
                            "efficiency": eff, "label": "ar", "ideal_s": 0.8,
                            "start_unix_s": 1002.5,
                            "flow_end_s": {"p50": 0.4, "p99": 0.9}}],
           "fidelity": {"verdict": "ok", "reasons": [], "idle_pct": {"median": 50.0}},
           "controller": {"links_down": [failed_link] if failed_link else []},
           "real_scale": {"real_rate_gbps": 400, "real_rtt_us": 10, "emulated_rate_mbps": 10,
                          "emulated_rtt_ms": 20, "rate_ratio": 40000.0, "time_ratio": 5e-4,
                          "size_ratio": 20.0, "scales": "bandwidth", "does_not_scale": "cpu"}}
    (path / "results.json").write_text(json.dumps(doc))
    # five transfers, two size bins: 4 KiB (slowdown 1.5 to 3.0) and 4 MiB (slowdown 1.1)
    (path / "flows.csv").write_text(rundir.flows_csv(
        [[0, 0, "ar", "all_reduce", "h1_1", "h2_1", s, 4096 if s < 4 else 4 << 20,
          1002.5 + 0.05 * s, 0.05 * s, 0.05 * s + 0.1 * (s + 1), 0.1 * (s + 1),
          0.1 * (s + 1) / (1.5 + 0.5 * s if s < 4 else 1.1), 1.5 + 0.5 * s if s < 4 else 1.1,
          0.1, 0, "tcp", "", "", "", "", ""] for s in range(5)]))
    (path / "environment.json").write_text(json.dumps({"software": {"kernel": "6.x"},
                                                       "machine": {"cores": 2}}))
    (path / "experiment.json").write_text(json.dumps({"sha256": "0", "experiment": {
        "version": 1, "name": "rep", "fabric": {"topology": "leaf_spine", "leaves": 2,
                                                "spines": 1, "hosts_per_leaf": 1}}}))


def _images(page: str) -> list[bytes]:
    return [base64.b64decode(b) for b in re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)",
                                                    page)]


def test_a_variants_report_inlines_every_plot_and_the_verdicts(tmp_path):
    out = tmp_path / "run"
    _run_dir(out / "a", 0.9)
    _run_dir(out / "b", 0.6, failed_link="leaf1-spine1")
    (out / "variants.json").write_text(json.dumps([{"variant": "a"}, {"variant": "b"}]))
    page = report.write_report(out).read_text()
    images = _images(page)
    # efficiency, the runs overlaid, transfers' ends, slowdown by size, and per run:
    # topology, heatmap, queues
    assert len(images) == 4 + 2 * 3 and all(i.startswith(b"\x89PNG\r\n\x1a\n") for i in images)
    # slowdown per size bin and run: 4 small transfers (1.5 to 3.0), one large
    assert page.count("<td>&lt;=10KiB</td><td class=n>4</td><td class=n>2.00</td>"
                      "<td class=n>3.00</td>") == 2
    assert page.count("<td>&lt;=10MiB</td><td class=n>1</td><td class=n>1.10</td>") == 2
    # per run: its collectives as NCCL-tests prints them, its files, its experiment file
    assert page.count("<th>busbw GB/s</th>") == 2 and "<td class=n>1,000,000.0</td>" not in page
    assert "<td class=n>1000000</td>" in page  # 1 s: us as NCCL-tests prints them
    assert "<td class=n>800000</td>" in page and "<td class=n>0.80</td>" in page  # the ideal
    assert "href='a/results.json'" in page and "href='b/flows.csv'" in page
    assert page.count("the experiment file") == 2 and "hosts_per_leaf: 1" in page
    assert "<h2>Run a</h2>" in page and "<h2>Run b</h2>" in page and "no data" not in page
    assert "400 Gbit/s" in page and "Fidelity" in page and "6.x" in page
    assert "http" not in page.replace("http-equiv", "")  # opens from disk, no network
    assert report.failed_links(read({"controller": {"links_down": ["x-y"]},
                                     "failures": [{"target": ["a", "b"], "action": "down"}]})
                               ) == {"x-y", "a-b"}


def test_a_sweep_report_finds_its_cells(tmp_path):
    out = tmp_path / "sweep"
    _run_dir(out / "k=1,r1", 0.8)
    _run_dir(out / "k=1,r2", 0.9)
    (out / "sweep.json").write_text(json.dumps({"cells": [
        {"name": "k=1,r1", "cell": "k=1"}, {"name": "k=1,r2", "cell": "k=1"}]}))
    runs = report.load_runs(out)
    assert [r.group for r in runs] == ["k=1", "k=1"]
    assert len(_images(report.render(out, runs))) == 4 + 2 * 3


def test_collectives_are_marked_on_the_timelines_clock():
    """A row's start (Unix time) and its time, on the timeline's clock (seconds since its
    first sample); none without the timeline's origin."""
    from fabriclab import charts

    row = {"bytes": 1, "algbw_GBps": 0.0, "busbw_GBps": 0.0, "efficiency": 0.0}
    doc = read({"collectives": [{"op": "all_reduce", "label": "ar", "start_unix_s": 1002.5,
                                 "time_us": 1.5e6, **row},
                                {"op": "all_to_all", "time_us": 1.0, **row}]})
    assert charts.marks(doc, {"started_unix_s": 1000.0}) == [("ar", 2.5, 4.0)]
    assert charts.marks(doc, {}) == [] and charts.marks(doc, None) == []


def test_a_run_with_its_traffic_and_prediction_shows_the_matrix_and_the_ratio(tmp_path):
    """traffic.json's matrix drawn (per job beside the total), and each collective's measured
    time over fabriclab predict's."""
    out = tmp_path / "run"
    _run_dir(out, 0.9)
    doc = json.loads((out / "results.json").read_text())
    doc["collectives"][0]["predicted_s"] = 0.8  # measured 1 s
    (out / "results.json").write_text(json.dumps(doc))
    rows = lambda k: [[0, k, 0], [0, 0, k], [k, 0, 0]]  # noqa: E731
    (out / "traffic.json").write_text(json.dumps({
        "matrix": {"hosts": ["h1", "h2", "h3"], "total": rows(3_000_000),
                   "jobs": {"0": rows(1_000_000), "1": rows(2_000_000)}},
        "phases": [], "batches": []}))
    page = report.write_report(out).read_text()
    assert "alt='run traffic matrix'" in page
    assert "<th>measured / predicted</th>" in page and "<td class=n>1.25</td>" in page
    assert "<td class=n>800000</td>" in page  # predicted us
