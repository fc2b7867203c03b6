"""The probe stream's outage arithmetic, and the stream itself over loopback."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from traffic.measure.outage import outage

ROOT = Path(__file__).resolve().parents[2]


def test_outage_is_the_longest_run_of_unanswered_probes():
    sent = [i * 0.005 for i in range(100)]
    rtt = {i: 0.001 for i in range(100) if not 40 <= i < 52}  # 12 probes lost
    out = outage(sent, rtt, 0.005)
    assert out["outage_s"] == pytest.approx(0.060) and out["lost"] == 12
    assert out["gap_s"] == pytest.approx(0.060)
    stalled = list(sent)
    for i in range(40, 100):  # the sender itself stalled 30 ms after probe 39
        stalled[i] += 0.030
    late = outage(stalled, rtt, 0.005)
    assert late["outage_s"] == pytest.approx(0.060) and late["gap_s"] == pytest.approx(0.090)
    assert out["started_s"] == pytest.approx(0.200) and out["answered"] == 88
    assert outage(sent, {i: 0.001 for i in range(100)}, 0.005)["outage_s"] == 0.0
    assert outage(sent, {}, 0.005)["lost"] == 100


def test_the_probe_stream_runs_over_loopback():
    import json

    cmd = [sys.executable, "-m", "traffic.agents.probe"]
    echo = subprocess.Popen(cmd + ["echo", "127.0.0.1", "47999", "5"], cwd=ROOT)
    try:
        time.sleep(0.3)
        out = subprocess.run(cmd + ["send", "127.0.0.1", "127.0.0.1", "47999", "47998", "5",
                                    "0.5"], cwd=ROOT, capture_output=True, text=True,
                             timeout=20, check=True).stdout
    finally:
        echo.terminate()
        echo.wait(timeout=5)
    doc = json.loads(out)
    res = outage(doc["sent"], {int(k): v for k, v in doc["rtt"].items()}, doc["interval_s"])
    assert 80 <= res["sent"] <= 101 and res["answered"] == res["sent"] and res["lost"] == 0
