"""The trust boundaries of a shared lab machine: signals during teardown, one writer at a
time, writes that follow no symlink and lose nothing, bounded expansion of an experiment."""

from __future__ import annotations

import os
import signal

from fabriclab.signals import Terminated, raise_on_stop_signals
from testbed.fabric.lifecycle import signals_deferred
from tests.privileges import needs_root

#: the planted links' owner must be another user than the one writing (root, here)
PLANTS = needs_root("planting a link as another user (lchown)")


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


# -- bounded expansion ------------------------------------------------------------------------
ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def _validate_in_time(path, limit_s: float = 2.0) -> tuple[int, str]:
    """``fabriclab validate PATH`` in a thread: (exit code, output), failing the test when it
    takes over ``limit_s`` (a hang stays in its daemon thread)."""
    import contextlib
    import io
    import threading

    from rich.console import Console

    from fabriclab.cli.experiments import validate
    from fabriclab.cli.requests import ValidateRequest

    out, result = io.StringIO(), []

    def run():
        with contextlib.redirect_stderr(out):
            result.append(validate(ValidateRequest([path]), Console(file=out, width=300)))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit_s)
    assert result, f"validate {path.name} took over {limit_s} s"
    return result[0], out.getvalue()


def _shipped(name: str, tmp_path, change) -> object:
    import yaml

    doc = yaml.safe_load((ROOT / "experiments" / name).read_text())
    change(doc)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def test_hostile_counts_are_refused_by_field_before_anything_is_expanded(tmp_path):
    """The property suite's ``experts: 96844`` took 463 s to validate; ``iterations:
    100000000`` looped; a 1.3 KB sweep planned 21.6 million cells."""
    experts = _shipped("moe.yaml", tmp_path,
                       lambda d: d["workload"]["training"].update(experts=96844))
    code, out = _validate_in_time(experts)
    assert code == 2 and "workload.training.experts" in out
    many = _shipped("moe.yaml", tmp_path,  # each count allowed, their product not
                    lambda d: d["workload"]["training"].update(experts=1024))
    code, out = _validate_in_time(many)
    assert code == 2 and "draws" in out
    iterations = _shipped("training.yaml", tmp_path,
                          lambda d: d["workload"]["training"].update(iterations=10 ** 8))
    code, out = _validate_in_time(iterations)
    assert code == 2 and "workload.training.iterations" in out

    def huge_sweep(doc):
        doc["sweep"] = {"axes": {f"fabric.mtu": list(range(1500, 1560)),
                                 "workload.timeout_s": list(range(100, 160)),
                                 "fabric.fabric_link.rate_mbps": list(range(1, 61))},
                        "repetitions": 100}

    code, out = _validate_in_time(_shipped("sweep-oversubscription.yaml", tmp_path, huge_sweep))
    assert code == 2 and "sweep: plans 21,600,000 cells" in out


def test_a_files_runs_together_stay_within_one_planning_budget(tmp_path):
    """Each run of a file within its bounds, but variants multiplying them: refused once
    their sum is over (validating every variant of a near-limit job took seconds)."""
    def variants(doc):
        doc["workload"]["training"].update(iterations=200, layers=48)
        doc["variants"] = [{"name": f"v{i}", "set": {"workload.timeout_s": 100 + i}}
                           for i in range(3)]

    code, out = _validate_in_time(_shipped("training.yaml", tmp_path, variants))
    assert code == 2 and "over all the file's runs" in out


def test_a_fifo_a_folder_and_deep_nesting_are_refused_by_name(tmp_path):
    """A FIFO as the experiment file hung; a folder as a trace, or 3,000 levels of nesting,
    ended in exit 3 and a long traceback."""
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    code, out = _validate_in_time(fifo)
    assert code == 2 and "is not a regular file" in out
    code, out = _validate_in_time(_shipped("nccl-replay.yaml", tmp_path, lambda d: d[
        "workload"].update(nccl_log=str(tmp_path))))
    assert code == 2 and "workload.nccl_log" in out and "not a regular file" in out
    deep = tmp_path / "deep.yaml"
    deep.write_text("version: 1\nname: x\nfabric: " + "[" * 3000 + "]" * 3000 + "\n")
    code, out = _validate_in_time(deep)
    assert code == 2 and "nested deeper than" in out
    big = tmp_path / "big.yaml"
    big.write_bytes(b"# " + b"x" * (5 << 20) + b"\n")
    code, out = _validate_in_time(big)
    assert code == 2 and "over the 4 MiB an experiment file may have" in out


def test_messages_carry_no_control_characters_and_are_cut_short():
    """A key with a terminal escape sequence was echoed as it was, a long value whole."""
    from testbed.errors import printable

    shown = printable("variants[0].set.\x1b]0;owned\x07x: " + "y" * 10_000 + "\nnext\r")
    assert "\x1b" not in shown and "\x07" not in shown and "\r" not in shown
    assert shown.splitlines()[1] == "next?" and len(shown.splitlines()[0]) < 600


