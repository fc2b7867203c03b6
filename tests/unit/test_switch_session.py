"""The eBPF switch's OpenFlow session (testbed/openflow/session.py), driven by what fabriclab's
controller really sends (controllers/routing/ofmsgs.py through os-ken's parser): the handshake answered
as a switch does, every routing mode's tables received whole (flows, SELECT groups with weights
and hash basis, fast failover), barriers in order, and what the datapath cannot do refused with
OpenFlow's errors."""

from __future__ import annotations

from dataclasses import astuple

import pytest
from os_ken.ofproto import ofproto_parser
from os_ken.ofproto import ofproto_v1_5 as ofp
from os_ken.ofproto import ofproto_v1_5_parser as parser

from controllers.routing.ofmsgs import to_messages
from controllers.routing.tables import compute_tables, diff_tables
from testbed.model.builders import fat_tree
from testbed.model.spec import Routing
from testbed.openflow.session import Port, SwitchSession


class FakeDatapath:
    ofproto = ofp
    ofproto_parser = parser
    id = 1


def _wire(msg, xid: int = 9) -> bytes:
    msg.set_xid(xid)
    msg.serialize()
    return bytes(msg.buf)


def _replies(raw: bytes) -> list:
    out = []
    while raw:
        version, msg_type, length, xid = ofproto_parser.header(raw)
        out.append(ofproto_parser.msg(FakeDatapath(), version, msg_type, length, xid,
                                      raw[:length]))
        raw = raw[length:]
    return out


def _session(switch: str, topo) -> SwitchSession:
    ports = [Port(n, link.end(switch).ifname, f"02:00:00:00:{i:02x}:{n:02x}")
             for i, (n, link) in enumerate(sorted(topo.ports(switch).items()))]
    return SwitchSession(topo.nodes[switch].dpid, ports)


def test_the_handshake_is_answered_as_a_switch_does():
    topo = fat_tree(4)
    session = _session("edge1_1", topo)
    dp = FakeDatapath()
    assert _replies(session.start())[0].msg_type == ofp.OFPT_HELLO
    raw = (_wire(parser.OFPHello(dp), 1) + _wire(parser.OFPFeaturesRequest(dp), 2)
           + _wire(parser.OFPPortDescStatsRequest(dp, 0), 3)
           + _wire(parser.OFPEchoRequest(dp, data=b"ping"), 4)
           + _wire(parser.OFPBarrierRequest(dp), 5))
    features, ports, echo, barrier = _replies(session.receive(raw[:20]) + session.receive(raw[20:]))
    assert isinstance(features, parser.OFPSwitchFeatures)
    assert (features.xid, features.datapath_id, features.n_tables) == (
        2, topo.nodes["edge1_1"].dpid, 1)
    assert isinstance(ports, parser.OFPPortDescStatsReply) and ports.xid == 3
    assert [(p.port_no, p.name.decode(), p.state) for p in ports.body] == [
        (n, link.end("edge1_1").ifname, ofp.OFPPS_LIVE)
        for n, link in sorted(topo.ports("edge1_1").items())]
    assert (echo.xid, bytes(echo.data)) == (4, b"ping")
    assert isinstance(barrier, parser.OFPBarrierReply) and barrier.xid == 5
    (status,) = _replies(session.port_status(1, False))
    assert isinstance(status, parser.OFPPortStatus)
    assert (status.desc.port_no, status.desc.state) == (1, ofp.OFPPS_LINK_DOWN)


def _hello(version: int, bitmap: set[int] | None) -> bytes:
    import struct

    body = b""
    if bitmap is not None:
        body = struct.pack("!HHI", ofp.OFPHET_VERSIONBITMAP, 8, sum(1 << v for v in bitmap))
    return struct.pack("!BBHI", version, ofp.OFPT_HELLO, 8 + len(body), 1) + body


@pytest.mark.parametrize("version, bitmap, agreed", [
    (6, None, 6), (7, None, 6), (6, {4, 6}, 6), (4, None, 4), (4, {1, 4}, 4), (5, {4, 5}, 4),
    (5, None, None), (1, None, None), (3, {1, 2, 3}, None), (6, {5}, None)])
