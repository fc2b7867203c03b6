"""The eBPF switches' agent (testbed/switch/agent.py) against a controller on loopback that
sends what fabriclab's controller sends: the tables reach the datapath compiled before the
barrier's reply, a port's carrier change reaches the datapath first and the controller next."""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import socket
import subprocess
from types import SimpleNamespace

import pytest

from os_ken.ofproto import ofproto_parser
from os_ken.ofproto import ofproto_v1_5 as ofp
from os_ken.ofproto import ofproto_v1_5_parser as parser

from controllers.routing.ofmsgs import to_messages
from controllers.routing.tables import Op, OpKind, compute_tables, diff_tables
from testbed.model.builders import fat_tree
from testbed.model.spec import Routing
from testbed.plan import tss
from testbed.poll import wait_for
from testbed.switch.agent import SwitchAgent, SwitchSpec
from testbed.openflow.session import Port
from tests.unit.test_switch_session import FakeDatapath, _wire


class FakeLinks:
    """Link announcements a test makes."""

    def __init__(self) -> None:
        self.read_end, self.write_end = socket.socketpair()
        self.pending: list = []

    def announce(self, ifname: str, up: bool) -> None:
        self.pending.append((ifname, up))
        self.write_end.send(b"l")

    def fileno(self) -> int:
        return self.read_end.fileno()

    def changes(self):
        self.read_end.recv(4096)
        out, self.pending = self.pending, []
        return out

    def close(self) -> None:
        self.read_end.close()
        self.write_end.close()


class FakeMaps:
    def __init__(self) -> None:
        self.tables, self.groups, self.live, self.calls = {}, {}, {}, []
        self.selections, self.ahead, self.rebalances = {}, {}, {}
        self.punts, self._punt_in = socket.socketpair()  # readable when punted packets wait
        self.waiting: list = []

    def punt(self, sw: int, port: int, frame: bytes) -> None:
        self.waiting.append((SimpleNamespace(sw=sw, port=port, total_len=len(frame)), frame))
        self._punt_in.send(b"p")

    def read_punts(self):
        self.punts.recv(4096)
        out, self.waiting = self.waiting, []
        return out

    def counters(self, sw, mask, key):
        return (1, 100)

    def port_counters(self, names):
        return {n: {"rx_packets": 2, "tx_packets": 3, "rx_bytes": 4, "tx_bytes": 5,
                    "rx_dropped": 0, "tx_dropped": 0, "up": True} for n in names}

    def set_table(self, sw, subtables):
        self.tables[sw] = subtables
        self.calls.append("table")

    def set_group(self, sw, group_id, kind, ports, weights=None, basis=0, selection="hash",
                  gap_us=0, beyond=None, rebalance=(0, 0)):
        self.groups[(sw, group_id)] = (kind, ports, weights, basis)
        self.selections[(sw, group_id)] = (selection, gap_us)
        self.rebalances[(sw, group_id)] = rebalance
        self.ahead[(sw, group_id)] = beyond
        self.calls.append("group")

    def delete_group(self, sw, group_id):
        del self.groups[(sw, group_id)]

    def set_live(self, sw, port, live):
        self.live[(sw, port)] = live
        self.calls.append(f"live {port} {live}")


def _read_messages(sock: socket.socket, want: type, timeout_s: float = 5.0) -> list:
    sock.settimeout(timeout_s)
    buf, got = b"", []
    while not any(isinstance(m, want) for m in got):
        buf += sock.recv(65536)
        while len(buf) >= 8:
            version, msg_type, length, xid = ofproto_parser.header(buf)
            if len(buf) < length:
                break
            got.append(ofproto_parser.msg(FakeDatapath(), version, msg_type, length, xid,
                                          buf[:length]))
            buf = buf[length:]
    return got


