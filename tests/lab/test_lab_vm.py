"""The lab VM, for real: `vagrant up` with vagrant-libvirt and the local box on this machine's
plain-QEMU libvirt (daemons started by hand, no libvirt network, forwards on 127.0.0.1),
provisioned by scripts/setup.sh and scripts/lab-telemetry.sh; then the quickstart fabric inside
it on the kernel datapath, its Prometheus queried from the host through the forward, Grafana's
provisioning checked, and the VM destroyed and brought up again. The faults' messages first.

Timings go to the test's output (``-s``) and to ``$FABRICLAB_LAB_TIMINGS`` when set.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from telemetry.model import promconfig
from testbed.errors import TestbedError
from testbed.vm import labvm

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = "experiments/quickstart.yaml"
pytestmark = [pytest.mark.lab,
              pytest.mark.skipif(os.geteuid() != 0, reason="the lab test needs root")]
TIMINGS: dict[str, float] = {}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _report(name: str, seconds: float) -> None:
    TIMINGS[name] = round(seconds, 1)
    print(f"[lab] {name}: {seconds:.1f} s")
    if os.environ.get("FABRICLAB_LAB_TIMINGS"):
        Path(os.environ["FABRICLAB_LAB_TIMINGS"]).write_text(json.dumps(TIMINGS, indent=1))


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """Packages, the cached box, libvirt's daemons and Vagrant with free host ports; the VM is
    destroyed and the daemons (when started here) stopped afterwards, nothing left defined."""
    start = time.monotonic()
    labvm.install_packages(print)
    _report("packages", time.monotonic() - start)
    start = time.monotonic()
    box = labvm.ensure_box(log=print)
    _report("box (built or cached)", time.monotonic() - start)
    work = tmp_path_factory.mktemp("lab")
    ports = {"ssh": _free_port(), "grafana": _free_port(), "prometheus": _free_port()}
    with labvm.LibvirtDaemons() as daemons:
        domains_before = set(daemons.domains())
        vagrant = labvm.Vagrant(work / "dot", ports)
        start = time.monotonic()
        vagrant.add_box(box)
        _report("box add", time.monotonic() - start)
        try:
            yield vagrant, daemons
        finally:
            vagrant.run("destroy", "-f", timeout_s=300, check=False)
            assert set(daemons.domains()) == domains_before, "a domain was left defined"


def test_bad_settings_and_faults_each_give_one_clear_message(lab, tmp_path):
    vagrant, _ = lab

    def refused(*args: str, **env: str) -> str:
        proc = vagrant.run(*args, timeout_s=120, check=False, env=env)
        assert proc.returncode != 0, proc.stdout
        lines = [l for l in (proc.stdout + proc.stderr).splitlines() if l.strip()]
        assert len(lines) == 1, lines  # one message, no stack trace
        return lines[0]

    assert "FABRICLAB_VM_MEMORY=512 MiB is too little" in refused(
        "up", FABRICLAB_VM_MEMORY="512")
    assert "this host has only" in refused("up", FABRICLAB_VM_MEMORY=str(10 ** 7))
    assert "FABRICLAB_VM_CPUS=\"two\" is not a whole number" in refused(
        "up", FABRICLAB_VM_CPUS="two")
    assert "VirtualBox is not installed" in refused("up", "--provider", "virtualbox")
    assert "FABRICLAB_VM_BOOT_TIMEOUT=0: must be 1 second or more" in refused(
        "up", FABRICLAB_VM_BOOT_TIMEOUT="0")
    assert "FABRICLAB_VM_CA_CERTS: /nonexistent.crt is not a readable file" in refused(
        "up", FABRICLAB_VM_CA_CERTS="/nonexistent.crt")
    message = refused("up", VAGRANT_HOME=str(tmp_path / "empty-home"))
    assert "box fabriclab/bookworm-local is not added" in message
    assert "scripts/build-box.sh" in message
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        message = refused("up", FABRICLAB_VM_GRAFANA_PORT=str(port))
    assert f"127.0.0.1:{port} (Grafana) is not free" in message
    assert "FABRICLAB_VM_GRAFANA_PORT" in message


def _prometheus_api(port: int, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/{path}", timeout=10) as resp:
        doc = json.load(resp)
    assert doc["status"] == "success", doc
    return doc["data"]


def _prometheus(port: int, expr: str) -> list[dict]:
    return _prometheus_api(port, "query?" + urllib.parse.urlencode({"query": expr}))["result"]


def _targets(port: int) -> list[dict]:
    """Each active target of the Prometheus on ``port``: job, health, last error, last scrape's
    duration."""
    return [{"job": t["labels"].get("job"), "health": t["health"], "error": t["lastError"],
             "duration_s": t["lastScrapeDuration"]}
            for t in _prometheus_api(port, "targets?state=active")["activeTargets"]]


def _poll(predicate, timeout_s: float, what: str, every_s: float = 3.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def test_vagrant_up_gives_a_ready_lab(lab):
    """Long: one ``vagrant up`` (minutes under emulation) checked end to end: provisioning, the
    services, a fabric, its telemetry, Grafana; splitting it would boot the VM once per part."""
    vagrant, daemons = lab
    start = time.monotonic()
    out = vagrant.up(timeout_s=3600)
    _report("vagrant up with provisioning", time.monotonic() - start)
    # the next steps, printed at the end
    assert "vagrant ssh" in out
    assert "fabriclab run experiments/quickstart.yaml --out runs/quickstart --telemetry --keep" \
        in out
    assert f"http://127.0.0.1:{vagrant.ports['grafana']}" in out
    assert "Open vSwitch kernel datapath" in out
    assert "fabriclab lab VM is ready" in out
    # the standing Prometheus scrapes as often as this VM's CPU allows (an emulated one: 5 s)
    said = re.search(r"scrapes every fabric that is up in the VM, every (\d+)s\)", out)
    assert said, out[-1500:]
    config = yaml.safe_load(_prometheus_api(vagrant.ports["prometheus"], "status/config")["yaml"])
    assert promconfig.scrape_interval_of(config) == int(said.group(1)), config["global"]
    assert daemons.domains(), "no libvirt domain runs the VM"
    # the guest's console is on the host (what a boot that times out shows), its entropy comes
    # from the host's through virtio-rng, and its first boot made only the fast host keys
    assert "fabriclab-lab login:" in labvm.console_tail(vagrant.console_log, lines=400)
    assert vagrant.ssh("cat /sys/class/misc/hw_random/rng_current").stdout.startswith("virtio")
    assert vagrant.ssh("ls /etc/ssh/ | grep '^ssh_host_.*_key$'").stdout.split() == [
        "ssh_host_ecdsa_key", "ssh_host_ed25519_key"]
    # every forward listens on the host's loopback only, and no libvirt network is active
    # (Debian defines one, "default", which is never started here)
    for name, port in vagrant.ports.items():
        listening = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True,
                                   text=True, check=True).stdout.split()
        assert listening[3] == f"127.0.0.1:{port}", (name, listening)
    assert daemons.virsh("net-list", "--name").split() == []

    # Grafana's provisioning is in place whether or not Grafana could be installed
    ours = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in (ROOT / "telemetry" / "grafana" / "dashboards").glob("*.json")}
    theirs = dict(reversed(line.split()) for line in vagrant.ssh(
        "cd /var/lib/grafana/dashboards/fabriclab && sha256sum *.json").stdout.splitlines())
    assert theirs == ours
    for kind in ("datasources", "dashboards"):
        assert vagrant.ssh(f"cat /etc/grafana/provisioning/{kind}/fabriclab.yaml").stdout == (
            ROOT / "telemetry" / "grafana" / "provisioning" / kind / "fabriclab.yaml").read_text()
    status = vagrant.ssh("cat /var/lib/fabriclab/lab-status").stdout.strip()
    if status == "grafana=unreachable":  # this machine: the VM reaches only package registries
        assert "Grafana:    not installed: this VM reaches neither" in out
    else:
        with urllib.request.urlopen(
                f"http://127.0.0.1:{vagrant.ports['grafana']}/api/health", timeout=10) as resp:
            assert json.load(resp)["database"] == "ok"
        # its admin is not admin/admin: the VM's own password (root's file) is
        import base64
        import urllib.error

        def admin(password: str) -> int:
            auth = base64.b64encode(f"admin:{password}".encode()).decode()
            request = urllib.request.Request(
                f"http://127.0.0.1:{vagrant.ports['grafana']}/api/admin/settings",
                headers={"Authorization": f"Basic {auth}"})
            try:
                with urllib.request.urlopen(request, timeout=10) as resp:
                    return resp.status
            except urllib.error.HTTPError as err:
                return err.code

        assert admin("admin") == 401
        secret = vagrant.ssh("sudo cat /etc/fabriclab/grafana-admin-password").stdout.strip()
        assert admin(secret) == 200

    # the quickstart fabric inside, on the kernel datapath
    start = time.monotonic()
    proc = vagrant.ssh(f"cd /vagrant && sudo .venv/bin/fabriclab up --check --json {QUICKSTART}",
                       timeout_s=1200, check=False)
    _report("quickstart up --check in the VM", time.monotonic() - start)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["datapath"] == "system", doc
    assert doc["reachability"]["reachable_s"] is not None

    # the VM's standing Prometheus scrapes a fabric that is up, seen from the host
    start = time.monotonic()
    vagrant.ssh(f"cd /vagrant && sudo sh -c 'nohup .venv/bin/fabriclab up {QUICKSTART} "
                "> /tmp/lab-up.log 2>&1 & echo $! > /tmp/lab-up.pid'")
    try:
        _poll(lambda: "fabric is up" in vagrant.ssh("cat /tmp/lab-up.log").stdout, 900,
              "the quickstart fabric to come up in the VM", every_s=5)
        port = vagrant.ports["prometheus"]

        def scraped() -> bool:
            up = {s["metric"]["job"]: s["value"][1] for s in _prometheus(port, "up")}
            return up.get("fabric") == "1" and up.get("controller") == "1"
        try:
            _poll(scraped, 120, "the VM's Prometheus to scrape the fabric and the controller")
        except AssertionError as exc:  # what Prometheus says of each target, and the VM's load
            raise AssertionError(f"{exc}; targets: {_targets(port)}; VM: " + vagrant.ssh(
                "uptime; ls -l /var/lib/fabriclab/prometheus-sd", check=False).stdout) from None
        _report("a fabric up in the VM, scraped through the forward", time.monotonic() - start)
        for target in _targets(port):
            _report(f"scrape of the {target['job']} exporter in the VM", target["duration_s"])
        ports = _prometheus(port, "count(fabriclab_port_transmit_bytes_total)")
        assert int(ports[0]["value"][1]) >= 48  # k=4: 16 host ports, 32 x 2 fabric ports
    finally:
        vagrant.ssh("sudo kill -TERM $(cat /tmp/lab-up.pid)", check=False)
        _poll(lambda: vagrant.ssh("sudo kill -0 $(cat /tmp/lab-up.pid)",
                                  check=False).returncode != 0, 300,
              "the fabric in the VM to tear down", every_s=5)
    assert "torn down" in vagrant.ssh("cat /tmp/lab-up.log").stdout
    clean = json.loads(vagrant.ssh("sudo /vagrant/.venv/bin/fabriclab clean --json").stdout)
    assert clean["runs"] == [] and clean["processes"] == 0, clean
    assert vagrant.ssh("ls /var/lib/fabriclab/prometheus-sd").stdout.strip() == ""


def test_destroy_and_a_second_up_work(lab):
    vagrant, daemons = lab
    start = time.monotonic()
    vagrant.destroy()
    _report("vagrant destroy", time.monotonic() - start)
    assert not daemons.domains()
    start = time.monotonic()
    vagrant.up("--no-provision", timeout_s=1800)
    _report("vagrant up again (no provisioning)", time.monotonic() - start)
    assert vagrant.ssh("lsmod | grep -c '^openvswitch' || sudo modprobe -v openvswitch",
                       check=False).returncode == 0
    vagrant.destroy()
    assert not daemons.domains()


def test_a_boot_that_times_out_names_what_the_guest_was_doing(lab):
    """SSH cannot answer 10 s into an emulated boot (sshd starts 25-30 s in, after the
    kernel's 10 s): the error carries the console's last lines, the kernel's by then, and
    Vagrant removes the half-booted VM."""
    vagrant, daemons = lab
    with pytest.raises(TestbedError) as err:
        vagrant.up("--no-provision", timeout_s=900, env={"FABRICLAB_VM_BOOT_TIMEOUT": "10"})
    text = str(err.value)
    assert "Timed out while waiting for the machine to boot" in text
    console = text.split("the guest's console, last lines:", 1)[1]
    assert re.search(r"^\[\s*\d+\.\d+\] ", console, re.MULTILINE), console  # the kernel's
    assert not daemons.domains()