def test_version_negotiation_takes_the_highest_version_both_speak(version, bitmap, agreed):
    """With the controller's version bitmap, the highest version both speak (1.5, else 1.3);
    without one, the lower of the two hellos' versions if the switch speaks it. Otherwise
    HELLO_FAILED, naming both sides' versions."""
    session = _session("edge1_1", fat_tree(4))
    (hello,) = _replies(session.start())
    assert [e.versions for e in hello.elements] == [[4, 6]]  # our bitmap: 1.3 and 1.5
    out = session.receive(_hello(version, bitmap))
    assert session.handshaken is False
    if agreed:
        assert out == b"" and session.refused == "" and session.version == agreed
        return
    (error,) = _replies(out)
    assert (error.type, error.code) == (ofp.OFPET_HELLO_FAILED, ofp.OFPHFC_INCOMPATIBLE)
    assert "this switch speaks 1.3 (0x04) and 1.5 (0x06)" in session.refused
    assert f"(0x{version:02x})" in session.refused or f"(0x{max(bitmap):02x})" in \
        session.refused


@pytest.mark.parametrize("routing", [Routing.ECMP, Routing.DMODK, Routing.SPRAY,
                                     Routing.ADAPTIVE])
def test_every_routing_modes_tables_arrive_whole(routing):
    topo = fat_tree(4)
    up = {link.name: True for link in topo.links}
    tables = compute_tables(topo, up, routing)
    dp = FakeDatapath()
    for switch in ("edge1_1", "agg2_1", "core1"):
        session = _session(switch, topo)
        raw = b"".join(_wire(m, i) for i, op in enumerate(diff_tables(None, tables[switch]))
                       for m in to_messages(dp, op))
        replies = _replies(session.receive(raw))
        assert not [r for r in replies if isinstance(r, parser.OFPErrorMsg)], replies
        def canonical(flows):
            return {(f.priority, tuple(sorted(f.match)), f.actions, f.cookie)
                    for f in flows.values()}

        assert canonical(session.flows) == canonical(tables[switch].flows), switch
        assert {g: astuple(e) for g, e in session.groups.items()} == \
            {g: astuple(e) for g, e in tables[switch].groups.items()}, switch


def test_what_the_datapath_cannot_do_is_an_openflow_error():
    topo = fat_tree(4)
    session = _session("edge1_1", topo)
    dp = FakeDatapath()
    bad_match = parser.OFPFlowMod(dp, priority=1, match=parser.OFPMatch(
        eth_type=0x86DD, ipv6_dst="::1"), instructions=[])
    bad_table = parser.OFPFlowMod(dp, table_id=3, priority=1, match=parser.OFPMatch())
    bad_group = parser.OFPFlowMod(dp, priority=1, match=parser.OFPMatch(), instructions=[
        parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, [parser.OFPActionGroup(77)])])
    errors = _replies(session.receive(_wire(bad_match, 1) + _wire(bad_table, 2)
                                      + _wire(bad_group, 3)))
    assert [(e.xid, e.type, e.code) for e in errors] == [
        (1, ofp.OFPET_BAD_MATCH, ofp.OFPBMC_BAD_FIELD),
        (2, ofp.OFPET_FLOW_MOD_FAILED, ofp.OFPFMFC_BAD_TABLE_ID),
        (3, ofp.OFPET_BAD_ACTION, ofp.OFPBAC_BAD_OUT_GROUP)]
    assert session.flows == {}


def test_a_packet_out_is_queued_for_its_ports_and_a_bad_port_refused():
    topo = fat_tree(4)
    session = _session("edge1_1", topo)
    dp = FakeDatapath()
    probe = parser.OFPPacketOut(dp, buffer_id=ofp.OFP_NO_BUFFER,
                                match=parser.OFPMatch(in_port=ofp.OFPP_CONTROLLER),
                                actions=[parser.OFPActionOutput(2), parser.OFPActionOutput(3)],
                                data=b"\x01\x80\xc2lldp-frame")
    assert session.receive(_wire(probe, 1)) == b""
    assert session.packets_out == [(2, b"\x01\x80\xc2lldp-frame"),
                                   (3, b"\x01\x80\xc2lldp-frame")]
    bad = parser.OFPPacketOut(dp, buffer_id=ofp.OFP_NO_BUFFER,
                              match=parser.OFPMatch(in_port=ofp.OFPP_CONTROLLER),
                              actions=[parser.OFPActionOutput(99)], data=b"x")
    (error,) = _replies(session.receive(_wire(bad, 2)))
    assert (error.type, error.code) == (ofp.OFPET_BAD_ACTION, ofp.OFPBAC_BAD_OUT_PORT)


class Counted:
    """Counters a test sets: per port, per flow (by its match)."""

    def __init__(self, ports: dict, flows: dict) -> None:
        self.port_counts, self.flow_counts = ports, flows

    def ports(self):
        return self.port_counts

    def flow(self, entry):
        return self.flow_counts.get(entry.match, (0, 0))


