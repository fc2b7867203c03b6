"""SIGTERM tears a running `fabriclab up` down; SIGKILL leftovers go with `fabriclab clean`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.integration.conftest import ROOT, machine_state

K4 = ROOT / "experiments" / "quickstart.yaml"


def _start_up(state_dir) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "fabriclab.cli", "--state-dir", str(state_dir),
                             "up", str(K4)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=ROOT)
    deadline = time.monotonic() + 60
    for line in proc.stdout:
        if "fabric is up" in line:
            return proc
        assert time.monotonic() < deadline, "fabric did not come up"
    raise AssertionError(f"fabriclab up exited early with {proc.wait()}")


def _kill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()


def _ours_present() -> bool:
    """Switches of a fabriclab run: bridges in the machine's OVS, or private switch daemons."""
    state = machine_state()
    return (any(b.startswith(("edge", "agg", "core")) for b in state["bridges"])
            or any("ovs-vswitchd" in p for p in state["procs"]))


def test_sigterm_tears_down(state_dir):
    proc = _start_up(state_dir)
    assert _ours_present()
    proc.send_signal(signal.SIGTERM)
    rest = proc.communicate(timeout=60)[0]
    assert proc.returncode == 130, rest
    assert not _ours_present()


def test_sigkill_leftovers_are_removed_by_clean(state_dir):
    _kill(_start_up(state_dir))
    assert _ours_present()  # killed: nothing could tear down
    out = subprocess.run([sys.executable, "-m", "fabriclab.cli", "--state-dir", str(state_dir),
                          "clean"], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "removed 1 run(s)" in out.stdout
    assert not _ours_present()


def test_sigkill_leftovers_are_removed_by_the_next_up(state_dir):
    from fabriclab import experiment as config
    from testbed.fabric import Fabric

    _kill(_start_up(state_dir))
    with Fabric(config.load(K4), state_dir=state_dir) as fabric:  # same names: must clean first
        assert fabric.reachability(count=1).complete
    assert not _ours_present()
