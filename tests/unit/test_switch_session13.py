"""The eBPF switch's OpenFlow session speaking 1.3 (testbed/openflow/v13.py), driven by what a
Ryu/os-ken 1.3 app sends (os-ken's 1.3 classes) and every reply parsed back by os-ken's 1.3
parser: the handshake and port descriptions, a learning switch's table-miss and learned
flows, packet-in and flooding packet-outs, flow, port and group statistics, and a 1.5
message on a 1.3 session refused."""

from __future__ import annotations

import struct

from os_ken.ofproto import ofproto_parser
from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as parser
from os_ken.ofproto import ofproto_v1_5 as ofp15
from os_ken.ofproto import ofproto_v1_5_parser as parser15

from testbed.model.openflow import CONTROLLER_PORT
from testbed.openflow.replies import PortCounters
from testbed.openflow.session import Port, SwitchSession
from testbed.plan import tss
from tests.unit.test_switch_session import _wire


class Datapath13:
    ofproto = ofp
    ofproto_parser = parser
    id = 7


class Datapath15:
    ofproto = ofp15
    ofproto_parser = parser15
    id = 7


class Counts:
    def ports(self):
        return {1: PortCounters(rx_packets=5, tx_bytes=900), 2: PortCounters(), 3: PortCounters()}

    def flow(self, entry):
        return (3, 300) if entry.priority == 1 else (0, 0)


def _replies(raw: bytes) -> list:
    out = []
    while raw:
        version, msg_type, length, xid = ofproto_parser.header(raw)
        assert version == ofp.OFP_VERSION
        out.append(ofproto_parser.msg(Datapath13(), version, msg_type, length, xid,
                                      raw[:length]))
        raw = raw[length:]
    return out


def _session13() -> SwitchSession:
    ports = [Port(n, f"sw-eth{n}", f"02:00:00:00:00:{n:02x}", live=n != 3, speed_kbps=100_000)
             for n in (1, 2, 3)]
    session = SwitchSession(0x42, ports, counters=Counts())
    session.start()
    assert session.receive(_wire(parser.OFPHello(Datapath13()), 1)) == b""
    assert session.v13
    return session


def test_a_1_3_controller_gets_the_handshake_and_ports_in_1_3():
    session = _session13()
    dp = Datapath13()
    features, ports, echo = _replies(session.receive(
        _wire(parser.OFPFeaturesRequest(dp), 2) + _wire(parser.OFPPortDescStatsRequest(dp, 0), 3)
        + _wire(parser.OFPEchoRequest(dp, data=b"hi"), 4)))
    assert isinstance(features, parser.OFPSwitchFeatures) and features.datapath_id == 0x42
    assert isinstance(ports, parser.OFPPortDescStatsReply)
    assert [(p.port_no, p.name.decode(), p.hw_addr, p.state, p.curr_speed) for p in ports.body] \
        == [(1, "sw-eth1", "02:00:00:00:00:01", ofp.OFPPS_LIVE, 100_000),
            (2, "sw-eth2", "02:00:00:00:00:02", ofp.OFPPS_LIVE, 100_000),
            (3, "sw-eth3", "02:00:00:00:00:03", ofp.OFPPS_LINK_DOWN, 100_000)]
    assert bytes(echo.data) == b"hi"
    (status,) = _replies(session.port_status(3, True))
    assert isinstance(status, parser.OFPPortStatus)
    assert (status.reason, status.desc.port_no, status.desc.state) == (
        ofp.OFPPR_MODIFY, 3, ofp.OFPPS_LIVE)
    # a 1.5 message on this session: BAD_VERSION, as a switch answers
    (error,) = _replies(session.receive(_wire(parser15.OFPBarrierRequest(Datapath15()), 5)))
    assert (error.type, error.code) == (ofp.OFPET_BAD_REQUEST, ofp.OFPBRC_BAD_VERSION)


