"""The trust boundaries of a shared lab machine, continued: bounded expansion of an experiment
file, the services a run leaves (exporters, Prometheus, the set-up's), the controller's
restarts, and what a cluster's machines accept."""

from __future__ import annotations

import os

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
        doc["sweep"] = {"axes": {"fabric.mtu": list(range(1500, 1560)),
                                 "workload.timeout_s": list(range(100, 160)),
                                 "fabric.fabric_link.rate_mbps": list(range(1, 61))},
                        "repetitions": 100}

    code, out = _validate_in_time(_shipped("sweep-oversubscription.yaml", tmp_path, huge_sweep))
    assert code == 2 and "sweep: plans 21,600,000 cells" in out


def test_a_files_runs_together_stay_within_one_planning_budget(tmp_path):
    """Each run of a file within its bounds, but variants multiplying them: refused once
    their sum is over (validating every variant of a large job took seconds: a 308-layer
    job with its three variants, 1.8 s, under every count's own cap)."""
    def variants(doc):
        doc["workload"]["training"].update(iterations=1000)
        doc["variants"] = [{"name": f"v{i}", "set": {"workload.timeout_s": 100 + i}}
                           for i in range(3)]

    code, out = _validate_in_time(_shipped("training.yaml", tmp_path, variants))
    assert code == 2 and "the file's runs together would take about" in out


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


def _services(tmp_path, call: str, **env) -> tuple[str, list[str]]:
    """``scripts/services.sh``'s ``call`` in bash with a stand-in ``systemctl`` (which says
    the service is enabled and records what it is asked); returns (output, its calls)."""
    import subprocess

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "systemctl.log"
    fake = bin_dir / "systemctl"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexit 0\n')
    fake.chmod(0o755)
    proc = subprocess.run(["bash", "-c", f". {ROOT / 'scripts' / 'services.sh'}; {call}"],
                          capture_output=True, text=True, check=True,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin", **env})
    return proc.stdout, log.read_text().splitlines() if log.exists() else []


def test_the_set_up_disables_debians_unused_prometheus_service(tmp_path):
    """Debian's prometheus package left its service enabled on every interface, unused."""
    systemd = tmp_path / "systemd"
    systemd.mkdir()
    config = tmp_path / "prometheus.yml"
    config.write_text("global: {}\n")
    env = {"FABRICLAB_SYSTEMD_DIR": str(systemd), "FABRICLAB_PROMETHEUS_CONFIG": str(config)}
    _, calls = _services(tmp_path, "disable_unused_prometheus", **env)
    assert calls == ["is-enabled prometheus", "disable --now prometheus"]
    (tmp_path / "systemctl.log").unlink()
    config.write_text("# fabriclab's standing configuration\n")  # the lab VM's: kept
    _, calls = _services(tmp_path, "disable_unused_prometheus", **env)
    assert calls == ["is-enabled prometheus"]


def test_the_lab_grafana_admin_has_a_generated_password(tmp_path):
    """The lab VM's Grafana was admin/admin on all its interfaces."""
    path = tmp_path / "etc" / "grafana-admin-password"
    first, _ = _services(tmp_path, f"grafana_admin_password {path}")
    again, _ = _services(tmp_path, f"grafana_admin_password {path}")
    assert first == again and len(first.strip()) >= 20 and first.strip() != "admin"
    assert path.stat().st_mode & 0o777 == 0o600
    compose = (ROOT / "telemetry" / "grafana" / "compose.yaml").read_text()
    assert "GF_SECURITY_ADMIN_PASSWORD: ${GF_SECURITY_ADMIN_PASSWORD:?" in compose
