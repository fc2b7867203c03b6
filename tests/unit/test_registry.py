"""Run records and cleanup without root: processes (with children) ended by PID and start time,
records that cannot be read reported instead of skipped, /proc parsing, and polling."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.runs import cleanup
from testbed.errors import TestbedError
from testbed.poll import wait_for
from testbed.linux.procfs import parse_stat, read_stat
from testbed.runs.registry import Registry, TrackedProcess, proc_start_time, stop_processes

PARENT = ("import subprocess, sys, time; "
          "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
          "print('child up', flush=True); time.sleep(600)")


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as fh:
            return [int(x) for x in fh.read().split()]
    except OSError:
        return []


def test_cleaning_a_record_ends_its_processes_and_their_children(tmp_path):
    registry = Registry(tmp_path)
    record = registry.new_run(tmp_path / "work")
    record.owner_pid, record.owner_start = 1, 0  # an owner that is not us: the run is dead
    proc = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)  # leads a group, as fabric services do
    try:
        assert proc.stdout.readline() == "child up\n"
        (child,) = wait_for(lambda: _children(proc.pid), 5, "the child process")
        registry.track_process(record, proc.pid, "agent:test")
        assert [p.role for p in registry.runs()[0].processes] == ["agent:test"]
        # clean() would go on to sweep the machine's Open vSwitch (root): the record alone here
        report = cleanup.clean_record(record, registry)
        assert report.runs == [record.run_id] and report.processes == 1, report
        assert not report.errors
        assert proc.wait(timeout=5) != 0
        wait_for(lambda: proc_start_time(child) is None, 5, "the child to be gone")
        assert registry.runs() == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def test_files_a_run_wrote_outside_its_directory_are_removed_with_it(tmp_path):
    registry = Registry(tmp_path)
    record = registry.new_run(tmp_path / "work")
    record.owner_pid, record.owner_start = 1, 0  # a dead run
    announced = tmp_path / "sd" / "run.fabric.json"
    announced.parent.mkdir()
    announced.write_text("[]")
    registry.track_file(record, str(announced))
    registry.track_file(record, str(announced))  # once only
    registry.track_file(record, str(tmp_path / "sd" / "gone.json"))  # already removed: fine
    (saved,) = registry.runs()
    assert saved.files == [str(announced), str(tmp_path / "sd" / "gone.json")]
    report = cleanup.clean_record(saved, registry)
    assert not report.errors and report.runs == [record.run_id]
    assert not announced.exists() and registry.runs() == []


def test_daemons_a_killed_run_never_registered_are_found_by_their_pid_files(tmp_path):
    """A run killed between a private ovsdb-server's start and its registration: the daemon's
    own PID file in the run's folder (and its command line naming that folder) finds it."""
    registry = Registry(tmp_path)
    record = registry.new_run(tmp_path / "work")
    record.owner_pid, record.owner_start = 1, 0  # a dead run
    instance = tmp_path / "work" / "ovs3"
    instance.mkdir(parents=True)
    daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                               f"{instance}/conf.db"], start_new_session=True)
    try:
        cmdline = Path(f"/proc/{daemon.pid}/cmdline")
        wait_for(lambda: str(instance).encode() in cmdline.read_bytes(), 5,
                 "the daemon's command line")  # empty until it has exec'd
        (instance / "ovsdb-server.pid").write_text(f"{daemon.pid}\n")
        other = tmp_path / "work" / "ovs4"
        other.mkdir()
        (other / "ovs-vswitchd.pid").write_text(f"{os.getpid()}\n")  # not that folder's
        report = cleanup.clean_record(record, registry)
        assert not report.errors and report.processes == 1, report
        assert daemon.wait(timeout=10) != 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()


def test_box_key_follows_every_input_of_the_box(tmp_path):
    from testbed.vm.labvm import ROOT, box_key

    scripts = tmp_path / "scripts"
    scripts.mkdir()
    for name in ("build-box.sh", "debian-tree.sh", "setup.sh"):
        (scripts / name).write_bytes((ROOT / "scripts" / name).read_bytes())
    key = box_key(tmp_path)
    assert key == box_key(ROOT) and len(key) == 12
    for name in ("build-box.sh", "debian-tree.sh", "setup.sh"):
        original = (scripts / name).read_bytes()
        (scripts / name).write_bytes(original + b"\n# changed\n")
        assert box_key(tmp_path) != key, name
        (scripts / name).write_bytes(original)


