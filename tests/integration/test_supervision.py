"""The controller is a supervised fabric service: killed in the middle of a run, the run says
so, fails and keeps its stderr (root: a real fabric, a real controller)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from testbed.poll import wait_for
from testbed.runs.registry import Registry
from tests.integration.conftest import DATAPATHS, ROOT

EXPERIMENT = """version: 1
name: supervised
fabric: {topology: leaf_spine, leaves: 2, spines: 2, hosts_per_leaf: 2,
         host_link: {rate_mbps: 10}, fabric_link: {rate_mbps: 10}, mtu: 9000}
emulator: {datapath: %s}
workload:
  collectives:
    - {op: all_reduce, size: 32MiB, ranks: 4}
"""


@DATAPATHS
def test_a_controller_killed_mid_run_fails_the_run_and_is_reported(tmp_path, datapath):
    """SIGKILL to the controller while a 4-rank all-reduce runs (about 40 s at 10 Mbit/s): the
    run fails within seconds, not at the job's end (exit 3, the message names the controller),
    results.json says complete: false with the death in controller.events within 2 s of the
    kill, and the controller's stderr is kept in the output directory."""
    exp = tmp_path / "exp.yaml"
    exp.write_text(EXPERIMENT % datapath)
    state, out = tmp_path / "state", tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "fabriclab.cli", "--state-dir", str(state),
                             "run", str(exp), "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    try:
        def controller_pid() -> int | None:
            """The controller's PID once the workload's agents were given their job."""
            runs = Registry(state).runs()
            pids = [p.pid for r in runs for p in r.processes if p.role == "controller"]
            started = any(any(Path(r.run_dir).glob("job-*.json")) for r in runs)
            return pids[0] if pids and started else None

        wait_for(lambda: controller_pid() is not None, 120, "the workload to start")
        time.sleep(1.0)  # the agents running
        killed_at = time.time()
        os.kill(controller_pid(), signal.SIGKILL)
        output, _ = proc.communicate(timeout=60)
        ended = time.time()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 3, output[-3000:]
    assert "controller: killed by SIGKILL" in output, output[-3000:]
    assert ended - killed_at < 20, ended - killed_at  # the job did not run to its end (~40 s)
    doc = json.loads((out / "results.json").read_text())
    assert doc["complete"] is False
    events = doc["controller"]["events"]
    assert [e["cause"] for e in events] == ["killed by SIGKILL"], events
    assert events[0]["t"] - killed_at < 2.0, events
    assert (out / "logs" / "controller.stderr").exists()


def test_nothing_of_a_fabric_kept_up_with_telemetry_listens_beyond_loopback(tmp_path):
    """``fabriclab up --telemetry`` on one machine: every listening socket of its processes
    (the command, the controller, the exporters, Prometheus) in the root namespace is on
    loopback, and its run directory is its own (0700)."""
    import re

    exp = tmp_path / "exp.yaml"
    exp.write_text("version: 1\nname: listen\nfabric: {topology: leaf_spine, leaves: 2, spines: 1,"
                   " hosts_per_leaf: 1}\nemulator: {datapath: ebpf}\n")
    state = tmp_path / "state"
    log = open(tmp_path / "up.log", "w", encoding="utf-8")  # noqa: SIM115
    up = subprocess.Popen([sys.executable, "-m", "fabriclab.cli", "--state-dir", str(state), "up",
                           "--telemetry", str(exp)], stdout=log, stderr=subprocess.STDOUT,
                          text=True, cwd=tmp_path)
    log.close()
    try:
        wait_for(lambda: "fabric is up" in (tmp_path / "up.log").read_text()
                 or up.poll() is not None, 120, "the fabric up")
        assert up.poll() is None, (tmp_path / "up.log").read_text()[-2000:]
        runs = Registry(state).runs()
        assert [oct(Path(r.run_dir).stat().st_mode & 0o777) for r in runs] == ["0o700"]
        ours = {up.pid} | {p.pid for r in runs for p in r.processes}
        children = subprocess.run(["ps", "-o", "pid=", "--ppid", str(up.pid)],
                                  capture_output=True, text=True, check=False).stdout.split()
        ours |= {int(c) for c in children}
        listening = subprocess.run(["ss", "-Hltnup"], capture_output=True, text=True,
                                   check=True).stdout.splitlines()
        mine = [line for line in listening
                if {int(p) for p in re.findall(r"pid=(\d+)", line)} & ours]
        assert mine, listening  # the exporters and Prometheus listen
        wide = [line for line in mine if not re.search(r"\s(127\.0\.0\.\d+|\[::1\]):\d+\s", line)]
        assert not wide, wide
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(timeout=120)
