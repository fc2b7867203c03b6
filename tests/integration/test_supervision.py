"""The controller is a supervised fabric service: killed in the middle of a run, the run says
so, fails and keeps its stderr (root: a real fabric, a real controller)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.poll import wait_for
from testbed.runs.registry import Registry
from tests.integration.conftest import DATAPATHS, ROOT

EXPERIMENT = """version: 1
name: supervised
fabric: {topology: leaf_spine, leaves: 2, spines: 2, hosts_per_leaf: 2,
         host_link: {rate_mbps: 10}, fabric_link: {rate_mbps: 10}, mtu: 9000}
emulator: {datapath: %s}
controller: {restart: %s}
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
    output, killed_at, ended, _ = _kill_the_controller_mid_run(tmp_path, datapath, False)
    assert output.endswith("exit 3"), output[-3000:]
    assert "controller: killed by SIGKILL" in output, output[-3000:]
    assert ended - killed_at < 20, ended - killed_at  # the job did not run to its end (~40 s)
    out = tmp_path / "out"
    doc = json.loads((out / "results.json").read_text())
    assert doc["complete"] is False
    events = doc["controller"]["events"]
    assert [e["cause"] for e in events] == ["killed by SIGKILL"], events
    assert events[0]["t"] - killed_at < 2.0, events
    assert (out / "logs" / "controller.stderr").exists()


def _kill_the_controller_mid_run(tmp_path, datapath: str, restart: bool,
                                 before=lambda run_dir: None, after=lambda run_dir: None):
    """``fabriclab run`` of a 4-rank all-reduce, the controller SIGKILLed a second into the
    job; ``before(run_dir)`` runs just before the kill and ``after(run_dir)`` while the run
    goes on (with a restart). Returns (the run's output ending with its exit code, when the
    kill was sent, when the run ended, what ``before`` returned)."""
    exp = tmp_path / "exp.yaml"
    exp.write_text(EXPERIMENT % (datapath, "true" if restart else "false"))
    state, out = tmp_path / "state", tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "fabriclab.cli", "--state-dir", str(state),
                             "run", str(exp), "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    try:
        def started():
            """The run (its controller's PID, its directory) once the agents have a job."""
            for run in Registry(state).runs():
                pids = [p.pid for p in run.processes if p.role == "controller"]
                if pids and any(Path(run.run_dir).glob("job-*.json")):
                    return pids[0], Path(run.run_dir)
            return None

        wait_for(lambda: started() is not None, 120, "the workload to start")
        time.sleep(1.0)  # the agents running
        pid, run_dir = started()
        seen = before(run_dir)
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
        after(run_dir)
        output, _ = proc.communicate(timeout=120)
        ended = time.time()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return f"{output}\nexit {proc.returncode}", killed_at, ended, seen


def _ovs_flows(run_dir: Path) -> dict[str, dict[str, float]]:
    """Every OVS switch's flows (match and actions -> seconds installed), by bridge."""
    out = {}
    for mgmt in sorted(run_dir.glob("ovs*/*.mgmt")):
        text = subprocess.run(["ovs-ofctl", "-O", "OpenFlow15", "dump-flows", f"unix:{mgmt}"],
                              capture_output=True, text=True, check=True, timeout=10).stdout
        flows = {}
        for line in text.splitlines()[1:]:
            age = float(re.search(r"duration=([\d.]+)s", line).group(1))
            rule = re.sub(r"(duration|n_packets|n_bytes|idle_age|hard_age)=[^,]*,?\s*", "",
                          line).strip()
            flows[rule] = age
        out[mgmt.stem] = flows
    return out


