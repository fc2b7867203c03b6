"""The trust boundaries of a shared lab machine: signals during teardown, one writer at a
time, writes that follow no symlink and lose nothing, bounded expansion of an experiment."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from fabriclab.signals import Terminated, raise_on_stop_signals
from testbed.fabric.lifecycle import signals_deferred
from tests.privileges import needs_root

#: the planted links' owner must be another user than the one writing (root, here)
PLANTS = needs_root("planting a link as another user (lchown)")


def test_a_dropped_ssh_sessions_second_sighup_does_not_interrupt_teardown():
    """An ssh session that drops sends SIGHUP twice: the first starts the teardown, the second
    (in it) used to raise Terminated out of it and leak what was left."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    hook = sys.unraisablehook
    try:
        raise_on_stop_signals()
        finished = False
        try:
            with signals_deferred():
                os.kill(os.getpid(), signal.SIGHUP)
                os.kill(os.getpid(), signal.SIGTERM)
                finished = True
        except Terminated:  # pragma: no cover - the failure this test is for
            pass
        assert finished
        assert signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN  # handlers back after
    finally:
        sys.unraisablehook = hook
        for sig, handler in saved.items():
            signal.signal(sig, handler)


#: a stop signal handled inside a weak reference's callback (where Python drops an exception,
#: as in the import machinery's module-lock callbacks), then the command's own code
SWALLOWED = """
import os, signal, sys, time, weakref
from fabriclab.signals import Terminated, raise_on_stop_signals, stop_received

class Thing:
    pass

def callback(_ref):
    os.kill(os.getpid(), signal.SIG{name})
    for _ in range(1000):  # the handler runs here, inside the callback
        pass

raise_on_stop_signals()
thing = Thing()
ref = weakref.ref(thing, callback)
try:
    del thing
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        time.sleep(0.01)
    print("lost", stop_received())
except (Terminated, KeyboardInterrupt) as err:
    print("unwound", type(err).__name__, stop_received())
"""


def test_a_stop_dropped_inside_a_callback_still_unwinds_the_command():
    """A SIGHUP 0.4 s into a run, on a loaded machine, landed in a module lock's weak
    reference callback during an import: Python printed "Exception ignored" and the run went
    on to exit 0. The stop is now delivered again once the callback returns."""
    import subprocess
    import sys

    for name, raised in (("HUP", "Terminated"), ("TERM", "Terminated"),
                         ("INT", "KeyboardInterrupt")):
        out = subprocess.run([sys.executable, "-c", SWALLOWED.replace("{name}", name)],
                             capture_output=True, text=True, timeout=60,
                             cwd=Path(__file__).resolve().parents[2])
        assert out.stdout.split() == ["unwound", raised, f"SIG{name}"], out.stderr


def test_a_command_a_stop_reached_too_late_to_unwind_does_not_exit_0(monkeypatch, capsys):
    """Where a library drops the stop's exception and the command runs on to its end, the
    exit says it was stopped (130), never 0."""
    from fabriclab.cli import main as cli

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}

    sent = []

    def swallowing(_request, _ui):
        if not sent:
            sent.append(signal.SIGHUP)
            try:
                os.kill(os.getpid(), signal.SIGHUP)
            except Terminated:  # as a library's bare except would
                pass
        return 0

    monkeypatch.setattr(cli.Command, "handler", lambda self: swallowing)
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    try:
        assert cli.main(["clean"]) == 130
        assert "SIGHUP arrived but could not interrupt" in capsys.readouterr().err
        assert cli.main(["clean"]) == 0  # the next command starts with no stop recorded
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _open_a_run(state_dir, barrier, results) -> None:
    """In a child: record a run once both children are ready, the live-run check slowed so
    the two overlap (as two invocations at once do on a busy machine)."""
    import time

    from testbed.fabric.services import FabricRun
    from testbed.runs import registry as reg

    runs = reg.Registry.runs

    def slow_runs(self):
        found = runs(self)
        time.sleep(0.3)
        return found

    reg.Registry.runs = slow_runs
    barrier.wait(10)
    try:
        FabricRun(reg.Registry(state_dir), lambda line: None).open(orphans=False)
        results.put("built")
    except Exception as err:  # noqa: BLE001 - reported to the test
        results.put(f"refused: {err}")
    barrier.wait(10)  # a run is live while its owner is: both stay until both have tried