def test_the_tables_are_in_the_datapath_before_the_barrier_reply():
    topo = fat_tree(4)
    tables = compute_tables(topo, {l.name: True for l in topo.links}, Routing.ECMP)
    ports = [Port(n, link.end("edge1_1").ifname, f"02:00:00:00:01:{n:02x}")
             for n, link in sorted(topo.ports("edge1_1").items())]
    maps, links = FakeMaps(), FakeLinks()
    with socket.create_server(("127.0.0.1", 0)) as server:
        agent = SwitchAgent(maps, {"edge1_1": SwitchSpec(3, topo.nodes["edge1_1"].dpid, ports)},
                            server.getsockname(), links)
        agent.start()
        try:
            conn, _ = server.accept()
            with conn:
                dp = FakeDatapath()
                conn.sendall(_wire(parser.OFPHello(dp), 1)
                             + _wire(parser.OFPFeaturesRequest(dp), 2))
                (features,) = [m for m in _read_messages(conn, parser.OFPSwitchFeatures)
                               if isinstance(m, parser.OFPSwitchFeatures)]
                assert features.datapath_id == topo.nodes["edge1_1"].dpid
                ops = diff_tables(None, tables["edge1_1"])
                conn.sendall(b"".join(_wire(m, 10 + i) for i, op in enumerate(ops)
                                      for m in to_messages(dp, op)))
                replies = _read_messages(conn, parser.OFPBarrierReply)
                assert not [r for r in replies if isinstance(r, parser.OFPErrorMsg)], replies
                # by the barrier's reply the datapath holds the compiled table and the groups
                want = tss.compile_table(tables["edge1_1"].flows.values())
                assert [(t.mask, t.entries) for t in maps.tables[3]] == \
                    [(t.mask, t.entries) for t in want]
                assert {g for (_sw, g) in maps.groups} == set(tables["edge1_1"].groups)
                agent.set_port("edge1_1", 3, False)
                (status,) = [m for m in _read_messages(conn, parser.OFPPortStatus)
                             if isinstance(m, parser.OFPPortStatus)]
                assert (status.desc.port_no, status.desc.state) == (3, ofp.OFPPS_LINK_DOWN)
                assert maps.live[(3, 3)] is False
                # the carrier back, as netlink announces it: live, and the controller told
                links.announce(ports[2].name, True)
                (status,) = [m for m in _read_messages(conn, parser.OFPPortStatus)
                             if isinstance(m, parser.OFPPortStatus)]
                assert (status.desc.port_no, status.desc.state) == (3, ofp.OFPPS_LIVE)
                assert maps.live[(3, 3)] is True
                links.announce("not-a-port", False)  # another interface: nothing
                # a punted packet reaches the controller as a packet-in of its port
                maps.punt(3, 2, b"\x01\x80\xc2\x00\x00\x0e" + bytes(60))
                (pin,) = [m for m in _read_messages(conn, parser.OFPPacketIn)
                          if isinstance(m, parser.OFPPacketIn)]
                assert (pin.match["in_port"], pin.total_len) == (2, 66)
                conn.sendall(_wire(parser.OFPPortStatsRequest(dp, 0, ofp.OFPP_ANY), 90))
                (stats,) = [m for m in _read_messages(conn, parser.OFPPortStatsReply)
                            if isinstance(m, parser.OFPPortStatsReply)]
                assert [(s.port_no, s.tx_bytes) for s in stats.body] == \
                    [(p.number, 5) for p in ports]
        finally:
            agent.stop()
    wait_for(lambda: agent.thread is None or not agent.thread.is_alive(), 5, "the agent's end")
    assert not agent.errors or all("closed" in e for e in agent.errors), agent.errors


def test_a_reroute_writes_only_the_group_it_changes():
    """A group mod rewrites that group in the datapath and nothing else: not the other
    groups, not the compiled flow table (each message is installed before the next is read;
    rewriting everything per message slowed a reroute's five switches down)."""
    maps = FakeMaps()
    with programmed_edge(maps) as (_agent, _topo, conn, tables):
        assert maps.calls.count("table") >= 1 and maps.calls.count("group") >= 7
        maps.calls.clear()
        dp = FakeDatapath()
        gid, group = sorted(tables["edge1_1"].groups.items())[0]
        narrowed = dataclasses.replace(group, ports=group.ports[:1])
        mods = [Op(OpKind.GROUP_MOD, narrowed), Op(OpKind.BARRIER)]
        conn.sendall(b"".join(_wire(m, 50 + i) for i, op in enumerate(mods)
                              for m in to_messages(dp, op)))
        _read_messages(conn, parser.OFPBarrierReply)
        assert maps.calls == ["group"]
        assert maps.groups[(3, gid)][1] == list(group.ports[:1])


def edge_agent(server: socket.socket, maps=None, tls=None,
               mgmt_dir=None) -> tuple[SwitchAgent, object]:
    """An agent serving a k=4 fat-tree's edge1_1 (datapath index 3), connecting to
    ``server`` (its management socket in ``mgmt_dir``); (the agent, the topology)."""
    topo = fat_tree(4)
    ports = [Port(n, link.end("edge1_1").ifname, f"02:00:00:00:01:{n:02x}")
             for n, link in sorted(topo.ports("edge1_1").items())]
    agent = SwitchAgent(maps or FakeMaps(), {"edge1_1": SwitchSpec(
        3, topo.nodes["edge1_1"].dpid, ports)}, server.getsockname(), tls=tls,
        mgmt_dir=mgmt_dir)
    return agent, topo


