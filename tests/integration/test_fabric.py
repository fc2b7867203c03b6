"""Fabrics come up, forward on ECMP, survive a link failure, and go away cleanly."""

from __future__ import annotations

import json
import time

import pytest

from testbed.errors import ConfigError
from testbed.fabric import Fabric
from tests.integration.conftest import experiment

K4 = "version: 1\nfabric: {topology: fat_tree, k: 4}\n"
LEAF_SPINE = ("version: 1\nfabric: {topology: leaf_spine, leaves: 3, spines: 2, "
              "hosts_per_leaf: 3}\n")


def poll(predicate, timeout_s: float, what: str, interval_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


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


def _iperf3(fabric: Fabric, server: str, client: str, seconds: int = 5) -> float:
    """Mbit/s received by ``server`` from one TCP flow sent by ``client``."""
    port = 5201
    srv = fabric.hosts.popen(server, ["iperf3", "-s", "-1", "-p", str(port)])
    try:
        poll(lambda: fabric.hosts.popen(server, ["ss", "-Hltn", f"sport = :{port}"])
             .communicate()[0].strip(), 10, "iperf3 server to listen")
        cli = fabric.hosts.popen(client, ["iperf3", "-c", fabric.topo.nodes[server].ip, "-p",
                                          str(port), "-t", str(seconds), "-J"])
        out, err = cli.communicate(timeout=seconds + 30)
        assert cli.returncode == 0, f"iperf3 client failed: {out[-500:]} {err[-500:]}"
        return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e6
    finally:
        srv.kill()
        srv.wait()


def test_tcp_over_one_shaped_path_reaches_the_configured_rate(make_fabric):
    rate = 100
    fabric = make_fabric(experiment(
        f"version: 1\nfabric: {{topology: fat_tree, k: 4, host_link: {{rate_mbps: {rate}}}, "
        f"fabric_link: {{rate_mbps: {rate}}}}}\n"
        "emulator: {fidelity: warn}\n"))  # one flow: the full-load budget does not apply
    mbps = _iperf3(fabric, "h2_1_1", "h1_1_1")  # cross-pod: 5 switch hops, 6 shaped links
    print(f"iperf3 cross-pod: {mbps:.1f} Mbit/s of {rate}")
    assert 0.90 * rate <= mbps <= 1.02 * rate, f"{mbps:.1f} Mbit/s on a {rate} Mbit/s path"


def test_shaping_survives_on_every_switch_port(make_fabric):
    fabric = make_fabric(experiment(LEAF_SPINE))
    for link in fabric.topo.links:
        end = link.b  # the switch end
        kinds = [q["kind"] for q in fabric.netlink.qdisc_stats(end.ifname)]
        assert kinds == ["htb", "bfifo"], f"{end.ifname}: {kinds}"


def test_link_down_is_routed_around_and_restored(make_fabric):
    fabric = make_fabric(experiment(K4))
    link = fabric.set_link("edge1_1", "agg1_1", up=False)
    poll(lambda: link.name in fabric.controller_status().get("links_down", []), 10,
         "controller to see the link down")
    poll(lambda: set(fabric.controller_status()["programmed"]) >= {"edge1_1", "agg1_1"}, 10,
         "the rerouting to be acknowledged")
    result = fabric.reachability(count=3)
    assert result.complete, result.summary() + f" failed: {result.failed[:10]}"
    fabric.set_link("edge1_1", "agg1_1", up=True)
    poll(lambda: not fabric.controller_status().get("links_down"), 10, "link back up")
    assert fabric.reachability(count=2).complete


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
    exp = experiment("version: 1\nfabric: {topology: fat_tree, k: 4, "
                     "host_link: {rate_mbps: 400}, fabric_link: {rate_mbps: 400}}\n")
    fabric = Fabric(exp, state_dir=state_dir)
    with pytest.raises(ConfigError) as err, fabric:
        pass
    if fabric.caps.datapath_type != "netdev":
        pytest.skip("the budget applies to the userspace datapath")
    assert err.value.path == "fabric.host_link.rate_mbps"
    assert "16 hosts x 400 Mbit/s x 4.47 switch hops" in err.value.message
    assert "emulator.fidelity: warn" in err.value.message
    assert fabric.record is None  # refused before anything was built