def test_a_live_owner_keeps_its_run_and_a_recycled_pid_is_never_signalled(tmp_path):
    registry = Registry(tmp_path)
    record = registry.new_run(tmp_path / "work")  # owned by this (live) process
    assert record.owner_alive() and registry.runs() == [record]
    stranger = subprocess.Popen(["sleep", "30"])
    try:
        impostor = TrackedProcess(stranger.pid, proc_start_time(stranger.pid) + 1, "agent:old")
        assert stop_processes([impostor]) == 0  # same PID, other start time: not ours
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()
    registry.untrack_process(record, 12345)
    registry.remove(record)


def test_an_unreadable_record_is_an_error_not_a_silent_skip(tmp_path, monkeypatch):
    registry = Registry(tmp_path)
    registry.runs_dir.mkdir(parents=True)
    (registry.runs_dir / "20260101-000000-abcdef.json").write_text("{not json")
    records, unreadable = registry.scan()
    assert records == [] and "20260101-000000-abcdef.json" in unreadable[0]
    with pytest.raises(TestbedError, match="not a readable run record"):
        registry.runs()
    # the sweep of the machine's Open vSwitch (root) finds nothing here
    monkeypatch.setattr(cleanup.ovs, "bridges_by_run", lambda: {})
    monkeypatch.setattr(cleanup.ovs, "delete_bridges", lambda names: None)
    monkeypatch.setattr(cleanup.ovs, "delete_qos", lambda run_ids=None, keep=(): 0)
    report = cleanup.clean(registry)
    assert report.runs == [] and len(report.errors) == 1
    assert "remove it by hand" in report.errors[0]


def test_proc_stat_parsing():
    stat = parse_stat("42 (a (weird) name) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 "
                      "1 0 987654 1000 10 18446744073709551615")
    assert (stat.state, stat.utime_ticks, stat.stime_ticks, stat.start_ticks) == (
        "S", 250, 50, 987654)
    assert not stat.gone and parse_stat("1 (x) Z " + "0 " * 20).gone
    with pytest.raises(ValueError):
        parse_stat("garbage")
    assert read_stat(2 ** 22 + 12345) is None
    pid = __import__("os").getpid()
    before = read_stat(pid)
    t_end = time.process_time() + 0.3
    while time.process_time() < t_end:  # burn 0.3 s of CPU
        pass
    after = read_stat(pid)
    assert before is not None and 0.2 <= after.cpu_s - before.cpu_s <= 1.0, (before, after)


def test_wait_for_returns_the_value_or_names_what_it_waited_for():
    start = time.monotonic()
    calls = []
    assert wait_for(lambda: calls.append(1) or len(calls) >= 3 and "done", 5, "x",
                    interval_s=0.01) == "done"
    with pytest.raises(TestbedError, match=r"timed out after 0.1 s waiting for the moon"):
        wait_for(lambda: None, 0.1, "the moon", interval_s=0.02)
    assert time.monotonic() - start < 2


def test_a_record_made_in_another_network_namespace_is_left_to_it(tmp_path):
    """A namespace machine's part (its interfaces live in its namespace) is not cleaned from
    here: it is reported, and cleaned where it was made; a record of this namespace whose
    owner is gone is cleaned."""
    registry = Registry(tmp_path)
    theirs = registry.new_run(tmp_path / "work")
    theirs.owner_pid, theirs.netns = 2 ** 22 + 7, "net:[1]"  # a gone owner, elsewhere
    registry.save(theirs)
    ours = registry.new_run(tmp_path / "work")
    ours.owner_pid = 2 ** 22 + 9
    registry.save(ours)
    report = cleanup.clean(registry, orphans=False)
    assert report.runs == [ours.run_id]
    assert report.skipped == [f"{theirs.run_id} (made in network namespace net:[1]: clean it "
                              "there)"]
    assert [r.run_id for r in registry.runs()] == [theirs.run_id]
