"""SIGTERM tears a running `fabriclab up` down; SIGKILL leftovers go with `fabriclab clean`."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading

from testbed.model.topology import SWITCH_ROLES
from tests.integration.conftest import DATAPATHS, ROOT, machine_state

K4 = ROOT / "experiments" / "quickstart.yaml"
UP_TIMEOUT_S = 60


def _k4(state_dir, datapath: str):
    """The quickstart's fabric on ``datapath`` (on the userspace Open vSwitch at 10 Mbit/s,
    within its budget)."""
    text = K4.read_text().replace("datapath: auto", f"datapath: {datapath}")
    if datapath == "ovs":
        text = text.replace("rate_mbps: 100}", "rate_mbps: 10}")
    path = state_dir.parent / f"quickstart-{datapath}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _start_up(state_dir, datapath: str) -> subprocess.Popen:
    """``fabriclab up --json``, returned once its document says the fabric is up."""
    exp = _k4(state_dir, datapath)
    log = open(state_dir.parent / "up.stderr", "w", encoding="utf-8")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "fabriclab.cli", "--state-dir", str(state_dir),
                             "up", "--json", str(exp)], stdout=subprocess.PIPE, stderr=log,
                            text=True, cwd=ROOT)
    log.close()
    lines: queue.Queue = queue.Queue()

    def reader() -> None:  # a pipe read cannot time out: a thread reads, the test waits
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=reader, daemon=True).start()
    text = ""
    while True:
        try:
            line = lines.get(timeout=UP_TIMEOUT_S)
        except queue.Empty:
            _kill(proc)
            raise AssertionError(f"fabriclab up said nothing for {UP_TIMEOUT_S} s") from None
        if line is None:
            raise AssertionError(f"fabriclab up exited early with {proc.wait()}: "
                                 + (state_dir.parent / "up.stderr").read_text()[-2000:])
        text += line
        if line.startswith("}"):  # the end of the one JSON document
            assert json.loads(text)["state"] == "up"
            return proc


def _kill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()


def _ours_present() -> bool:
    """Switches of a fabriclab run: bridges in the machine's OVS, private switch daemons, or
    eBPF switches' pinned programs and their ports (veths named after switches)."""
    state = machine_state()
    return (any(b.startswith(SWITCH_ROLES) for b in state["bridges"])
            or any("ovs-vswitchd" in p for p in state["procs"])
            or bool(state["bpf pins"])
            or any(v.startswith(SWITCH_ROLES) for v in state["veth"]))


@DATAPATHS
def test_sigterm_tears_down(state_dir, datapath):
    proc = _start_up(state_dir, datapath)
    assert _ours_present()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 130, (state_dir.parent / "up.stderr").read_text()[-2000:]
    assert not _ours_present()


@DATAPATHS
def test_sigkill_leftovers_are_removed_by_clean(state_dir, datapath):
    _kill(_start_up(state_dir, datapath))
    assert _ours_present()  # killed: nothing could tear down
    out = subprocess.run([sys.executable, "-m", "fabriclab.cli", "--state-dir", str(state_dir),
                          "clean", "--json"], capture_output=True, text=True, cwd=ROOT,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert len(report["runs"]) == 1 and report["processes"] > 0 and not report["errors"]
    assert not _ours_present()


@DATAPATHS
def test_sigkill_leftovers_are_removed_by_the_next_up(state_dir, datapath):
    from fabriclab.model import experiment as config
    from testbed.fabric.fabric import Fabric

    _kill(_start_up(state_dir, datapath))
    with Fabric(config.load(_k4(state_dir, datapath)), state_dir=state_dir) as fabric:  # same names: must clean first
        assert fabric.reachability(count=1).complete
    assert not _ours_present()


def test_clean_removes_only_the_links_that_carry_the_runs_group(tmp_path):
    """A run's links are its own by their link group: an interface that someone else made
    under a name the record holds (a switch's name on the userspace datapath has no device of
    ours; a name reused after a crash) is left alone and counted, the run's own is deleted."""
    from testbed.linux.netlink import Netlink
    from testbed.runs.cleanup import clean_record
    from testbed.runs.registry import Registry

    registry = Registry(tmp_path / "state")
    record = registry.new_run(tmp_path / "run")
    record.links = ["fltown0", "fltforeign0"]
    registry.save(record)
    try:
        with Netlink() as nl:
            nl.create_veth("fltown0", "fltown1", group=record.link_group)
            nl.create_veth("fltforeign0", "fltforeign1")  # another's: the default group
        report = clean_record(record, registry)
        with Netlink() as nl:
            left = nl.existing({"fltown0", "fltown1", "fltforeign0", "fltforeign1"})
        assert left == {"fltforeign0", "fltforeign1"}, left
        assert report.links == 1 and report.foreign_links == 1, report
    finally:
        subprocess.run(["ip", "link", "del", "fltforeign0"], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", "fltown0"], capture_output=True, check=False)
