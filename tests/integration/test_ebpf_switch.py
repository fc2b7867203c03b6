"""The eBPF switch (testbed/linux/progs/switch.c): hosts in network namespaces joined by a
switch that is only a tc program on its ports and its maps. Its flow table, compiled into
tuple-space subtables, forwards each host's traffic to the right port; a fast-failover group
moves to its next live port the moment a port is marked dead; a table without a matching entry
drops. And fabriclab's own controller programs such switches over OpenFlow."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from controllers.routing.tables import FlowEntry
from testbed.linux.ebpfswitch import EbpfSwitches
from testbed.linux.netlink import Netlink
from testbed.model.builders import leaf_spine
from testbed.plan import tss
from testbed.poll import wait_for
from testbed.switch.agent import SwitchAgent, SwitchSpec
from testbed.openflow.session import Port
from tests.integration.ebpfstar import RATE_BYTES_S, route, send_udp, sh, star  # noqa: F401


def _ping(tag: str, src: int, dst: int) -> bool:
    return sh("ip", "netns", "exec", f"{tag}h{src}", "fping", "-q", "-c", "2", "-p", "200",
               "-t", "1000", f"10.77.0.{dst}", check=False).returncode == 0


def test_an_ebpf_switch_forwards_by_its_flow_table_and_groups(star):
    tag, switches = star
    # h1 and h2 by their ports; h3 through a fast-failover group (port 3, then port 2)
    table = [route(1, (("output", 1),)), route(2, (("output", 2),)),
             route(3, (("group", 5),)),
             FlowEntry(0, (), ())]  # table miss: drop
    switches.set_group(7, 5, "ff", [3, 2])
    switches.set_table(7, tss.compile_table(table))
    assert _ping(tag, 1, 2) and _ping(tag, 2, 1) and _ping(tag, 1, 3)
    # port 3 dead: the group's next live port is h2's, whose stack does not answer for .3
    switches.set_live(7, 3, False)
    assert not _ping(tag, 1, 3)
    switches.set_live(7, 3, True)
    assert _ping(tag, 1, 3)
    # a SELECT group with one live bucket carries everything; with none, nothing
    switches.set_group(7, 5, "select", [3, 2], [1, 0])
    assert _ping(tag, 1, 3)
    # what is still sent towards a port that is not live is counted there (a failed link's
    # traffic that no group could move): a group with no live bucket counts at its first
    switches.set_group(7, 6, "select", [3])
    switches.set_table(7, tss.compile_table([route(3, (("group", 6),)),
                                             route(2, (("output", 3),)),
                                             FlowEntry(0, (), ())]))
    switches.set_live(7, 3, False)
    before = switches.dead_drops(7, 3)
    send_udp(tag, 1, 3, 5)
    send_udp(tag, 1, 2, 4)
    assert switches.dead_drops(7, 3) - before == 9
    switches.set_live(7, 3, True)
    switches.set_table(7, tss.compile_table(table))
    # without an entry for h2 the table-miss entry drops it
    switches.set_table(7, tss.compile_table([route(1, (("output", 1),)),
                                             FlowEntry(0, (), ())]))
    assert not _ping(tag, 1, 2)



@contextmanager
def _hosts_and_links(topo, tag: str):
    """The topology's hosts as namespaces (addresses, static neighbours) and its links as
    veths, switch ends in this namespace, named as the model names them; removed after."""
    hosts = {h.name: f"{tag}{h.name}" for h in topo.hosts}
    made = []
    try:
        for ns in hosts.values():
            sh("ip", "netns", "add", ns)
        for link in topo.links:
            sh("ip", "link", "add", link.b.ifname, "type", "veth", "peer", "name",
                link.a.ifname)
            made.append(link.b.ifname)
            for end in (link.a, link.b):
                if end.node not in hosts:
                    sh("ip", "link", "set", end.ifname, "up")
                    continue
                h, ns = topo.nodes[end.node], hosts[end.node]
                sh("ip", "link", "set", end.ifname, "netns", ns)
                sh("ip", "-n", ns, "link", "set", end.ifname, "address", h.mac)
                sh("ip", "-n", ns, "addr", "add", f"{h.ip}/8", "dev", end.ifname)
                sh("ip", "-n", ns, "link", "set", end.ifname, "up")
                for other in topo.hosts:
                    if other.name != end.node:
                        sh("ip", "-n", ns, "neigh", "replace", other.ip, "lladdr", other.mac,
                            "dev", end.ifname, "nud", "permanent")
        yield hosts
    finally:
        for link in made:
            sh("ip", "link", "del", link, check=False)
        for ns in hosts.values():
            sh("ip", "netns", "del", ns, check=False)


@contextmanager
def _controller(topo, tmp_path: Path):
    """fabriclab's controller (its launcher, ECMP) on a loopback port; yields (port, status
    file, process)."""
    (tmp_path / "topology.json").write_text(json.dumps(topo.to_dict()))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        of_port = probe.getsockname()[1]
    status = tmp_path / "status.json"
    with open(tmp_path / "controller.stderr", "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "controllers.launcher", "--topology",
             str(tmp_path / "topology.json"), "--status", str(status), "--port", str(of_port),
             "--host", "127.0.0.1", "--routing", "ecmp", "--ecmp-seed", "per_switch",
             "--ecmp-selection", "hash", "--spray-weights", "capacity",
             "--poll-interval-s", "1.0", "--log", str(tmp_path / "controller.log")],
            stdout=subprocess.DEVNULL, stderr=err)
    try:
        def listening() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", of_port), timeout=0.2):
                    return True
            except OSError:
                return False

        wait_for(listening, 30, "the controller to listen")
        yield of_port, status, proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_fabriclabs_controller_programs_ebpf_switches_over_openflow(tmp_path):
    """The same os-ken controller that programs Open vSwitch programs eBPF switches: a 2-leaf,
    1-spine fabric whose switches are the eBPF program and maps, their agent speaking OpenFlow
    1.5 to the controller; every switch reports programmed and the two hosts reach each other
    through leaf, spine and leaf."""
    topo = leaf_spine(2, 1, 1)
    tag = f"ebc{os.getpid() % 10000}"
    pins = Path(f"/sys/fs/bpf/fabriclab/{tag}")
    agent = switches = None
    with _hosts_and_links(topo, tag) as hosts, _controller(topo, tmp_path) as (port, status,
                                                                               proc):
        try:
            switches = EbpfSwitches(pins, tmp_path / "state")
            specs = {}
            with Netlink() as nl:
                for i, sw in enumerate(topo.switches, start=1):
                    ports = []
                    for number, link in sorted(topo.ports(sw.name).items()):
                        ifname = link.end(sw.name).ifname
                        switches.add_port(nl, i, number, ifname, RATE_BYTES_S)
                        ports.append(Port(number, ifname, f"02:00:00:00:{i:02x}:{number:02x}"))
                    specs[sw.name] = SwitchSpec(i, sw.dpid, ports)
            agent = SwitchAgent(switches, specs, ("127.0.0.1", port))
            agent.start()

            def programmed() -> bool:
                assert proc.poll() is None, (tmp_path / "controller.stderr").read_text()
                try:
                    doc = json.loads(status.read_text())
                except (OSError, ValueError):
                    return False
                assert not doc.get("errors"), doc["errors"]
                return set(doc.get("programmed", [])) == {s.name for s in topo.switches}

            wait_for(programmed, 30, "every eBPF switch to be programmed")
            assert not agent.errors, agent.errors
            ok = sh("ip", "netns", "exec", hosts["h1_1"], "fping", "-q", "-c", "3", "-p",
                     "100", "-t", "1000", topo.nodes["h2_1"].ip, check=False)
            assert ok.returncode == 0, ok.stdout + ok.stderr
        finally:
            if agent is not None:
                agent.stop()
            if switches is not None:
                switches.close()
            sh("rm", "-rf", str(pins), check=False)


def test_a_fat_tree_on_the_ebpf_datapath_is_built_programmed_and_reachable(tmp_path):
    """``emulator.datapath: ebpf``: ``fabriclab up --check`` builds a k=4 fat-tree whose 20
    switches are eBPF switches, the controller programs them over OpenFlow, every pair of the
    16 hosts reaches every other, and nothing is left after the teardown."""
    exp = tmp_path / "ebpf.yaml"
    exp.write_text("version: 1\nname: ebpf-k4\nfabric: {topology: fat_tree, k: 4, mtu: 9000}\n"
                   "emulator: {datapath: ebpf}\n")
    proc = subprocess.run([sys.executable, "-m", "fabriclab.cli", "--state-dir",
                           str(tmp_path / "state"), "up", "--check", str(exp), "--json"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["datapath"] == "ebpf" and doc["vswitchd_instances"] == 0
    reach = doc["reachability"]
    assert reach["pairs"] == 240 and reach["lost"] == 0, reach


def test_a_port_taken_down_is_announced_down_at_once():
    """The switches' agent hears of a port taken down (both ends of a veth lose their
    operational state) within milliseconds of ``ip link set down``: a failure's port status
    does not wait for the kernel's link watch."""
    from testbed.linux.rawnl import LinkEvents

    a, b = f"lev{os.getpid() % 10000}a", f"lev{os.getpid() % 10000}b"
    sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
    events = LinkEvents()
    try:
        for name in (a, b):
            sh("ip", "link", "set", name, "up")
        wait_for(lambda: (a, True) in events.changes(), 5, f"{a} up")
        events.changes()  # what came before is not what is tested
        sh("ip", "link", "set", a, "down")
        started = time.monotonic()
        seen: list = []
        wait_for(lambda: seen.extend(events.changes()) or (a, False) in seen, 5, f"{a} down")
        assert time.monotonic() - started < 0.05, seen  # the admin change's own message
        wait_for(lambda: seen.extend(events.changes()) or (b, False) in seen, 5, f"{b} down")
    finally:
        events.sock.close()
        sh("ip", "link", "del", a, check=False)
