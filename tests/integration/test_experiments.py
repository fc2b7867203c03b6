"""A sweep run end to end as a user runs it: cells with repetitions, a failed cell recorded and
passed, --resume, the run directories' files, the fidelity verdict, and the report rendered by
headless Chromium with every image present."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from tests.integration.conftest import ROOT

# two leaves, one spine: an all-reduce of about 2.5 s per cell (the monitor samples every
# second: the report's heatmap and queue plots need 3 samples); dctcp is not in this kernel, so its cells
# fail before running (the sweep records them and goes on). The cubic cells build the same
# fabric: the second (dmodk) runs on the first's with a new controller
SWEEP = """version: 1
name: sweep-test
fabric: {topology: leaf_spine, leaves: 2, spines: 1, hosts_per_leaf: 2,
         host_link: {rate_mbps: 10}, fabric_link: {rate_mbps: 10}}
scale: {real_rate_gbps: 400}
workload:
  collectives:
    - {op: all_reduce, label: ar, size: 2MiB, ranks: 4}
sweep:
  axes:
    workload.congestion_control: [cubic, dctcp]
    controller.routing: [ecmp, dmodk]
"""


def _cli(state_dir, *args, timeout=600):
    return subprocess.run([sys.executable, "-m", "fabriclab.cli", "--state-dir", str(state_dir),
                           *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                          check=False)


def test_a_sweep_runs_its_cells_keeps_going_resumes_and_reports(state_dir, tmp_path):
    """Long: one sweep's whole life in one test (run, a failed cell, resume, report, compare),
    because each step needs the run directory the one before it left."""
    exp = tmp_path / "sweep.yaml"
    exp.write_text(SWEEP)
    out = tmp_path / "out"
    proc = _cli(state_dir, "run", str(exp), "--out", str(out))
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]  # a cell failed
    assert "cell 4/4" in proc.stdout and "left" in proc.stdout  # progress with an ETA
    doc = json.loads((out / "sweep.json").read_text())
    status = {c["name"]: c["complete"] for c in doc["cells"]}
    assert status == {"congestion_control=cubic,routing=ecmp": True,
                      "congestion_control=cubic,routing=dmodk": True,
                      "congestion_control=dctcp,routing=ecmp": False,
                      "congestion_control=dctcp,routing=dmodk": False}
    assert all("dctcp" in c["error"] for c in doc["cells"] if not c["complete"])
    summary = {line["cell"]: line for line in doc["summary"]}
    eff = summary["congestion_control=cubic,routing=ecmp"]["jobs"][0]["efficiency"]
    assert eff["n"] == 1 and 0.3 < eff["mean"] < 1.2  # small transfers ride the shaper's burst
    # the cubic cells share one fabric; dctcp is refused before a build (or a reuse)
    assert "1 fabric build(s) for 4 cell(s)" in proc.stdout

    cell = out / "congestion_control=cubic,routing=ecmp"
    run = json.loads((cell / "results.json").read_text())
    expanded = json.loads((cell / "experiment.json").read_text())
    assert expanded["experiment"]["workload"]["congestion_control"] == "cubic"
    assert "sweep" not in expanded["experiment"]
    assert run["experiment_sha256"] == expanded["sha256"]
    env = json.loads((cell / "environment.json").read_text())
    assert env["software"]["openvswitch"].startswith("ovs-vswitchd") and env["machine"]["cores"]
    assert (cell / "collectives.csv").read_text().count("\n") == 2  # header + one collective
    flows = (cell / "flows.csv").read_text().splitlines()
    assert len(flows) == 1 + 4 * 6  # ring all-reduce on 4 ranks: 6 steps, 4 transfers each
    timeline = json.loads((cell / "timeline.json").read_text())
    assert len(timeline["samples"]) >= 2 and len(timeline["ports"]) == 8
    assert run["fidelity"]["verdict"] in ("ok", "degraded") and "idle_pct" in run["fidelity"]
    real = run["collectives"][0]["real"]
    assert real["busbw_GBps"] == pytest.approx(run["collectives"][0]["busbw_GBps"] * 4e4)
    assert run["real_scale"]["real_rate_gbps"] == 400

    # the dmodk cell ran on the ecmp cell's fabric, under a controller of its own
    second = out / "congestion_control=cubic,routing=dmodk"
    reused = json.loads((second / "results.json").read_text())
    assert (run["fabric_reused"], reused["fabric_reused"]) == (False, True)
    assert (run["controller"]["routing"], reused["controller"]["routing"]) == ("ecmp", "dmodk")
    assert reused["controller"]["cpu_s"] < run["controller"]["cpu_s"] + 5  # not cumulative
    logs = [(d / "logs" / "controller.log").read_text() for d in (cell, second)]
    assert "routing ecmp" in logs[0] and "routing dmodk" not in logs[0]
    assert "routing dmodk" in logs[1] and "routing ecmp" not in logs[1]
    first_t, second_t = run["timings_s"], reused["timings_s"]
    assert first_t["bring_up"] > 0 and first_t["measurement"] > 0
    # kept up for the next cell: only the run's services stop (the exporter's HTTP server
    # within its 0.5 s poll); the fabric itself is not torn down
    assert first_t["teardown"] < 1.0
    assert 0 < second_t["bring_up"] < first_t["bring_up"]  # a controller, not a fabric
    assert doc["timings_s"]["bring_up"] >= first_t["bring_up"]  # summed over cells

    # the same directory again: refused; --resume runs only the failed cells
    again = _cli(state_dir, "run", str(exp), "--out", str(out))
    assert again.returncode == 2 and "--resume finishes it" in again.stderr, again.stderr
    resumed = _cli(state_dir, "run", str(exp), "--out", str(out), "--resume")
    assert resumed.returncode == 3 and "2 complete already), 2 to run" in \
        resumed.stdout + resumed.stderr, resumed.stdout[-2000:]

    compared = _cli(state_dir, "compare", str(out), str(cell), "--json")
    assert compared.returncode == 0, compared.stdout + compared.stderr
    lines = json.loads(compared.stdout)
    assert [line["complete"] for line in lines] == [True, True, False, False, True]

    # the report, as a person would open it: rendered from disk by headless Chromium
    page = out / "report.html"
    assert page.is_file()
    text = page.read_text()
    images = len(re.findall(r"<img ", text))
    # efficiency, the runs overlaid, FCT CDFs, and a run's topology, heatmap and queues
    assert images >= 3 + 3
    assert "<th>busbw GB/s</th>" in text and "<th>time us</th>" in text  # NCCL-tests' table
    assert "the experiment file" in text and "href='" in text and "results.json</a>" in text
    for link in re.findall(r"href='([^']+)'", text):  # every file link leads to a file
        assert (out / link).is_file(), link
    chromium = shutil.which("chromium")
    assert chromium, "chromium is installed by scripts/test-deps.sh (make test)"
    flags = ["--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1200,4000"]
    shot = tmp_path / "report.png"
    subprocess.run([chromium, *flags, f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    assert shot.read_bytes().startswith(b"\x89PNG") and shot.stat().st_size > 20_000
    dom = subprocess.run([chromium, *flags, "--dump-dom", page.as_uri()], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert f'data-images="{images}/{images}"' in dom  # every image decoded
