"""Fabrics come up, forward on ECMP, survive a link failure, and go away cleanly."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from testbed.linux import capabilities, procfs
from testbed.errors import ConfigError, TestbedError
from testbed.fabric.fabric import Fabric
from testbed.poll import wait_for
from tests.integration.conftest import DATAPATHS, experiment, machine_state
from traffic.agents import iperf

K4 = "version: 1\nfabric: {topology: fat_tree, k: 4}\n"
LEAF_SPINE = ("version: 1\nfabric: {topology: leaf_spine, leaves: 3, spines: 2, "
              "hosts_per_leaf: 3}\n")


poll = wait_for


@pytest.mark.parametrize("text", [K4, LEAF_SPINE], ids=["fat_tree_k4", "leaf_spine"])
def test_all_pairs_reachable_with_zero_loss(make_fabric, text):
    fabric = make_fabric(experiment(text))
    result = fabric.reachability(count=3)
    assert result.complete, result.summary() + f" failed: {result.failed[:10]}"
    n = len(fabric.topo.hosts)
    assert result.pairs == n * (n - 1) and result.lost == 0
    status = fabric.controller_status()
    assert not status["port_mismatches"] and not status["errors"]
    # LLDP confirms every fabric link end is wired as the model says
    poll(lambda: fabric.controller_status()["wiring_verified"]
         == fabric.controller_status()["wiring_expected"], 20, "LLDP wiring check")
    assert not fabric.controller_status()["wiring_mismatches"]


def test_tcp_over_one_shaped_path_reaches_the_configured_rate(make_fabric):
    rate = 100
    fabric = make_fabric(experiment(
        f"version: 1\nfabric: {{topology: fat_tree, k: 4, host_link: {{rate_mbps: {rate}}}, "
        f"fabric_link: {{rate_mbps: {rate}}}}}\n"
        "emulator: {fidelity: warn}\n"))  # one flow: the full-load budget does not apply
    (mbps,) = iperf.run(fabric, iperf.plan([("h1_1_1", "h2_1_1")]), 5).values()  # cross-pod:
    # 5 switch hops, 6 shaped links
    print(f"iperf3 cross-pod: {mbps:.1f} Mbit/s of {rate}")
    assert 0.90 * rate <= mbps <= 1.02 * rate, f"{mbps:.1f} Mbit/s on a {rate} Mbit/s path"


def test_shaping_survives_on_every_link_end(make_fabric):
    fabric = make_fabric(experiment(LEAF_SPINE))
    ends = 0
    for link in fabric.topo.links:
        for end in (link.a, link.b):  # switch ports, and hosts' interfaces in their namespaces
            node = fabric.topo.nodes[end.node]
            pid = None if node.is_switch else fabric.hosts.pid(node.name)
            kinds = [q["kind"] for q in fabric.netlink.qdisc_stats(end.ifname, pid=pid)]
            # a host's NIC: the acknowledgements' pfifo beside the data's queue
            want = ["htb", "bfifo"] + ([] if node.is_switch else ["pfifo"])
            assert sorted(kinds) == sorted(want), f"{end.ifname}: {kinds}"
            ends += 1
    assert ends == 2 * len(fabric.topo.links)


@pytest.mark.parametrize("routing,ends", [("ecmp", ("edge1_1", "agg1_1")),
                                          ("spray", ("agg1_1", "core1"))])
def test_link_down_is_routed_around_and_restored(make_fabric, routing, ends):
    # spray: the re-weighted groups (dp_hash, bucket weights) must be accepted by the switches
    # (an OpenFlow error reply fails the test in make_fabric's post-mortem)
    fabric = make_fabric(experiment(K4 + f"controller: {{routing: {routing}}}\n"))
    link = fabric.set_link(*ends, up=False)
    poll(lambda: link.name in fabric.controller_status().get("links_down", []), 10,
         "controller to see the link down")
    poll(lambda: set(fabric.controller_status()["programmed"]) >= set(ends), 10,
         "the rerouting to be acknowledged")
    result = fabric.reachability(count=3)
    assert result.complete, result.summary() + f" failed: {result.failed[:10]}"
    # the failure is a cut (the eBPF program at both ends' egress) its switches were told of
    # (a BFD session that is down); the repair removes both
    switch_ends = [e for e in fabric.link_ends(link) if e.switch]
    assert all(_egress_filters(e.ifname) == ["link_cut"] for e in switch_ends)
    assert all(_bfd(e) == {"enable": "true"} for e in switch_ends)
    fabric.set_link(*ends, up=True)
    assert all(_egress_filters(e.ifname) == [] and _bfd(e) == {} for e in switch_ends)
    poll(lambda: not fabric.controller_status().get("links_down"), 10, "link back up")
    assert fabric.reachability(count=2).complete


def _egress_filters(ifname: str) -> list[str]:
    """The names of the BPF programs at a root-namespace interface's egress."""
    out = subprocess.run(["tc", "filter", "show", "dev", ifname, "egress"], capture_output=True,
                         text=True, check=True).stdout
    return [words[words.index("name") + 1] for words in map(str.split, out.splitlines())
            if "name" in words]