def test_two_invocations_at_once_cannot_both_pass_the_live_run_check(tmp_path):
    """Both used to find no fabric up and both build (each raising the machine's send buffer
    and putting back what the other had raised)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    children = [ctx.Process(target=_open_a_run, args=(tmp_path, barrier, results))
                for _ in range(2)]
    for child in children:
        child.start()
    outcomes = sorted(results.get(timeout=30) for _ in children)
    for child in children:
        child.join(10)
    assert outcomes[0] == "built", outcomes
    assert outcomes[1].startswith("refused: another fabric is up"), outcomes


def _fake_ovs(monkeypatch, tagged: dict[str, str]) -> list[str]:
    """The machine's Open vSwitch as cleanup sees it: ``tagged`` bridges (name -> run id);
    returns the list the deleted names go to."""
    from testbed.runs import cleanup

    deleted: list[str] = []
    monkeypatch.setattr(cleanup.ovs, "db_answers", lambda: True)
    monkeypatch.setattr(cleanup.ovs, "bridges_by_run", lambda: dict(tagged))
    monkeypatch.setattr(cleanup.ovs, "delete_bridges", deleted.extend)
    monkeypatch.setattr(cleanup.ovs, "delete_qos", lambda run_ids=None, keep=(): 0)
    return deleted


def test_a_recorded_bridge_name_now_another_runs_is_left_to_it(tmp_path, monkeypatch):
    """A dead run's record names bridge s1; s1 is now tagged by a live run (the name was
    reused): it used to be deleted because it carried some run's tag."""
    from testbed.runs import cleanup
    from testbed.runs.registry import Registry

    registry = Registry(tmp_path / "state")
    dead = registry.new_run(tmp_path / "work")
    dead.owner_pid, dead.bridges = 2 ** 22 + 5, ["s1", "s2"]
    registry.save(dead)
    deleted = _fake_ovs(monkeypatch, {"s1": "someone-else", "s2": dead.run_id})
    cleanup.clean_record(dead, registry)
    assert deleted == ["s2"]


def test_the_orphan_sweep_spares_live_runs_of_every_state_directory(tmp_path, monkeypatch):
    """Bridges of a live run recorded in another state directory (another --state-dir, or a
    cluster machine's) used to count as orphans of the sweep."""
    from testbed.runs import cleanup, registry as reg

    monkeypatch.setattr(reg, "STATE_DIR_INDEX", tmp_path / "index")
    other = reg.Registry(tmp_path / "other")
    machine = reg.Registry(tmp_path / "main" / "machines" / "m1")
    theirs, the_machines = other.new_run(tmp_path / "w1"), machine.new_run(tmp_path / "w2")
    deleted = _fake_ovs(monkeypatch, {"a1": theirs.run_id, "m1s1": the_machines.run_id,
                                      "gone": "20260101-000000-000000"})
    report = cleanup.clean(reg.Registry(tmp_path / "main"))
    assert deleted == ["gone"] and report.errors == []
    for registry, record in ((other, theirs), (machine, the_machines)):
        registry.remove(record)


def test_a_namespace_name_standing_for_another_namespace_is_left(tmp_path, monkeypatch):
    """A dead run's record names host h1; /run/netns/h1 now stands for another namespace (the
    name was taken since): it used to be removed by name."""
    from testbed.runs import cleanup
    from testbed.runs.registry import Registry

    registry = Registry(tmp_path / "state")
    dead = registry.new_run(tmp_path / "work")
    dead.owner_pid, dead.netns_names = 2 ** 22 + 5, ["h1", "h2", "h3"]
    dead.netns_inodes = {"h1": 7, "h2": 8, "h3": 9}
    unnamed: list[str] = []
    # h3's file stands for no namespace any more (its mount gone): the run's leftover
    monkeypatch.setattr(cleanup.netns, "inode", {"h1": 9, "h2": 8, "h3": 0}.get)
    monkeypatch.setattr(cleanup.netns, "unname", unnamed.append)
    report = cleanup.clean_record(dead, registry)
    assert unnamed == ["h2", "h3"]
    assert any("h1" in s and "left alone" in s for s in report.skipped)


NOBODY = 65534


def _planted_link(link, target) -> None:
    """A symbolic link as another user (nobody) would plant it in a directory of theirs."""
    os.symlink(target, link)
    os.lchown(link, NOBODY, NOBODY)


