"""The controller's pure parts beyond the policy: the session state (barriers, programmed
switches, wiring, errors, the status document) and the translation of policy ops into
OpenFlow 1.5 messages, checked offline with os-ken's own parser and by decoding the bytes."""

import struct

import pytest
from os_ken.ofproto import ofproto_parser
from os_ken.ofproto import ofproto_v1_5 as ofp
from os_ken.ofproto import ofproto_v1_5_parser as parser

from controllers.routing.ofmsgs import TRANSLATE, to_messages
from controllers.routing.policy import FabricPolicy
from controllers.routing.tables import CONTROLLER_PORT, ETH_TYPE_IPV4, FlowEntry, GroupEntry, Op, OpKind
from controllers.routing.session import Session
from testbed.model.builders import leaf_spine


@pytest.fixture
def session():
    topo = leaf_spine(2, 2, 1)
    return Session(FabricPolicy(topo))


def test_a_switch_is_programmed_once_every_barrier_is_answered(session):
    session.connected("leaf1")
    session.barrier_sent("leaf1", 10)
    session.barrier_sent("leaf1", 11)
    assert not session.barrier_replied("leaf1", 10)
    assert "leaf1" not in session.programmed
    assert session.barrier_replied("leaf1", 11)
    session.barrier_sent("leaf1", 12)  # new changes: not programmed until acknowledged
    assert "leaf1" not in session.status(0.0, 1)["programmed"]
    assert session.barrier_replied("leaf1", 12)


def test_a_reconnect_forgets_the_barriers_of_the_old_connection(session):
    session.barrier_sent("leaf1", 1)
    session.disconnected("leaf1")
    session.connected("leaf1")
    session.barrier_sent("leaf1", 2)
    assert session.barrier_replied("leaf1", 2)  # xid 1 will never come and is not awaited
    session.barrier_sent("spine1", 3)
    session.connected("spine1")  # reconnected before the answer
    assert session.pending.get("spine1") is None and "spine1" not in session.programmed


def test_wiring_and_errors_reach_the_status(session):
    topo = session.policy.topo
    dpid = {s.name: s.dpid for s in topo.switches}
    # leaf1 port 2 faces spine1 port 1 (hosts_per_leaf = 1): correct
    assert session.lldp_seen(dpid["leaf1"], 2, dpid["spine1"], 1, 1.0)
    assert not session.lldp_seen(dpid["leaf1"], 2, dpid["spine1"], 1, 2.0)  # no change
    assert session.lldp_seen(dpid["leaf1"], 3, dpid["spine1"], 2, 3.0)  # miswired
    session.error("spine2: OpenFlow error type=1 code=2")
    status = session.status(5.0, 42)
    assert status["pid"] == 42 and status["time"] == 5.0
    assert status["wiring_expected"] == 8 and status["wiring_verified"] == 1
    assert len(status["wiring_mismatches"]) == 1 and "leaf1 port 3" in status["wiring_mismatches"][0]
    assert status["errors"] == ["spine2: OpenFlow error type=1 code=2"]
    assert not session.wiring_complete


class FakeDatapath:
    ofproto = ofp
    ofproto_parser = parser
    id = 1


def _wire(msg) -> bytes:
    msg.set_xid(9)
    msg.serialize()
    return bytes(msg.buf)


def _parse(raw: bytes):
    version, msg_type, msg_len, xid = ofproto_parser.header(raw)
    return ofproto_parser.msg(FakeDatapath(), version, msg_type, msg_len, xid, raw)


def test_every_op_kind_has_a_translation():
    assert set(TRANSLATE) == set(OpKind)


def test_flow_ops_round_trip_through_the_openflow_parser():
    dp = FakeDatapath()
    route = FlowEntry(100, (("eth_type", ETH_TYPE_IPV4), ("ipv4_dst", ("10.1.1.0",
                                                                      "255.255.255.0"))),
                      (("group", 3),))
    (add,) = to_messages(dp, Op(OpKind.FLOW_ADD, route))
    back = _parse(_wire(add))
    assert (back.command, back.priority) == (ofp.OFPFC_ADD, 100)
    assert dict(back.match.items()) == {"eth_type": ETH_TYPE_IPV4,
                                        "ipv4_dst": ("10.1.1.0", "255.255.255.0")}
    (inst,) = back.instructions
    assert [type(a).__name__ for a in inst.actions] == ["OFPActionGroup"]
    assert inst.actions[0].group_id == 3
    punt = FlowEntry(300, (("eth_type", 0x88CC),), (("output", CONTROLLER_PORT),))
    back = _parse(_wire(to_messages(dp, Op(OpKind.FLOW_ADD, punt))[0]))
    assert back.instructions[0].actions[0].port == ofp.OFPP_CONTROLLER
    back = _parse(_wire(to_messages(dp, Op(OpKind.FLOW_DEL, route))[0]))
    assert (back.command, back.priority) == (ofp.OFPFC_DELETE_STRICT, 100)
    flows, groups = to_messages(dp, Op(OpKind.CLEAR))
    back = _parse(_wire(flows))
    assert (back.command, back.table_id) == (ofp.OFPFC_DELETE, ofp.OFPTT_ALL)
    assert _parse(_wire(groups)).group_id == ofp.OFPG_ALL
    (barrier,) = to_messages(dp, Op(OpKind.BARRIER))
    assert struct.unpack("!BBHI", _wire(barrier)) == (ofp.OFP_VERSION, ofp.OFPT_BARRIER_REQUEST,
                                                     8, 9)


def test_a_select_group_carries_watched_buckets_and_the_hash_basis():
    # os-ken cannot parse group mods back (its bucket property parser refuses WATCH_PORT), so
    # the bytes are decoded by hand, as OpenFlow 1.5 (section 7.3.4.2) lays them out
    (msg,) = to_messages(FakeDatapath(), Op(OpKind.GROUP_MOD, GroupEntry(7, (3, 4), 0xBEEF)))
    raw = _wire(msg)
    _v, msg_type, length, _xid = struct.unpack_from("!BBHI", raw)
    command, group_type, group_id, buckets_len = struct.unpack_from("!HBxIH", raw, 8)
    assert (msg_type, length, command, group_type, group_id) == (
        ofp.OFPT_GROUP_MOD, len(raw), ofp.OFPGC_MODIFY, ofp.OFPGT_SELECT, 7)
    offset, outputs, watched = 24, [], []
    while offset < 24 + buckets_len:
        blen, actions_len, _bucket_id = struct.unpack_from("!HHI", raw, offset)
        _t, _l, port = struct.unpack_from("!HHI", raw, offset + 8)  # output action
        outputs.append(port)
        prop_type, _pl, watch = struct.unpack_from("!HHI", raw, offset + 8 + actions_len)
        assert prop_type == ofp.OFPGBPT_WATCH_PORT
        watched.append(watch)
        offset += blen
    assert outputs == watched == [3, 4]
    ptype, _plen, experimenter, exp_type = struct.unpack_from("!HHII", raw, offset)
    assert (ptype, experimenter, exp_type) == (0xFFFF, 0x154D, 1)
    assert raw[offset + 16:offset + 32].rstrip(b"\0") == b"hash"
    assert struct.unpack_from("!Q", raw, offset + 32)[0] == 0xBEEF