def test_tracebacks_kept_are_pruned(tmp_path):
    """Every internal error left a file in STATE_DIR/errors, without end."""
    from fabriclab.cli import main as cli

    errors = tmp_path / "errors"
    errors.mkdir()
    for i in range(30):
        (errors / f"20260101-0000{i:02d}-1.txt").write_text("old")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        where = cli._save_traceback(tmp_path)
    kept = sorted(p.name for p in errors.iterdir())
    assert len(kept) == cli.KEPT_TRACEBACKS and where.endswith(kept[-1])


# -- services ---------------------------------------------------------------------------------
def test_an_exporter_reads_the_fabric_at_most_once_per_half_second(monkeypatch):
    """Every scrape re-read netlink: anyone on the machine could make an exporter read the
    whole fabric as fast as they could ask."""
    from types import SimpleNamespace

    from telemetry import exporter

    reads = []
    fabric = SimpleNamespace(topo=None, link_counters=lambda ports, nl: reads.append(1) or {},
                             congestion=lambda nl: {})
    monkeypatch.setattr(exporter.metrics, "port_labels", lambda topo: {})
    monkeypatch.setattr(exporter.metrics, "fabric_families", lambda *a: ["families"])
    monkeypatch.setattr(exporter, "Netlink", lambda: SimpleNamespace(close=lambda: None))
    now = [100.0]
    monkeypatch.setattr(exporter.time, "monotonic", lambda: now[0])
    collector = exporter.FabricCollector(fabric)
    for _ in range(50):
        assert list(collector.collect()) == ["families"]
    assert len(reads) == 1
    now[0] += exporter.MIN_READ_INTERVAL_S
    list(collector.collect())
    assert len(reads) == 2


def test_prometheus_binds_a_port_of_its_own_and_reports_it(tmp_path):
    """The port was chosen by binding and closing a socket, then handed to Prometheus: free
    for anyone to take in between."""
    import socket

    from telemetry.model.promconfig import listening_port
    from telemetry.prometheus import Prometheus

    assert listening_port('level=info msg="Listening on" address=127.0.0.1:40257') == 40257
    assert listening_port('msg="Start listening for connections" address=127.0.0.1:0') is None
    with Prometheus(tmp_path / "prom", {}, 1.0) as prom:
        assert prom.port > 0
        with socket.socket() as sock:  # it is Prometheus's: taken
            assert sock.connect_ex(("127.0.0.1", prom.port)) == 0


def test_a_controller_that_dies_at_once_is_restarted_five_times_then_reported(tmp_path,
                                                                               monkeypatch):
    """After a failed take-over the watch restarted the controller again and again, for
    ever; now with a backoff, and a sixth death within a minute is one service error."""
    import subprocess
    import sys
    import threading
    from types import SimpleNamespace

    from testbed.fabric import controller as ctl_mod
    from testbed.model.spec import ControllerSpec
    from testbed.poll import wait_for

    monkeypatch.setattr(ctl_mod, "RESTART_BACKOFF_S", (0.0, 0.01, 0.02, 0.03, 0.04))

    def stop(proc, timeout_s=5.0):
        proc.wait()
        return 0

    run = SimpleNamespace(errors=[], stop=stop, run_dir=tmp_path)
    spec = SimpleNamespace(controller=ControllerSpec(restart=True))
    ctl = ctl_mod.Controller(spec, topo=None, run=run, listen="127.0.0.1")
    started = []

    def start(port=0, warm=False):  # a controller that exits at once
        (tmp_path / "controller.stderr").write_text("no such module\n")
        ctl.process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"],
                                       stderr=subprocess.DEVNULL)
        started.append(ctl.process)

    monkeypatch.setattr(ctl, "start", start)
    monkeypatch.setattr(ctl, "wait_listening", lambda timeout_s=20.0, stop=None:
                        ctl._check_alive(stop) or wait_for(lambda: ctl.process.poll() is not None
                                                           and ctl._check_alive(stop), 5, "x"))
    start()
    done = threading.Event()
    watch = threading.Thread(target=ctl.watch, args=(done,), daemon=True)
    watch.start()
    try:
        wait_for(lambda: any(e["event"] == "restart given up" for e in ctl.events), 20,
                 "the watch to give up")
    finally:
        done.set()
        watch.join(5)
    assert len(started) == 1 + len(ctl_mod.RESTART_BACKOFF_S)
    assert len(run.errors) == 1 and "not restarted again" in run.errors[0], run.errors