@PLANTS
def test_a_link_planted_at_the_temporary_name_is_not_followed(tmp_path):
    """The temporary file was ``.NAME.PID.tmp``: a link planted there made root's write land
    on its target."""
    from testbed.linux.files import write_text_atomic

    victim = tmp_path / "victim"
    victim.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    _planted_link(out / f".results.json.{os.getpid()}.tmp", victim)
    _planted_link(out / "report.html", victim)  # the file itself a link: replaced, not followed
    write_text_atomic(out / "results.json", "{}")
    write_text_atomic(out / "report.html", "<html>")
    assert victim.read_text() == "precious"
    assert (out / "results.json").read_text() == "{}" and not (out / "report.html").is_symlink()


@PLANTS
def test_a_folder_that_is_another_users_link_is_refused(tmp_path):
    """``--out runs/x`` where runs/x is someone else's link to a system folder: the results
    used to be written there."""
    import pytest

    from testbed.linux.files import WriteError, make_dirs, write_text_atomic

    system = tmp_path / "etc"
    system.mkdir()
    _planted_link(tmp_path / "runs", system)
    with pytest.raises(WriteError, match="symbolic link of uid 65534"):
        write_text_atomic(tmp_path / "runs" / "results.json", "{}")
    with pytest.raises(WriteError, match="symbolic link of uid 65534"):
        make_dirs(tmp_path / "runs" / "v1")
    assert list(system.iterdir()) == []
    os.symlink(system, tmp_path / "mine")  # root's own link is followed
    write_text_atomic(tmp_path / "mine" / "ok.json", "{}")
    assert (system / "ok.json").read_text() == "{}"


@PLANTS
def test_the_grafana_password_and_the_prometheus_log_follow_no_link(tmp_path):
    """``telemetry DIR``: the password file was opened through a link (its target then
    chmod-ed 0600 and overwritten), the log appended to through one."""
    import pytest

    from telemetry.grafana import save_password
    from testbed.linux.files import WriteError, open_append

    victim = tmp_path / "victim"
    victim.write_text("precious")
    victim.chmod(0o644)
    _planted_link(tmp_path / "grafana-admin-password", victim)
    path = save_password(tmp_path, "x" * 16)
    assert victim.read_text() == "precious" and victim.stat().st_mode & 0o777 == 0o644
    assert path.read_text() == "x" * 16 + "\n" and path.stat().st_mode & 0o777 == 0o600
    _planted_link(tmp_path / "prometheus.log", victim)
    with pytest.raises(WriteError, match="prometheus.log"):
        open_append(tmp_path / "prometheus.log")
    assert victim.read_text() == "precious"


def test_a_full_disk_is_a_named_system_error_and_leaves_the_earlier_file(tmp_path,
                                                                          monkeypatch):
    """A full disk was an "internal error" and left the temporary file behind."""
    import errno

    import pytest

    from testbed.linux import files

    target = tmp_path / "results.json"
    files.write_text_atomic(target, "earlier")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files.os, "fsync", full)
    with pytest.raises(files.WriteError, match="results.json: No space left on device .*full"):
        files.write_text_atomic(target, "later")
    assert target.read_text() == "earlier" and sorted(os.listdir(tmp_path)) == ["results.json"]


def test_an_os_error_is_a_system_error_not_an_internal_one(tmp_path, monkeypatch, capsys):
    """An OSError out of a command (a permission, a full disk outside the writers) printed
    "internal error ... a bug in fabriclab" with a traceback file."""
    import errno

    from fabriclab.cli import main as cli

    def refuse(*_args, **_kw):
        raise PermissionError(errno.EACCES, "Permission denied", "/some/file")

    monkeypatch.setattr(cli, "to_request", refuse)
    assert cli.main(["--state-dir", str(tmp_path), "ls"]) == 3
    err = capsys.readouterr().err
    assert "system error" in err and "/some/file" in err and "internal error" not in err