def _bfd(end) -> dict:
    from testbed.linux import ovs

    doc = json.loads(ovs.vsctl("--format=json", "--columns=bfd", "list", "Interface", end.ifname,
                               db=end.db))
    return dict(doc["data"][0][0][1])


def test_missing_netem_fails_before_building_anything(state_dir, tmp_path):
    exp = experiment("version: 1\nfabric: {topology: fat_tree, k: 4, "
                     "host_link: {delay_us: 100}}\n")
    fabric = Fabric(exp, state_dir=state_dir)
    caps_netem = None
    try:
        with fabric:
            caps_netem = fabric.caps.has_qdisc("netem")
    except ConfigError as err:
        assert err.path == "fabric.host_link.delay_us"
        assert "netem" in err.message and "sch_netem" in err.message
        return
    assert caps_netem, "built a fabric with delay_us although netem is missing"


def test_an_overloaded_fabric_is_refused_with_the_numbers(state_dir):
    if capabilities.probe(state_dir).datapath_type != "netdev":
        pytest.skip("the budget applies to the userspace datapath")
    exp = experiment("version: 1\nfabric: {topology: fat_tree, k: 4, "
                     "host_link: {rate_mbps: 400}, fabric_link: {rate_mbps: 400}}\n")
    fabric = Fabric(exp, state_dir=state_dir)
    with pytest.raises(ConfigError) as err, fabric:
        pass
    assert err.value.path == "fabric.host_link.rate_mbps"
    assert "16 hosts x 400 Mbit/s x 4.47 switch hops" in err.value.message
    assert "emulator.fidelity: warn" in err.value.message
    assert fabric.record is None  # refused before anything was built



def test_a_failure_in_the_middle_of_up_leaves_nothing_behind(state_dir, monkeypatch):
    before = machine_state()
    exp = experiment(LEAF_SPINE)
    fabric = Fabric(exp, state_dir=state_dir)

    def broken_switches() -> None:
        raise TestbedError("switches failed on purpose")

    monkeypatch.setattr(fabric, "_create_switches", broken_switches)
    with pytest.raises(TestbedError, match="on purpose"), fabric:
        pass
    # controller, hosts and links existed; all are gone, and so is the run record
    assert fabric.timings.get("links", 0) > 0 and fabric.record is None
    assert not list((state_dir / "runs").glob("*.json"))
    assert machine_state() == before


def test_fabric_services_live_and_die_with_the_fabric(make_fabric):
    fabric = make_fabric(experiment(LEAF_SPINE))
    host = fabric.spawn("h1_1", ["sleep", "600"], "test:sleep-in-host")
    root = fabric.spawn(None, [sys.executable, "-c", "import time; time.sleep(600)"],
                        "test:sleep-here", stdout=subprocess.DEVNULL)
    ticks = []

    def ticker(stop) -> None:
        while not stop.wait(0.05):
            ticks.append(1)

    fabric.start_thread(ticker, "test:thread")
    roles = {p.role for p in fabric.record.processes}
    assert {"test:sleep-in-host", "test:sleep-here", "controller"} <= roles
    assert fabric.stop(host) is not None and host.returncode != 0  # ended by SIGTERM
    assert "test:sleep-in-host" not in {p.role for p in fabric.record.processes}
    poll(lambda: ticks, 5, "the service thread to run")

    def broken(stop) -> None:
        raise ValueError("a service bug")

    fabric.start_thread(broken, "test:broken").join(5)
    assert fabric.service_errors == ["test:broken: ValueError: a service bug"]
    fabric.down()  # ends what is left: the root-namespace process and the thread
    assert root.returncode is not None
    assert not fabric.run._threads


