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

import pytest

from controllers.routing.tables import FlowEntry
from testbed.linux.ebpfswitch import EbpfSwitches
from testbed.linux.netlink import Netlink
from testbed.model.builders import leaf_spine
from testbed.plan import tss
from testbed.poll import wait_for
from testbed.switch.agent import SwitchAgent, SwitchSpec
from testbed.openflow.session import Port

HOSTS = 3
RATE_BYTES_S = 125_000_000  # the ports' loads drain at 1 Gbit/s


def _sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=30)


@pytest.fixture
def star(tmp_path):
    """Three hosts on one eBPF switch: ns ``<tag>h<i>`` with 10.77.0.<i>/24, each behind root
    end ``<tag>p<i>`` (switch port i); yields (tag, switches)."""
    tag = f"ebs{os.getpid() % 10000}"
    made_ns, made_links = [], []
    pins = f"/sys/fs/bpf/fabriclab/{tag}"
    switches = None
    try:
        macs = {i: f"02:00:0a:4d:00:{i:02x}" for i in range(1, HOSTS + 1)}
        for i in range(1, HOSTS + 1):
            ns, root, peer = f"{tag}h{i}", f"{tag}p{i}", f"{tag}x{i}"
            _sh("ip", "netns", "add", ns)
            made_ns.append(ns)
            _sh("ip", "link", "add", root, "type", "veth", "peer", "name", peer)
            made_links.append(root)
            # the root end sends nothing of its own (IPv6 solicitations would count as tx)
            _sh("sysctl", "-qw", f"net.ipv6.conf.{root}.disable_ipv6=1")
            _sh("ip", "link", "set", peer, "netns", ns)
            _sh("ip", "-n", ns, "link", "set", peer, "address", macs[i], "name", "eth0")
            _sh("ip", "-n", ns, "addr", "add", f"10.77.0.{i}/24", "dev", "eth0")
            _sh("ip", "-n", ns, "link", "set", "eth0", "up")
            _sh("ip", "link", "set", root, "up")
        for i in range(1, HOSTS + 1):
            for j in range(1, HOSTS + 1):
                if i != j:
                    _sh("ip", "-n", f"{tag}h{i}", "neigh", "replace", f"10.77.0.{j}", "lladdr",
                        macs[j], "dev", "eth0", "nud", "permanent")
        switches = EbpfSwitches(Path(pins), tmp_path / "state")
        with Netlink() as nl:
            for i in range(1, HOSTS + 1):
                switches.add_port(nl, 7, i, f"{tag}p{i}", RATE_BYTES_S)
        yield tag, switches
    finally:
        if switches is not None:
            switches.close()
        for link in made_links:
            _sh("ip", "link", "del", link, check=False)
        for ns in made_ns:
            _sh("ip", "netns", "del", ns, check=False)
        _sh("rm", "-rf", pins, check=False)


def _ping(tag: str, src: int, dst: int) -> bool:
    return _sh("ip", "netns", "exec", f"{tag}h{src}", "fping", "-q", "-c", "2", "-p", "200",
               "-t", "1000", f"10.77.0.{dst}", check=False).returncode == 0


def _route(dst: int, actions) -> FlowEntry:
    return FlowEntry(200, (("eth_type", 0x0800), ("ipv4_dst", (f"10.77.0.{dst}",
                                                              "255.255.255.255"))), actions)