def test_force_moves_the_earlier_run_aside_and_a_second_writer_is_refused(tmp_path):
    """``--force`` left an earlier sweep's cells beside the new run's (the report showed them);
    two runs into one ``--out`` (two ``--resume`` too) both ran."""
    import pytest

    from fabriclab.rundirs import writing_to
    from testbed.errors import ConfigError

    out = tmp_path / "out"
    (out / "old-cell").mkdir(parents=True)
    (out / "sweep.json").write_text("{}")
    with writing_to(out, resume=False, force=True) as aside:
        assert list(out.iterdir()) == []
        assert sorted(p.name for p in aside.iterdir()) == ["old-cell", "sweep.json"]
        with pytest.raises(ConfigError, match="being written by another fabriclab run"):
            with writing_to(out, resume=True, force=False):
                pass
    with writing_to(out, resume=True, force=False) as aside:  # free again once done
        assert aside is None


@needs_root("the refusal is root's: another user's run writes with that user's rights")
def test_root_refuses_an_output_directory_others_may_write(tmp_path):
    """Root wrote results into a folder any user could change under it."""
    import pytest

    from fabriclab.rundirs import writing_to
    from testbed.errors import ConfigError

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ConfigError, match="writable by others"):
        with writing_to(shared, resume=False, force=False):
            pass
    shared.chmod(0o1777)  # sticky, as /tmp: no one replaces another's file
    with writing_to(shared, resume=False, force=False):
        pass


NETLINK_STOPS = """
import os, signal, sys, threading
from fabriclab import signals
from testbed.linux.netlink import _ipr
signals.raise_on_stop_signals()
ends = []
for i in range(60):
    ipr = _ipr()
    timer = threading.Timer(0.002 + (i % 30) * 0.0003, os.kill, (os.getpid(), signal.SIGHUP))
    timer.start()
    try:
        for _ in range(300):
            ipr.get_links()
        ends.append("finished")
    except signals.Terminated:
        ends.append("stopped")
    timer.join()
    ipr.get_links()  # raises if the stop broke the socket's event loop
    ipr.close()
print(" ".join(sorted(set(ends))))
"""


def test_a_stop_during_a_netlink_call_waits_for_it_and_leaves_the_socket_usable():
    """pyroute2 runs its calls on an asyncio loop that swallows a stop raised in a callback:
    the run's IPRoute was then broken (RuntimeError: Event loop stopped before Future
    completed) or hung, and its teardown left the namespaces (chaos round 91, seed 53)."""
    import subprocess

    out = subprocess.run([sys.executable, "-c", NETLINK_STOPS], capture_output=True,
                         text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr[-3000:]
    assert "stopped" in out.stdout.split(), out.stdout


def test_a_held_stop_is_raised_once_when_the_outermost_call_returns():
    import threading

    from testbed import stops

    seen = []
    with_held = stops.held
    try:
        with with_held():
            with with_held():
                stops.defer(Terminated("SIGHUP"))
                stops.defer(Terminated("SIGTERM"))  # the first one wins
                seen.append("inner done")
            seen.append("outer still running")
        seen.append("not reached")
    except Terminated as err:
        seen.append(str(err))
    assert seen == ["inner done", "outer still running", "SIGHUP"]
    with with_held():  # nothing kept over
        pass
    other = []
    worker = threading.Thread(target=lambda: other.append(stops.holding()))
    with with_held():
        worker.start()
        worker.join()
    assert other == [False]  # another thread's calls hold nothing of the main thread's


def test_a_stop_between_a_spawn_and_its_tracking_waits_until_the_process_is_tracked(tmp_path):
    """A stop that landed after a host's process was forked but before the run tracked it left
    a traffic agent running after the teardown (bench/chaos.py, a SIGHUP 3 s into a run): the
    stop now waits until the process is in the run record, whose teardown ends it."""
    import subprocess

    from fabriclab import signals
    from fabriclab.signals import _on_signal
    from testbed.fabric.services import FabricRun
    from testbed.runs.registry import Registry

    run = FabricRun(Registry(tmp_path), lambda line: None)
    run.open(orphans=False)
    started = []

    def popen_then_stop(host, argv, **kw):
        started.append(subprocess.Popen(argv, **kw))
        _on_signal(signal.SIGHUP, None)  # delivered here, as the fork returns
        return started[-1]

    run.host_popen = popen_then_stop
    try:
        with pytest.raises(Terminated):
            run.spawn("h1", ["sleep", "30"], "agent:1:h1")
    finally:
        signals._received.clear()  # the stop was this test's, not a command's
    (proc,) = started
    assert [p.pid for p in run.record.processes] == [proc.pid]
    run.close([])
    assert proc.poll() is not None  # ended by the teardown, by its PID
