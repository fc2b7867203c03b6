"""The trust boundaries of a shared lab machine: signals during teardown, one writer at a
time, writes that follow no symlink and lose nothing, bounded expansion of an experiment."""

from __future__ import annotations

import os
import signal

from fabriclab.signals import Terminated, raise_on_stop_signals
from testbed.fabric.lifecycle import signals_deferred


def test_a_dropped_ssh_sessions_second_sighup_does_not_interrupt_teardown():
    """An ssh session that drops sends SIGHUP twice: the first starts the teardown, the second
    (in it) used to raise Terminated out of it and leak what was left."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
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
    dead.owner_pid, dead.netns_names, dead.netns_inodes = 2 ** 22 + 5, ["h1", "h2"], {"h1": 7,
                                                                                      "h2": 8}
    unnamed: list[str] = []
    monkeypatch.setattr(cleanup.netns, "inode", {"h1": 9, "h2": 8}.get)
    monkeypatch.setattr(cleanup.netns, "unname", unnamed.append)
    report = cleanup.clean_record(dead, registry)
    assert unnamed == ["h2"]
    assert any("h1" in s and "left alone" in s for s in report.skipped)