@DATAPATHS
def test_a_controller_killed_mid_run_with_restart_is_taken_over_warm(tmp_path, datapath):
    """``controller.restart: true``: the same kill, and the run completes (exit 0). A new
    controller took over within seconds, read back every flow and group the first one had
    installed and changed nothing: the switches' flow counts are the same before and after,
    and (Open vSwitch, read with ovs-ofctl) every flow is the same entry, older by the time
    between the readings, never added again."""
    status = {}

    def before(run_dir: Path):
        status.update(json.loads((run_dir / "controller-status.json").read_text()))
        return (time.time(), _ovs_flows(run_dir)) if datapath == "ovs" else None

    ovs_after = {}

    def after(run_dir: Path):
        def taken_over() -> bool:
            try:
                doc = json.loads((run_dir / "controller-status.json").read_text())
            except (OSError, ValueError):
                return False
            return len(doc.get("programmed", [])) == len(status["installed"]) and \
                doc.get("warm_start") and doc["pid"] != status["pid"]

        wait_for(taken_over, 30, "the new controller to take over")
        if datapath == "ovs":
            ovs_after.update(at=time.time(), flows=_ovs_flows(run_dir))

    output, killed_at, _, seen = _kill_the_controller_mid_run(tmp_path, datapath, True,
                                                              before, after)
    assert output.endswith("exit 0"), output[-3000:]
    assert "controller: killed by SIGKILL" in output and "restarted warm" in output, output
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert doc["complete"] is True
    died, restarted = doc["controller"]["events"]
    assert (died["event"], died["cause"], restarted["event"]) == \
        ("died", "killed by SIGKILL", "restarted")
    assert died["t"] - killed_at < 2.0, died
    assert 0 < restarted["outage_s"] < 15, restarted
    installed = status["installed"]
    assert restarted["switches_read"] == len(installed) == 4
    assert restarted["flows_read"] == sum(f for f, _ in installed.values())
    assert restarted["groups_read"] == sum(g for _, g in installed.values())
    assert restarted["changes"] == {}, restarted
    assert sorted((tmp_path / "out" / "logs").glob("controller-*.stderr"))
    if datapath == "ovs":
        then, flows_before = seen
        elapsed = ovs_after["at"] - then
        assert {b: len(f) for b, f in ovs_after["flows"].items()} == \
            {b: len(f) for b, f in flows_before.items()}
        for bridge, flows in flows_before.items():
            for rule, age in flows.items():
                assert ovs_after["flows"][bridge][rule] >= age + elapsed - 1.0, (bridge, rule)


def test_nothing_of_a_fabric_kept_up_with_telemetry_listens_beyond_loopback(tmp_path):
    """``fabriclab up --telemetry`` on one machine: every listening socket of its processes
    (the command, the controller, the exporters, Prometheus) in the root namespace is on
    loopback, and its run directory is its own (0700)."""

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


TLS = """version: 1
name: tls
fabric: {topology: leaf_spine, leaves: 2, spines: 2, hosts_per_leaf: 2}
controller: {tls: true}
"""


@DATAPATHS
def test_openflow_runs_over_tls_with_the_runs_own_certificates(state_dir, datapath):
    """``controller.tls: true``: every switch is programmed over TLS, every pair reaches every
    other, the keys are the run's (0600), and the controller answers no plain OpenFlow: a
    hello over TCP gets no hello back."""
    import socket
    import ssl

    from testbed.fabric.fabric import Fabric
    from tests.integration.conftest import experiment

    with Fabric(experiment(TLS, datapath), state_dir=state_dir) as fabric:
        reach = fabric.reachability(count=1)
        assert reach.complete and reach.ok == reach.pairs == 12, reach.to_dict()
        pki = fabric.controller.pki
        assert oct(pki.controller_key.stat().st_mode & 0o777) == "0o600"
        if datapath == "ovs":
            db = next(fabric.run_dir.glob("ovs*/db.sock"))
            target = subprocess.run(["ovs-vsctl", f"--db=unix:{db}", "get-controller", "leaf1"],
                                    capture_output=True, text=True, check=True).stdout
            assert target.startswith(f"ssl:{fabric.listen}:{fabric.controller.of_port}"), target
        hello = bytes.fromhex("0600000800000001")  # OpenFlow 1.5 hello
        with socket.create_connection((fabric.listen, fabric.controller.of_port), timeout=5) as plain:
            plain.sendall(hello)
            try:
                answer = plain.recv(64)
            except (ConnectionResetError, TimeoutError):
                answer = b""
        assert not answer.startswith(b"\x06\x00"), answer  # a TLS alert or nothing
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_verify_locations(pki.ca)  # the server is this run's controller ...
        with socket.create_connection((fabric.listen, fabric.controller.of_port), timeout=5) as raw:
            with pytest.raises((ssl.SSLError, ConnectionResetError, OSError)):
                with ctx.wrap_socket(raw, server_hostname=fabric.listen) as tls:
                    tls.sendall(hello)  # ... and it wants this run's switch certificate
                    assert tls.recv(64) == b""