def test_packet_ins_and_statistics_parse_back_with_os_kens_parser():
    from controllers.routing.tables import FLOW_COOKIE
    from testbed.openflow.replies import PortCounters

    topo = fat_tree(4)
    tables = compute_tables(topo, {link.name: True for link in topo.links}, Routing.ADAPTIVE)
    session = _session("edge1_1", topo)
    dp = FakeDatapath()
    session.receive(b"".join(_wire(m, i) for i, op in enumerate(
        diff_tables(None, tables["edge1_1"])) for m in to_messages(dp, op)))
    exact = parser.OFPFlowMod(dp, cookie=FLOW_COOKIE, priority=30000, match=parser.OFPMatch(
        eth_type=0x0800, ipv4_src="10.1.1.2", ipv4_dst="10.2.1.2", ip_proto=6, tcp_src=40000,
        tcp_dst=5201), instructions=[parser.OFPInstructionActions(
            ofp.OFPIT_APPLY_ACTIONS, [parser.OFPActionOutput(3, ofp.OFPCML_NO_BUFFER)])])
    assert session.receive(_wire(exact, 50)) == b""
    exact_match = tuple(sorted(exact.match.items()))
    session.counters = Counted({1: PortCounters(rx_packets=5, tx_bytes=9000),
                                3: PortCounters(tx_packets=7, tx_dropped=2)},
                               {exact_match: (12, 108_000)})
    (pin,) = _replies(session.packet_in(2, 1514, b"\xff" * 128))
    assert isinstance(pin, parser.OFPPacketIn)
    assert (pin.match["in_port"], pin.total_len, bytes(pin.data), pin.buffer_id) == (
        2, 1514, b"\xff" * 128, ofp.OFP_NO_BUFFER)
    (ports,) = _replies(session.receive(_wire(parser.OFPPortStatsRequest(dp, 0, ofp.OFPP_ANY),
                                              60)))
    assert isinstance(ports, parser.OFPPortStatsReply) and ports.xid == 60
    assert [(s.port_no, s.rx_packets, s.tx_bytes, s.tx_packets, s.tx_dropped)
            for s in ports.body] == [(1, 5, 9000, 0, 0), (3, 0, 0, 7, 2)]
    (one,) = _replies(session.receive(_wire(parser.OFPPortStatsRequest(dp, 0, 3), 61)))
    assert [s.port_no for s in one.body] == [3]
    (bad,) = _replies(session.receive(_wire(parser.OFPPortStatsRequest(dp, 0, 77), 62)))
    assert (bad.type, bad.code) == (ofp.OFPET_BAD_REQUEST, ofp.OFPBRC_BAD_PORT)
    # the controller's own flow-stats request: its cookie's flows only, with their counts
    desc_req = parser.OFPFlowDescStatsRequest(dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY,
                                              FLOW_COOKIE, 0xFFFFFFFFFFFFFFFF, parser.OFPMatch())
    (desc,) = _replies(session.receive(_wire(desc_req, 63)))
    assert isinstance(desc, parser.OFPFlowDescStatsReply)
    assert [(dict(d.match.items())["tcp_src"], d.priority, d.stats["byte_count"],
             d.stats["packet_count"], d.instructions[0].actions[0].port) for d in desc.body] \
        == [(40000, 30000, 108_000, 12, 3)]
    every = parser.OFPFlowStatsRequest(dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY, 0, 0,
                                       parser.OFPMatch())
    stats = _replies(session.receive(_wire(every, 64)))
    assert sum(len(s.body) for s in stats) == len(session.flows)
    assert all(isinstance(s, parser.OFPFlowStatsReply) for s in stats)
    (info,) = _replies(session.receive(_wire(parser.OFPDescStatsRequest(dp, 0), 65)))
    assert b"fabriclab" in info.body.mfr_desc


def test_a_long_multipart_reply_is_split_with_reply_more():
    from testbed.openflow.replies import multipart

    parts = [bytes(100)] * 1500  # 150 kB: three messages
    raw = multipart(ofp.OFPMP_FLOW_STATS, 7, parts)
    flags, total = [], 0
    while raw:
        _v, _t, length, xid = ofproto_parser.header(raw)
        assert length <= 65535 and xid == 7
        flags.append(int.from_bytes(raw[10:12], "big"))
        total += length - 16
        raw = raw[length:]
    assert total == 150_000 and len(flags) == 3
    assert flags[:-1] == [ofp.OFPMPF_REPLY_MORE] * (len(flags) - 1) and flags[-1] == 0