def test_a_learning_switchs_flows_packet_ins_and_floods():
    """What a 1.3 learning switch does: a table-miss to the controller, a packet-in of a
    frame, a flood of it by packet-out (every port but the one it came in on), then a flow
    on in_port, eth_dst and eth_src."""
    session = _session13()
    dp = Datapath13()
    changes = []
    session.on_change = lambda flows, _groups: changes.append(dict(flows))
    miss = parser.OFPFlowMod(dp, priority=0, match=parser.OFPMatch(), instructions=[
        parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, [
            parser.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER)])])
    assert session.receive(_wire(miss, 2)) == b""
    assert changes[-1][(0, ())].actions == (("output", CONTROLLER_PORT),)
    frame = bytes.fromhex("020000000002" "020000000001" "0800") + b"\x45" + b"\0" * 40
    (pin,) = _replies(session.packet_in(1, len(frame), frame))
    assert isinstance(pin, parser.OFPPacketIn)
    assert (pin.match["in_port"], bytes(pin.data), pin.buffer_id) == (1, frame, ofp.OFP_NO_BUFFER)
    flood = parser.OFPPacketOut(dp, buffer_id=ofp.OFP_NO_BUFFER, in_port=1, data=frame,
                                actions=[parser.OFPActionOutput(ofp.OFPP_FLOOD)])
    assert session.receive(_wire(flood, 3)) == b""
    assert session.packets_out == [(2, frame), (3, frame)]
    session.packets_out = []
    back = parser.OFPPacketOut(dp, buffer_id=ofp.OFP_NO_BUFFER, in_port=2, data=frame,
                               actions=[parser.OFPActionOutput(ofp.OFPP_IN_PORT),
                                        parser.OFPActionOutput(ofp.OFPP_ALL)])
    assert session.receive(_wire(back, 4)) == b""
    assert [p for p, _ in session.packets_out] == [2, 1, 2, 3]
    learned = parser.OFPFlowMod(dp, priority=1, match=parser.OFPMatch(
        in_port=2, eth_dst="02:00:00:00:00:01", eth_src="02:00:00:00:00:02"),
        instructions=[parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS,
                                                   [parser.OFPActionOutput(1)])])
    assert session.receive(_wire(learned, 5)) == b""
    (entry,) = [f for f in changes[-1].values() if f.priority == 1]
    assert entry.actions == (("output", 1),)
    subtables = tss.compile_table(changes[-1].values())
    hit, _ = tss.lookup(subtables, {"in_port": 2, "eth_dst": "02:00:00:00:00:01",
                                    "eth_src": "02:00:00:00:00:02", "eth_type": 0x0800})
    assert hit.actions == (("output", 1),)
    miss_hit, _ = tss.lookup(subtables, {"in_port": 2, "eth_dst": "02:00:00:00:00:01",
                                         "eth_src": "02:00:00:00:00:09", "eth_type": 0x0800})
    assert miss_hit.actions == (("output", CONTROLLER_PORT),)
    bad = parser.OFPPacketOut(dp, buffer_id=ofp.OFP_NO_BUFFER, in_port=1, data=frame,
                              actions=[parser.OFPActionOutput(ofp.OFPP_TABLE)])
    (error,) = _replies(session.receive(_wire(bad, 6)))
    assert (error.type, error.code) == (ofp.OFPET_BAD_ACTION, ofp.OFPBAC_BAD_OUT_PORT)


def test_flow_port_and_group_statistics_parse_back_in_1_3():
    session = _session13()
    dp = Datapath13()
    flow = parser.OFPFlowMod(dp, priority=1, cookie=0xAB, match=parser.OFPMatch(
        eth_type=0x0800, ipv4_dst="10.0.0.2"), instructions=[parser.OFPInstructionActions(
            ofp.OFPIT_APPLY_ACTIONS, [parser.OFPActionOutput(2)])])
    select = parser.OFPGroupMod(dp, ofp.OFPGC_ADD, ofp.OFPGT_SELECT, 5, [
        parser.OFPBucket(weight=3, actions=[parser.OFPActionOutput(1)]),
        parser.OFPBucket(weight=1, actions=[parser.OFPActionOutput(2)])])
    ff = parser.OFPGroupMod(dp, ofp.OFPGC_ADD, ofp.OFPGT_FF, 6, [
        parser.OFPBucket(watch_port=2, actions=[parser.OFPActionOutput(2)]),
        parser.OFPBucket(watch_port=1, actions=[parser.OFPActionOutput(1)])])
    assert session.receive(_wire(flow, 2) + _wire(select, 3) + _wire(ff, 4)) == b""
    assert (session.groups[5].ports, session.groups[5].weights) == ((1, 2), (3, 1))
    assert (session.groups[6].ports, session.groups[6].kind) == ((2, 1), "ff")
    flows, ports, groups = _replies(session.receive(
        _wire(parser.OFPFlowStatsRequest(dp), 5) + _wire(parser.OFPPortStatsRequest(dp), 6)
        + _wire(parser.OFPGroupDescStatsRequest(dp), 7)))
    (stats,) = flows.body
    assert (stats.priority, stats.cookie, stats.packet_count, stats.byte_count) == (
        1, 0xAB, 3, 300)
    assert stats.match["ipv4_dst"] == "10.0.0.2"
    assert [a.port for a in stats.instructions[0].actions] == [2]
    assert [(p.port_no, p.rx_packets, p.tx_bytes) for p in ports.body] == [
        (1, 5, 900), (2, 0, 0), (3, 0, 0)]
    assert [(g.group_id, g.type, [(b.weight, b.actions[0].port) for b in g.buckets])
            for g in groups.body] == [(5, ofp.OFPGT_SELECT, [(3, 1), (1, 2)]),
                                      (6, ofp.OFPGT_FF, [(0, 2), (0, 1)])]
    too_short = _wire(parser.OFPGroupMod(dp, ofp.OFPGC_ADD, ofp.OFPGT_SELECT, 8, []), 8)
    bad = too_short[:8] + struct.pack("!HBxI", ofp.OFPGC_ADD, ofp.OFPGT_SELECT, 8) + \
        struct.pack("!HHII4x", 64, 1, 0, 0)  # a bucket longer than the message
    bad = bad[:2] + struct.pack("!H", len(bad)) + bad[4:]
    (error,) = _replies(session.receive(bad))
    assert (error.type, error.code) == (ofp.OFPET_GROUP_MOD_FAILED, ofp.OFPGMFC_BAD_BUCKET)