def test_an_ebpf_switch_forwards_by_its_flow_table_and_groups(star):
    tag, switches = star
    # h1 and h2 by their ports; h3 through a fast-failover group (port 3, then port 2)
    table = [_route(1, (("output", 1),)), _route(2, (("output", 2),)),
             _route(3, (("group", 5),)),
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
    switches.set_table(7, tss.compile_table([_route(3, (("group", 6),)),
                                             _route(2, (("output", 3),)),
                                             FlowEntry(0, (), ())]))
    switches.set_live(7, 3, False)
    before = switches.dead_drops(7, 3)
    _send_udp(tag, 1, 3, 5)
    _send_udp(tag, 1, 2, 4)
    assert switches.dead_drops(7, 3) - before == 9
    switches.set_live(7, 3, True)
    switches.set_table(7, tss.compile_table(table))
    # without an entry for h2 the table-miss entry drops it
    switches.set_table(7, tss.compile_table([_route(1, (("output", 1),)),
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
            _sh("ip", "netns", "add", ns)
        for link in topo.links:
            _sh("ip", "link", "add", link.b.ifname, "type", "veth", "peer", "name",
                link.a.ifname)
            made.append(link.b.ifname)
            for end in (link.a, link.b):
                if end.node not in hosts:
                    _sh("ip", "link", "set", end.ifname, "up")
                    continue
                h, ns = topo.nodes[end.node], hosts[end.node]
                _sh("ip", "link", "set", end.ifname, "netns", ns)
                _sh("ip", "-n", ns, "link", "set", end.ifname, "address", h.mac)
                _sh("ip", "-n", ns, "addr", "add", f"{h.ip}/8", "dev", end.ifname)
                _sh("ip", "-n", ns, "link", "set", end.ifname, "up")
                for other in topo.hosts:
                    if other.name != end.node:
                        _sh("ip", "-n", ns, "neigh", "replace", other.ip, "lladdr", other.mac,
                            "dev", end.ifname, "nud", "permanent")
        yield hosts
    finally:
        for link in made:
            _sh("ip", "link", "del", link, check=False)
        for ns in hosts.values():
            _sh("ip", "netns", "del", ns, check=False)


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
            ok = _sh("ip", "netns", "exec", hosts["h1_1"], "fping", "-q", "-c", "3", "-p",
                     "100", "-t", "1000", topo.nodes["h2_1"].ip, check=False)
            assert ok.returncode == 0, ok.stdout + ok.stderr
        finally:
            if agent is not None:
                agent.stop()
            if switches is not None:
                switches.close()
            _sh("rm", "-rf", str(pins), check=False)


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


def _tx(tag: str, port: int) -> int:
    return int(Path(f"/sys/class/net/{tag}p{port}/statistics/tx_packets").read_text())


def _send_udp(tag: str, src: int, dst: int, count: int, sport: int = 40000,
              gap_s: float = 0.0) -> None:
    """``count`` UDP datagrams of one flow from host ``src`` to ``dst``'s address."""
    code = ("import socket, time\n"
            "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            f"s.bind(('10.77.0.{src}', {sport}))\n"
            f"for _ in range({count}):\n"
            f"    s.sendto(b'x' * 100, ('10.77.0.{dst}', 9))\n"
            f"    time.sleep({gap_s})\n")
    _sh("ip", "netns", "exec", f"{tag}h{src}", sys.executable, "-c", code)


def _send_tcp(tag: str, src: int, dst: int, count: int, sport: int, dport: int,
              flags: int, gap_s: float = 0.01, payload: int = 0) -> None:
    """``count`` bare TCP segments (a raw socket: headers, ``flags`` as given, and
    ``payload`` bytes) of one flow from host ``src`` to ``dst``'s address: what the switch
    parses, no connection."""
    code = ("import socket, struct, time\n"
            "s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)\n"
            f"seg = struct.pack('!HHIIBBHHH', {sport}, {dport}, 1, 1, 5 << 4, {flags}, 1024,"
            f" 0, 0) + b'x' * {payload}\n"
            f"for _ in range({count}):\n"
            f"    s.sendto(seg, ('10.77.0.{dst}', 0))\n"
            f"    time.sleep({gap_s})\n")
    _sh("ip", "netns", "exec", f"{tag}h{src}", sys.executable, "-c", code)


def test_a_flowlet_leaves_the_port_its_acknowledgements_echoed_congestion_on(star):
    """A TCP flow's flowlet on idle ports: after a gap it keeps its port (the tie's); after an
    acknowledgement of it passed the switch with ECE set, its next flowlet takes the other
    port (testbed/plan/localroute.py's echo)."""
    from testbed.plan.localroute import ECHO_HOLD_GAPS

    tag, switches = star
    gap_s = 0.1
    switches.set_group(7, 8, "select", [2, 3], selection="flowlet", gap_us=int(gap_s * 1e6))
    switches.set_table(7, tss.compile_table([_route(3, (("group", 8),)),
                                             _route(1, (("output", 1),)), FlowEntry(0, (), ())]))

    def sent(count: int, flags: int = 0x10) -> dict[int, int]:
        before = {p: _tx(tag, p) for p in (2, 3)}
        _send_tcp(tag, 1, 3, count, 40002, 5201, flags, payload=100)  # data segments
        return {p: _tx(tag, p) - before[p] for p in (2, 3)}

    first = sent(3)
    port = max(first, key=first.get)
    assert first[port] >= 3 and first[5 - port] == 0, first
    time.sleep(gap_s * (ECHO_HOLD_GAPS + 1))  # a new flowlet, no echo: the same tie
    again = sent(3)
    assert again[port] >= 3 and again[5 - port] == 0, again
    time.sleep(gap_s * (ECHO_HOLD_GAPS + 1))  # past the hold after that choice
    # the receiver's acknowledgement with ECE, the other way through the switch
    _send_tcp(tag, 3, 1, 1, 5201, 40002, 0x10 | 0x40)
    time.sleep(gap_s * 1.5)
    moved = sent(3)
    assert moved[5 - port] >= 3 and moved[port] == 0, (port, moved)


def test_local_adaptive_selection_follows_the_reference(star):
    """The datapath's switch-local choice against testbed/plan/localroute.py: with one port's
    queue loaded, every packet (``packet``) or a new flowlet takes the other; a flowlet keeps
    its port while its packets come within the gap, and moves after a longer one."""
    from testbed.plan.localroute import PortLoad, least_loaded

    tag, switches = star
    busy = RATE_BYTES_S  # a second's worth of queue: busy for the whole test step
    table = [_route(3, (("group", 5),)), FlowEntry(0, (), ())]
    switches.set_table(7, tss.compile_table(table))

    def load(port_busy: int) -> None:
        now = time.monotonic_ns()
        for port in (2, 3):
            switches.set_port_load(7, port, RATE_BYTES_S, busy if port == port_busy else 0, now)

    def reference(port_busy: int) -> int:
        now = time.monotonic_ns()
        loads = {p: PortLoad(RATE_BYTES_S, busy if p == port_busy else 0, now) for p in (2, 3)}
        return least_loaded([2, 3], lambda p: True, lambda p: loads[p].delay_ns(now), h=0)

    def sent(count: int, **kw) -> dict[int, int]:
        before = {p: _tx(tag, p) for p in (2, 3)}
        _send_udp(tag, 1, 3, count, **kw)
        return {p: _tx(tag, p) - before[p] for p in (2, 3)}

    switches.set_group(7, 5, "select", [2, 3], selection="packet")
    for port_busy in (2, 3):
        load(port_busy)
        want = reference(port_busy)
        got = sent(20)
        assert got[want] >= 20 and got[5 - want] == 0, (port_busy, got)
    # a flowlet: placed by load, then kept while its packets come closer than the gap
    switches.set_group(7, 6, "select", [2, 3], selection="flowlet", gap_us=200_000)
    switches.set_table(7, tss.compile_table([_route(3, (("group", 6),)), FlowEntry(0, (), ())]))
    load(2)
    first = sent(5, sport=40001, gap_s=0.01)
    assert first[3] >= 5 and first[2] == 0, first
    load(3)  # the other port is now the less loaded: the flowlet stays (no gap yet)
    kept = sent(5, sport=40001, gap_s=0.01)
    assert kept[3] >= 5 and kept[2] == 0, kept
    time.sleep(0.3)  # longer than the gap: the next packet starts a new flowlet
    load(3)
    moved = sent(5, sport=40001, gap_s=0.01)
    assert moved[2] >= 5 and moved[3] == 0, moved
    state = switches.port_load(7, 2)
    assert state.rate_bytes_s == RATE_BYTES_S and state.level > 0  # its packets counted


def test_a_rebalancing_flowlet_leaves_a_busy_path_after_its_hold_as_the_reference(star):
    """Reactive rebalancing (at a chance of 100 %): a flowlet on a port whose rate estimate
    says another flow fills it stays there while held (a gap since its choice), and moves to
    the idle port at its first packet past the hold, before any gap, as
    testbed/plan/localroute.py's rebalanced() decides; its bytes move with it."""
    from testbed.plan.localroute import RECENT_BYTES, rebalanced

    tag, switches = star
    gap_s, rate = 3.0, 256 * 1024  # a slow port: its rate window a second long
    switches.set_group(7, 9, "select", [2, 3], selection="flowlet", gap_us=int(gap_s * 1e6),
                       rebalance=(25, 100))
    switches.set_table(7, tss.compile_table([_route(3, (("group", 9),)), FlowEntry(0, (), ())]))
    window_ns = RECENT_BYTES * 1_000_000_000 // rate

    def fill(port: int) -> None:  # another flow's worth of bytes lately, as of now
        switches.set_port_load(7, port, rate, last_ns=time.monotonic_ns(),
                               recent=RECENT_BYTES)

    def sent(count: int = 1) -> dict[int, int]:
        before = {p: _tx(tag, p) for p in (2, 3)}
        _send_udp(tag, 1, 3, count, sport=40009)
        return {p: _tx(tag, p) - before[p] for p in (2, 3)}

    switches.set_port_load(7, 3, rate, rate, time.monotonic_ns())  # queued
    switches.set_port_load(7, 2, rate)
    first = sent()
    assert first[2] == 1 and first[3] == 0, first  # placed by the queues: port 2
    switches.set_port_load(7, 3, rate)
    time.sleep(0.5)
    fill(2)
    held = sent()
    assert held[2] == 1 and held[3] == 0, held  # held: no move within a gap of its choice
    time.sleep(gap_s - 0.3)  # past the hold, within the gap
    fill(2)
    # the reference: its path full, its own bytes a datagram's, the other idle: it moves
    assert rebalanced(cur_ns=window_ns, mine_ns=300 * 1_000_000_000 // rate,
                      best_ns=0, delta_ns=window_ns // 4)
    moved = sent()
    assert moved[3] == 1 and moved[2] == 0, moved
    state = {p: switches.port_load(7, p).recent for p in (2, 3)}
    assert state[3] >= 142, state  # its bytes went with it (and its next datagram's)
    kept = sent(3)  # held again from the move
    assert kept[3] == 3 and kept[2] == 0, kept


def test_a_choice_weighing_the_next_switch_follows_the_reference(star):
    """``packet_next``: each port weighed by the longest of its queue, what is left of the path
    quality the next switch's group published and the queue of the link every way on takes
    (here groups and ports of a switch 9 whose qualities and loads alone exist): the packets
    go where the reference's path is the less loaded, whichever part makes it; the group
    publishes the least it found as its own quality."""
    from testbed.plan.localroute import (
        PortLoad,
        beyond_ns,
        bucket_delay,
        least_loaded,
        path_quality,
    )

    tag, switches = star
    ahead = {2: (9, 1, 9, 5), 3: (9, 2, 9, 6)}  # (switch, group, link's switch, its port)
    second = 1_000_000_000
    switches.set_group(7, 5, "select", [2, 3], selection="packet_next",
                       beyond=[ahead[2], ahead[3]])
    switches.set_table(7, tss.compile_table([_route(3, (("group", 5),)), FlowEntry(0, (), ())]))
    half = RATE_BYTES_S // 2
    cases = (({2: 0, 3: 0, 5: 0, 6: 0}, {1: second, 2: 0}),  # beyond port 2: a busy path
             ({2: 0, 3: 0, 5: 0, 6: 0}, {1: 0, 2: second}),  # beyond port 3
             # port 2 half a second, beyond port 3 a second: port 2's path is the shorter
             ({2: half, 3: 0, 5: 0, 6: 0}, {1: 0, 2: second}),
             # the link beyond port 3 half a second, beyond port 2 a quarter: port 2's
             ({2: 0, 3: 0, 5: half // 2, 6: half}, {1: 0, 2: 0}))
    for levels, published in cases:
        now = time.monotonic_ns()
        loads = {p: PortLoad(RATE_BYTES_S, level, now) for p, level in levels.items()}
        for port, level in levels.items():
            switches.set_port_load(7 if port < 5 else 9, port, RATE_BYTES_S, level, now)
        for gid, delay in published.items():
            switches.set_quality(9, gid, delay, now)

        def load(p: int, at: int) -> int:
            _, gid, _, link = ahead[p]
            return bucket_delay(loads[p].delay_ns(at), max(
                beyond_ns((published[gid], now), at), loads[link].delay_ns(at)))

        want = least_loaded([2, 3], lambda p: True, lambda p: load(p, now), h=0)
        before = {p: _tx(tag, p) for p in (2, 3)}
        _send_udp(tag, 1, 3, 20)
        got = {p: _tx(tag, p) - before[p] for p in (2, 3)}
        assert got[want] >= 20 and got[5 - want] == 0, (levels, published, want, got)
        quality = switches.quality(7, 5)  # published at the last packet's choice
        best = path_quality([2, 3], lambda p: True, lambda p: load(p, quality.at_ns))
        # within a packet's worth of the reference (its own bytes joined the queue since)
        assert abs(quality.delay_ns - best) <= 1_000_000, (quality.delay_ns, best)
    # without the next switch, the same loads leave the choice to the local queues
    switches.set_group(7, 5, "select", [2, 3], selection="packet")
    before = {p: _tx(tag, p) for p in (2, 3)}
    _send_udp(tag, 1, 3, 20)
    got = {p: _tx(tag, p) - before[p] for p in (2, 3)}
    assert got[3] >= 20 and got[2] == 0, got


def test_a_port_taken_down_is_announced_down_at_once():
    """The switches' agent hears of a port taken down (both ends of a veth lose their
    operational state) within milliseconds of ``ip link set down``: a failure's port status
    does not wait for the kernel's link watch."""
    from testbed.linux.rawnl import LinkEvents

    a, b = f"lev{os.getpid() % 10000}a", f"lev{os.getpid() % 10000}b"
    _sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
    events = LinkEvents()
    try:
        for name in (a, b):
            _sh("ip", "link", "set", name, "up")
        wait_for(lambda: (a, True) in events.changes(), 5, f"{a} up")
        events.changes()  # what came before is not what is tested
        _sh("ip", "link", "set", a, "down")
        started = time.monotonic()
        seen: list = []
        wait_for(lambda: seen.extend(events.changes()) or (a, False) in seen, 5, f"{a} down")
        assert time.monotonic() - started < 0.05, seen  # the admin change's own message
        wait_for(lambda: seen.extend(events.changes()) or (b, False) in seen, 5, f"{b} down")
    finally:
        events.sock.close()
        _sh("ip", "link", "del", a, check=False)
