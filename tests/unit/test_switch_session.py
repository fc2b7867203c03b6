"""The eBPF switch's OpenFlow session (testbed/switch/session.py), driven by what fabriclab's
controller really sends (controllers/ofmsgs.py through os-ken's parser): the handshake answered
as a switch does, every routing mode's tables received whole (flows, SELECT groups with weights
and hash basis, fast failover), barriers in order, and what the datapath cannot do refused with
OpenFlow's errors."""

from __future__ import annotations

from dataclasses import astuple

import pytest
from os_ken.ofproto import ofproto_parser
from os_ken.ofproto import ofproto_v1_5 as ofp
from os_ken.ofproto import ofproto_v1_5_parser as parser

from controllers.ofmsgs import to_messages
from controllers.routing.tables import compute_tables, diff_tables
from testbed.model.builders import fat_tree
from testbed.model.spec import Routing
from testbed.switch.session import Port, SwitchSession


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