DEFAULT = """version: 1
name: rogue
fabric: {topology: leaf_spine, leaves: 2, spines: 2, hosts_per_leaf: 2}
controller: {restart: true}
"""


@DATAPATHS
def test_a_rogue_local_client_can_neither_pose_as_a_switch_nor_take_the_port(state_dir,
                                                                              datapath):
    """A default fabric (no ``controller.tls`` given): a local client that speaks OpenFlow to
    the controller's port and claims a switch's datapath id gets no OpenFlow answer (it was
    greeted and taken for the switch over plain TCP); while the controller restarts its port
    stays the fabric's (it was free for anyone to bind); the new controller programs every
    switch again."""
    import socket
    import struct

    from testbed.fabric.fabric import Fabric
    from tests.integration.conftest import experiment

    with Fabric(experiment(DEFAULT, datapath), state_dir=state_dir) as fabric:
        ctl = fabric.controller
        assert ctl.channel == "tls", ctl.channel
        programmed = sorted(ctl.status()["programmed"])
        dpid = next(sw.dpid for sw in fabric.topo.switches if sw.name == "leaf1")
        hello = struct.pack("!BBHI", 6, 0, 8, 1)
        features = struct.pack("!BBHIQIBB2xII", 6, 6, 32, 2, dpid, 0, 254, 0, 0, 0)
        with socket.create_connection(ctl.address, timeout=5) as rogue:
            rogue.sendall(hello + features)
            try:
                answer = rogue.recv(64)
            except (ConnectionResetError, TimeoutError):
                answer = b""
        assert not answer.startswith(b"\x06"), answer  # no OpenFlow: a TLS alert or nothing
        assert sorted(ctl.status()["programmed"]) == programmed
        assert not ctl.status().get("errors")
        os.kill(ctl.process.pid, signal.SIGKILL)  # the controller dies; restart: true
        with socket.socket() as squatter:
            with pytest.raises(OSError) as err:
                squatter.bind(ctl.address)
            assert err.value.errno == 98  # EADDRINUSE: the fabric holds it through the restart
        wait_for(lambda: any(e["event"] == "restarted" for e in ctl.events), 60,
                 "the controller to be restarted")
        reach = fabric.reachability(count=1)
        assert reach.complete and reach.ok == reach.pairs == 12, reach.to_dict()


def test_the_unix_channel_programs_every_switch_and_only_root_can_open_it(state_dir,
                                                                           monkeypatch):
    """The channel of the machine's own Open vSwitch (kernel datapath, one SSL setting for all
    bridges): a unix socket of root's in its run directory. This machine's kernel has no such
    datapath, so a private vswitchd is pointed at one in its own run directory instead (the
    controller's side is the same)."""
    import stat

    from testbed.fabric.fabric import Fabric
    from testbed.fabric.switches import Switches
    from testbed.linux.files import make_dirs
    from tests.integration.conftest import experiment

    monkeypatch.setattr(Switches, "kernel_ovs", property(lambda self: True))
    # (a private vswitchd connects to a unix socket in its own run directory only)
    monkeypatch.setattr(Switches, "socket_dir",
                        property(lambda self: make_dirs(self.run.run_dir / "ovs0")))
    one_vswitchd = DEFAULT.replace("name: rogue", "name: rogue\nemulator: {vswitchd_instances: 1}")
    with Fabric(experiment(one_vswitchd, "ovs"), state_dir=state_dir) as fabric:
        ctl = fabric.controller
        assert ctl.channel == "unix" and ctl.pki is None
        path = ctl.socket_path
        assert stat.S_ISSOCK(path.stat().st_mode) and path.stat().st_mode & 0o777 == 0o600
        assert fabric.controller_address == f"unix:{path}"
        reach = fabric.reachability(count=1)
        assert reach.complete and reach.ok == reach.pairs == 12, reach.to_dict()
    assert not path.exists()