# -- the cluster ------------------------------------------------------------------------------
def test_a_cluster_without_token_authentication_is_refused_unless_allowed(monkeypatch):
    """Joining without Ray's token authentication was a warning (never shown on the
    --parallel path): whoever reaches the cluster is root on every machine."""
    import pytest

    from testbed.cluster import machines
    from testbed.errors import TestbedError

    pytest.importorskip("ray")
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.setattr(machines, "INSECURE_ALLOWED", False)
    with pytest.raises(TestbedError, match="--insecure-cluster"):
        machines.Cluster("127.0.0.1:9")
    monkeypatch.setattr(machines, "INSECURE_ALLOWED", True)  # said: on to the head
    with pytest.raises(TestbedError, match="cannot reach the Ray cluster's head"):
        machines.Cluster("127.0.0.1:9")
    assert "joined without authentication" in machines.check_authentication("x:1")[0]
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    assert machines.check_authentication("x:1") == []


def test_a_cell_arrives_as_data_and_a_callable_is_never_run(tmp_path, monkeypatch):
    """A machine's actor ran whatever callable it was sent with a cell."""
    from fabriclab import cellagent
    from testbed.cluster import agent

    monkeypatch.setattr(cellagent, "machine_state_dir", lambda name: tmp_path / name)
    ran = []
    worker = cellagent.CellAgent("m1")
    got = worker.run_cell(lambda *a: ran.append(a), "exp.yaml", "c1")
    assert ran == [] and got["files"] == {} and "not plain JSON data" in got["error"]
    assert "is a path" in worker.run_cell({}, 7, "c1")["error"]
    assert "one run on one machine" in worker.run_cell({"sweep": {}}, "x.yaml", "c1")["error"]
    bad = worker.run_cell({"version": 1, "name": "x", "fabric": {"topology": "nope"}},
                          "x.yaml", "c1")
    assert bad["error"].startswith("config error: fabric.topology"), bad
    assert not hasattr(agent.MachineAgent, "run_cell")  # the testbed's actor runs no cells


def test_a_build_arrives_as_data_checked_before_anything_is_built(monkeypatch):
    """A machine's actor built whatever Python objects it was sent (a pickled spec and
    part); now plain data, each name checked against the fabric, the certificates as PEM."""
    import json

    import pytest

    from fabriclab.model import experiment as xp
    from testbed.cluster.agent import MachineAgent
    from testbed.errors import ConfigError
    from testbed.model.partition import (Machine, PartSpec, cut_links, machine_part,
                                         part_to_plain, partition)
    from testbed.model.plain import to_plain

    exp = xp.load(ROOT / "experiments" / "quickstart.yaml")
    plan = partition(exp.topology, [Machine("m1", 1e5), Machine("m2", 1e5)])
    tunnels = cut_links(plan, {"m1": "10.0.0.1", "m2": "10.0.0.2"}, exp.fabric.mtu, {})
    part = part_to_plain(machine_part(exp.topology, plan, tunnels, "m1"))
    spec = json.loads(json.dumps(to_plain(PartSpec.of(exp))))
    built = []
    monkeypatch.setattr("testbed.fabric.fabric.Fabric", lambda *a, **kw: built.append(kw))
    worker = MachineAgent("m1")
    refusals = {
        "a callable": (lambda: 0, part, ["10.0.0.1", 6653], None),
        "a field of another type": ({**spec, "fabric": {**spec["fabric"], "mtu": "x"}}, part,
                                    ["10.0.0.1", 6653], None),
        "a node of no fabric": (spec, {**part, "nodes": ["nowhere"]}, ["10.0.0.1", 6653], None),
        "another machine's part": (spec, {**part, "machine": "m2"}, ["10.0.0.1", 6653], None),
        "a host name as the controller": (spec, part, ["evil.example", 6653], None),
        "no certificate": (spec, part, ["10.0.0.1", 6653], {"ca": "x"}),
    }
    for what, args in refusals.items():
        with pytest.raises(ConfigError):
            worker.build(*args)
        assert built == [], what
    with pytest.raises(AttributeError):  # (past the checks: the stand-in builds nothing)
        worker.build(spec, part, ["10.0.0.1", 6653], None)
    assert built and built[0]["controller_at"] == ("10.0.0.1", 6653)


def test_the_last_scrape_waits_for_targets_that_answer_only(tmp_path, monkeypatch):
    """A restarted controller's exporter (a target that ended) made every run that kept its
    controller through a restart fail at the end: "timed out waiting for a last scrape"."""
    import time

    from telemetry.prometheus import Prometheus

    prom = Prometheus(tmp_path, {}, 1.0)
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(now + 60))
    monkeypatch.setattr(prom, "api", lambda path, **kw: {"activeTargets": [
        {"scrapeUrl": "http://127.0.0.1:1/metrics", "health": "up", "lastScrape": stamp},
        {"scrapeUrl": "http://127.0.0.1:2/metrics", "health": "down",
         "lastScrape": "2026-01-01T00:00:00Z"}]})
    started = time.monotonic()
    prom.wait_scraped(timeout_s=5)
    assert time.monotonic() - started < 2