def test_a_switch_whose_connection_the_controller_closes_connects_again():
    """As a switch does: a controller that closes the connection (one starting up, or one
    restarted) sees the switch connect again and say hello, its ports' liveness kept."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(5)
        agent, topo = edge_agent(server)
        agent.start()
        try:
            first, _ = server.accept()
            first.close()  # before any hello
            second, _ = server.accept()
            with second:
                assert isinstance(_read_messages(second, parser.OFPHello)[0], parser.OFPHello)
                second.sendall(_wire(parser.OFPHello(FakeDatapath()), 1)
                               + _wire(parser.OFPFeaturesRequest(FakeDatapath()), 2))
                (features,) = [m for m in _read_messages(second, parser.OFPSwitchFeatures)
                               if isinstance(m, parser.OFPSwitchFeatures)]
                assert features.datapath_id == topo.nodes["edge1_1"].dpid
            assert agent.disconnects and "edge1_1" in agent.disconnects[0]
        finally:
            agent.stop()


def _install_edge(conn: socket.socket, tables: dict) -> None:
    """As the controller: greet the switch on ``conn`` and install edge1_1's ``tables``,
    waiting for the barrier's reply."""
    dp = FakeDatapath()
    conn.sendall(_wire(parser.OFPHello(dp), 1) + _wire(parser.OFPFeaturesRequest(dp), 2))
    _read_messages(conn, parser.OFPSwitchFeatures)
    ops = diff_tables(None, tables["edge1_1"])
    conn.sendall(b"".join(_wire(m, 10 + i) for i, op in enumerate(ops)
                          for m in to_messages(dp, op)))
    _read_messages(conn, parser.OFPBarrierReply)


def test_another_process_tells_the_agent_a_lost_signal_and_the_controller_hears_at_once(
        tmp_path):
    """``fabriclab fail`` marks the port dead in the datapath and tells the agent over its
    datagram socket (a deep folder: the address goes through the folder's descriptor): the
    port's status goes out then, not at the carrier's loss; it is sent once."""
    from testbed.switch.agent import tell_lost_signal

    folder = tmp_path / ("deep" * 30)
    maps = FakeMaps()
    with programmed_edge(maps, folder) as (_agent, topo, conn, _tables):
        port = topo.ports("edge1_1")[3].end("edge1_1").ifname
        assert tell_lost_signal(folder, port)
        (status,) = [m for m in _read_messages(conn, parser.OFPPortStatus)
                     if isinstance(m, parser.OFPPortStatus)]
        assert (status.desc.port_no, status.desc.state) == (3, ofp.OFPPS_LINK_DOWN)
        assert maps.live[(3, 3)] is False
        assert tell_lost_signal(folder, port)  # told again: nothing more to say
        conn.settimeout(0.3)
        with pytest.raises(socket.timeout):
            conn.recv(65536)
    assert not (folder / "agent.signal").exists()
    assert not tell_lost_signal(folder, "x")  # no agent there