@DATAPATHS
def test_fabriclab_fail_and_restore_act_on_the_running_fabric(state_dir, tmp_path, datapath):
    """``fabriclab up`` in one process, ``fabriclab fail`` / ``restore`` from another (on the
    eBPF datapath: the port not live in the pinned maps at once, the carrier's loss told to
    the controller by the switches' agent)."""
    import json
    import signal
    from pathlib import Path

    from testbed.runs.registry import Registry
    from tests.integration.conftest import ROOT
    from testbed.model.builders import fat_tree

    exp = tmp_path / "up.yaml"
    exp.write_text(K4 + f"emulator: {{datapath: {datapath}}}\n")
    cli = [sys.executable, "-m", "fabriclab.cli", "--state-dir", str(state_dir)]
    up = subprocess.Popen(cli + ["up", str(exp)], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        def status() -> dict:
            runs = [r for r in Registry(state_dir).runs() if r.owner_pid == up.pid]
            path = Path(runs[0].run_dir) / "controller-status.json" if runs else None
            try:
                return json.loads(path.read_text()) if path else {}
            except (OSError, ValueError):
                return {}

        switches = len(fat_tree(4).switches)
        poll(lambda: len(status().get("programmed", [])) == switches, 120, "the fabric up")
        name = fat_tree(4).find_link("agg1_1", "core1").name
        out = subprocess.run(cli + ["fail", "agg1_1", "core1"], capture_output=True, text=True,
                             cwd=ROOT, timeout=60)
        assert out.returncode == 0 and "link agg1_1-core1 down" in out.stdout, out
        poll(lambda: name in status().get("links_down", []), 10, "the controller to see it")
        out = subprocess.run(cli + ["restore", "agg1_1", "core1"], capture_output=True,
                             text=True, cwd=ROOT, timeout=60)
        assert out.returncode == 0, out
        poll(lambda: not status().get("links_down"), 10, "the link back up")
        bad = subprocess.run(cli + ["fail", "agg1_1", "core9"], capture_output=True, text=True,
                             cwd=ROOT, timeout=60)
        assert bad.returncode != 0 and "core9" in bad.stdout + bad.stderr
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(timeout=120)


def test_a_fabric_reused_under_a_new_controller_keeps_the_datapath_it_was_built_on(
        make_fabric):
    """``emulator.datapath: auto`` is resolved when the fabric comes up; the next experiment
    on the same fabric (a sweep's next cell) says ``auto`` again, and the fabric must go on
    knowing what it built (the prediction on the paths as hashed, the vswitchd list and the
    probes depend on it)."""
    fabric = make_fabric(experiment(LEAF_SPINE, datapath="auto"))
    built = fabric.datapath_type
    assert built in ("ebpf", "netdev", "system") and fabric.spec.emulator.datapath != "auto"
    fabric.restart_controller(experiment(LEAF_SPINE + "controller: {routing: dmodk}\n",
                                         datapath="auto"))
    assert fabric.datapath_type == built
    assert str(fabric.spec.controller.routing) == "dmodk"
    assert fabric.reachability(count=1).lost == 0


def test_hosts_get_the_receive_buffer_limit_and_ecn_the_file_asks_for(make_fabric):
    machine = procfs.read_sysctl("net.ipv4.tcp_rmem")
    fabric = make_fabric(experiment(
        "version: 1\nfabric: {topology: leaf_spine, leaves: 2, spines: 1, hosts_per_leaf: 2,"
        " hosts: {ecn: true, tcp_rmem_max_kb: 256}}\n"))
    low, default, _max = (int(v) for v in machine.split())
    want = [str(min(low, 262144)), str(min(default, 262144)), "262144"]  # the machine's first two
    for host in fabric.topo.hosts:
        node = fabric.hosts.node(host.name)
        rmem = node.cmd("sysctl -n net.ipv4.tcp_rmem").split()
        assert rmem == want, f"{host.name}: tcp_rmem {rmem}"
        assert node.cmd("sysctl -n net.ipv4.tcp_ecn").strip() == "1", host.name
    assert procfs.read_sysctl("net.ipv4.tcp_rmem") == machine  # the machine's own: untouched