@contextlib.contextmanager
def programmed_edge(maps=None, mgmt_dir=None, routing=Routing.ECMP, **kw):
    """An agent serving edge1_1 (:func:`edge_agent`) that the controller's side has greeted and
    programmed with edge1_1's tables (``routing``, ``kw``: compute_tables'): (the agent, the
    topology, the controller's end of the connection, the tables); stopped on the way out."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        agent, topo = edge_agent(server, maps, mgmt_dir=mgmt_dir)
        tables = compute_tables(topo, {l.name: True for l in topo.links}, routing, **kw)
        agent.start()
        try:
            conn, _ = server.accept()
            with conn:
                _install_edge(conn, tables)
                yield agent, topo, conn, tables
        finally:
            agent.stop()


@pytest.mark.skipif(shutil.which("ovs-ofctl") is None, reason="needs ovs-ofctl "
                    "(apt-get install openvswitch-switch)")
def test_ovs_ofctl_reads_an_ebpf_switchs_tables_through_its_management_socket(tmp_path):
    """As on an Open vSwitch bridge: ``ovs-ofctl dump-flows`` and ``dump-groups`` over the
    switch's management socket show what the controller installed; a change is refused. The
    socket's path is longer than a Unix address holds (as in a deep run directory)."""
    tmp_path = tmp_path / ("deep" * 30)
    with socket.create_server(("127.0.0.1", 0)) as server:
        agent, topo = edge_agent(server, mgmt_dir=tmp_path)
        tables = compute_tables(topo, {l.name: True for l in topo.links}, Routing.ECMP)
        agent.start()
        try:
            conn, _ = server.accept()
            with conn:
                _install_edge(conn, tables)

                def ofctl(*args: str) -> subprocess.CompletedProcess:
                    return subprocess.run(["ovs-ofctl", "-O", "OpenFlow15", args[0],
                                           f"unix:{tmp_path / 'edge1_1.mgmt'}", *args[1:]],
                                          capture_output=True, text=True, timeout=20)

                flows = ofctl("dump-flows")
                assert flows.returncode == 0, flows.stderr
                lines = [l for l in flows.stdout.splitlines() if "priority=" in l]
                assert len(lines) == len(tables["edge1_1"].flows), flows.stdout
                for host in ("10.1.1.1", "10.1.1.2"):  # its own hosts' /32 routes
                    assert any(f"nw_dst={host}" in l for l in lines), flows.stdout
                groups = ofctl("dump-groups")
                assert groups.returncode == 0, groups.stderr
                assert groups.stdout.count("group_id=") == len(tables["edge1_1"].groups)
                assert "type=select" in groups.stdout
                refused = ofctl("add-flow", "priority=9,actions=drop")  # the controller's alone
                assert refused.returncode != 0, refused
                assert len(agent.conns["edge1_1"].session.flows) == len(lines)
                ports = ofctl("dump-ports")
                assert ports.returncode == 0 and ports.stdout.count("port ") >= \
                    len(topo.ports("edge1_1")), ports
        finally:
            agent.stop()
    assert not agent.errors or all("closed" in e for e in agent.errors), agent.errors


def test_a_controller_of_a_version_the_switches_refuse_fails_the_wait_at_once(tmp_path):
    """An OpenFlow 1.0 controller (a hello of version 0x01 only): the switch answers
    HELLO_FAILED and the fabric's wait for its controller fails at once (not at its 60 s
    timeout), naming both sides' versions."""
    import time

    from fabriclab.model import experiment as xp
    from testbed.errors import TestbedError
    from testbed.fabric.controller import Controller

    spec = xp.parse({"version": 1, "fabric": {"topology": "fat_tree", "k": 4}})
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(5)
        agent, topo = edge_agent(server)
        agent.start()
        try:
            conn, _ = server.accept()
            with conn:
                conn.sendall(bytes([1, 0, 0, 8, 0, 0, 0, 1]))  # OFPT_HELLO, version 1.0
                view = SimpleNamespace(states=agent.states, notes=lambda: [],
                                       refusals=lambda: list(agent.refusals))
                run = SimpleNamespace(run_dir=tmp_path, errors=[])
                controller = Controller(spec, topo, run, "127.0.0.1", view)
                began = time.monotonic()
                with pytest.raises(TestbedError) as err:
                    controller.wait_programmed()
                assert time.monotonic() - began < 2.0
        finally:
            agent.stop()
    text = str(err.value)
    assert "refused the controller" in text and "0x01" in text and "1.5 (0x06)" in text, text


def test_dump_groups_shows_an_ebpf_switchs_local_selection_methods(tmp_path):
    """``fabriclab ofctl SWITCH dump-groups`` reads an eBPF switch's groups itself: ovs-ofctl
    refuses a selection method that is not Open vSwitch's, such as ``flowlet``."""
    from testbed.openflow.groups import describe
    from testbed.switch.groupdump import read_groups

    tmp_path = tmp_path / ("deep" * 30)  # longer than a Unix address holds
    with programmed_edge(None, tmp_path, Routing.LOCAL_ADAPTIVE,
                         local=("flowlet", 120, (25, 50))) as (agent, _topo, _conn, tables):
        groups = read_groups(tmp_path / "edge1_1.mgmt")
        installed = dict(agent.datapath.rebalances)
    want = tables["edge1_1"].groups
    assert sorted(g.group_id for g in groups) == sorted(want), groups
    lines = [describe(g) for g in groups]
    selects = [l for l in lines if "type=select" in l]
    assert selects and all("selection_method=flowlet," in l and ",flowlet_gap_us=120," in l
                           and ",rebalance_delta=25%,rebalance_chance=50%," in l
                           for l in selects), selects
    # the rebalancing came over OpenFlow (fabriclab's group property) into the datapath
    assert installed and set(installed.values()) == {(25, 50)}, installed
    for group in groups:
        line = describe(group)
        assert all(f"actions=output:{p}" in line for p in group.ports), line
