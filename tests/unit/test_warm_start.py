"""A restarted controller's warm start: a switch's tables read back over OpenFlow (flow and
group descriptions, as the eBPF switches answer them and os-ken parses them) and adopted by the
policy, which then changes only what differs and never clears."""

from __future__ import annotations

import socket
import struct

import pytest
from os_ken.ofproto import ofproto_parser, ofproto_protocol
from os_ken.ofproto import ofproto_v1_5 as ofp
from os_ken.ofproto import ofproto_v1_5_parser as parser

from controllers.routing.ofmsgs import GroupDesc, flow_entry, read_groups_by_layout, to_messages
from controllers.routing.adaptive import FlowKey
from controllers.routing.policy import FabricPolicy
from controllers.routing.tables import (
    FLOW_COOKIE,
    PRIORITY_FLOW,
    FlowEntry,
    OpKind,
    SwitchTables,
    adopt,
    canonical,
    diff_tables,
)
from fabriclab.cli.tables import controller_event
from fabriclab.model.document import ControllerEvent
from testbed.model.builders import fat_tree, leaf_spine
from testbed.model.openflow import GroupEntry
from testbed.model.spec import Routing
from testbed.openflow import groups
from testbed.openflow.session import Port, SwitchSession
from tests.unit.test_switch_agent import _read_messages, edge_agent
from tests.unit.test_switch_session import FakeDatapath, _wire

read_groups_by_layout()

GROUPS = [GroupEntry(7, (1, 2, 3), 0xDEADBEEF, "hash", (10, 20, 30)),
          GroupEntry(8, (4, 5), kind="ff"),
          GroupEntry(9, (1, 2), 5, "dp_hash")]


def _parse(raw: bytes):
    version, msg_type, length, xid = ofproto_parser.header(raw)
    desc = ofproto_protocol.ProtocolDesc(version=ofp.OFP_VERSION)
    return ofproto_parser.msg(desc, version, msg_type, length, xid, raw[:length])


def _group_reply(body: bytes) -> bytes:
    return (struct.pack("!BBHI", ofp.OFP_VERSION, ofp.OFPT_MULTIPART_REPLY, 16 + len(body), 5)
            + struct.pack(ofp.OFP_MULTIPART_REPLY_PACK_STR, ofp.OFPMP_GROUP_DESC, 0) + body)


def test_group_descriptions_read_back_as_they_were_written():
    """Every kind of group survives desc -> bytes -> read, alone and in a reply of several
    (os-ken's own parser misreads every group but a reply's last)."""
    raw = b"".join(groups.desc(g) for g in GROUPS)
    at, read = 0, []
    while at < len(raw):
        entry, length = groups.read_desc(raw, at)
        read.append(entry)
        at += length
    assert read == GROUPS
    msg = _parse(_group_reply(raw))
    assert [part.entry for part in msg.body] == GROUPS


def test_a_malformed_group_description_is_reported_not_looped_on():
    bad = struct.pack("!HBxIH6x", 0, ofp.OFPGT_SELECT, 3, 0)  # length 0
    part = GroupDesc(bad + groups.desc(GROUPS[0]), 0)
    assert part.entry is None and "length 0" in part.error and part.length > 0
    worse = groups.desc(GroupEntry(4, (1,)))[:-8]  # cut short
    assert GroupDesc(worse, 0).entry is None


def test_the_switch_session_answers_group_descriptions_and_carries_its_tables():
    ports = [Port(n, f"p{n}", f"02:00:00:00:00:{n:02x}") for n in range(1, 6)]
    session = SwitchSession(1, ports)
    session.groups = {g.group_id: g for g in GROUPS}
    session.flows = {(100, ()): FlowEntry(100, (), (("group", 7),))}
    session.flow_added = {(100, ()): 12.0}
    dp = FakeDatapath()
    everything = _parse(session.receive(_wire(parser.OFPGroupDescStatsRequest(dp, 0,
                                                                              ofp.OFPG_ALL))))
    assert [p.entry for p in everything.body] == GROUPS
    one = _parse(session.receive(_wire(parser.OFPGroupDescStatsRequest(dp, 0, 8))))
    assert [p.entry for p in one.body] == [GROUPS[1]]
    after = SwitchSession(1, ports).carry(session)
    assert (after.flows, after.groups, after.flow_added) == \
        (session.flows, session.groups, session.flow_added)


def test_a_route_read_back_in_the_switchs_form_is_not_changed():
    """A /32 reads back unmasked and fields come in the switch's order: the same entry, so no
    add under one form and delete under the other (which deleted the route on a switch)."""
    desired = SwitchTables()
    host = FlowEntry(200, (("eth_type", 0x800), ("ipv4_dst", ("10.0.1.1", "255.255.255.255"))),
                     (("output", 1),))
    prefix = FlowEntry(100, (("eth_type", 0x800), ("ipv4_dst", ("10.0.2.0", "255.255.255.0"))),
                       (("group", 2),))
    for flow in (host, prefix):
        desired.add_flow(flow)
    found = SwitchTables()
    found.add_flow(FlowEntry(200, (("ipv4_dst", "10.0.1.1"), ("eth_type", 0x800)),
                             (("output", 1),)))
    found.add_flow(FlowEntry(100, tuple(sorted(prefix.match)), prefix.actions))
    assert canonical(found.flows[next(iter(found.flows))].match) == canonical(host.match)
    assert diff_tables(adopt(desired, found), desired) == []


def _warm_policy(topo, found: dict[str, SwitchTables], routing=Routing.ECMP):
    """A new policy that meets every switch with ``found`` as its tables; the ops by switch."""
    policy = FabricPolicy(topo, routing)
    sent = {}
    for sw in topo.switches:
        ports = {p: (l.end(sw.name).ifname, True) for p, l in topo.ports(sw.name).items()}
        sent[sw.name] = policy.switch_connected(sw.dpid, ports, 1.0, found.get(sw.name,
                                                                               SwitchTables()))
        for name, ops in policy.reconcile().items():
            sent.setdefault(name, []).extend(ops)
    return policy, sent


def test_a_warm_start_on_unchanged_switches_sends_nothing_and_never_clears():
    topo = fat_tree(4)
    before = FabricPolicy(topo).desired()
    found = {name: SwitchTables({f.key: f for f in t.flows.values()}, dict(t.groups))
             for name, t in before.items()}
    _, sent = _warm_policy(topo, found)
    assert all(ops == [] for ops in sent.values()), {k: v[:3] for k, v in sent.items() if v}


def test_a_warm_start_changes_only_what_differs():
    topo = leaf_spine(2, 2, 2)
    before = FabricPolicy(topo).desired()
    found = {name: SwitchTables(dict(t.flows), dict(t.groups)) for name, t in before.items()}
    leaf = found["leaf1"]
    missing = next(f for f in leaf.flows.values() if f.priority == 200)
    del leaf.flows[missing.key]
    stray = FlowEntry(123, (("eth_type", 0x800),), (("output", 1),))
    leaf.add_flow(stray)
    gid, group = next(iter(found["spine1"].groups.items()))
    found["spine1"].groups[gid] = GroupEntry(gid, group.ports, group.hash_basis + 1,
                                             group.selection)
    _, sent = _warm_policy(topo, found)
    kinds = {name: [(op.kind, op.entry) for op in ops] for name, ops in sent.items()}
    assert kinds["leaf1"] == [(OpKind.FLOW_ADD, missing), (OpKind.FLOW_DEL, stray),
                              (OpKind.BARRIER, None)]
    assert [k for k, _ in kinds["spine1"]] == [OpKind.GROUP_MOD, OpKind.BARRIER]
    assert not any(k == OpKind.CLEAR for ops in kinds.values() for k, _ in ops)
    assert kinds["leaf2"] == [] and kinds["spine2"] == []


def test_a_warm_start_relearns_the_adaptive_modes_flows():
    topo = leaf_spine(2, 2, 2)
    src, dst = topo.hosts[0], topo.hosts[-1]
    key = FlowKey(src.ip, dst.ip, 6, 40000, 5201)
    learner = FabricPolicy(topo, Routing.ADAPTIVE)
    learner.adaptive.new_flow(key, 0.0)
    found = {name: SwitchTables(dict(t.flows), dict(t.groups))
             for name, t in learner.desired().items()}
    access = [f for t in found.values() for f in t.flows.values()
              if f.cookie == FLOW_COOKIE and f.priority == PRIORITY_FLOW]
    assert access  # the flow's entry at its source switch
    policy, sent = _warm_policy(topo, found, Routing.ADAPTIVE)
    assert key in policy.adaptive.flows
    assert not any(op.kind == OpKind.FLOW_DEL and op.entry in access
                   for ops in sent.values() for op in ops)


def test_the_ebpf_agent_keeps_its_tables_for_the_next_controller(tmp_path):
    """A controller programs a switch and goes; the switch connects again and a warm
    controller reads back exactly what the first one installed, then has nothing to change."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(5)
        agent, topo = edge_agent(server)
        want = FabricPolicy(topo).desired()["edge1_1"]
        agent.start()
        try:
            dp = FakeDatapath()
            first, _ = server.accept()
            with first:
                ops = diff_tables(None, want)
                first.sendall(_wire(parser.OFPHello(dp), 1) + b"".join(
                    _wire(m, 10 + i) for i, op in enumerate(ops) for m in to_messages(dp, op)))
                _read_messages(first, parser.OFPBarrierReply)
            second, _ = server.accept()
            with second:
                second.sendall(_wire(parser.OFPHello(dp), 1) + _wire(
                    parser.OFPFlowDescStatsRequest(dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY,
                                                   ofp.OFPG_ANY, 0, 0, parser.OFPMatch()), 2)
                    + _wire(parser.OFPGroupDescStatsRequest(dp, 0, ofp.OFPG_ALL), 3))
                got = _read_messages(second, parser.OFPGroupDescStatsReply)
                flows_reply = _read_messages(second, parser.OFPFlowDescStatsReply) if not any(
                    isinstance(m, parser.OFPFlowDescStatsReply) for m in got) else got
        finally:
            agent.stop()
    flows = [flow_entry(part) for m in flows_reply
             if isinstance(m, parser.OFPFlowDescStatsReply) for part in m.body]
    group_parts = [p for m in got if isinstance(m, parser.OFPGroupDescStatsReply) for p in m.body]
    found = SwitchTables({f.key: f for f in flows}, {p.entry.group_id: p.entry
                                                     for p in group_parts})
    assert len(found.flows) == len(want.flows) and found.groups == want.groups
    assert diff_tables(adopt(want, found), want) == []


@pytest.mark.parametrize("event, says", [
    ({"event": "died", "cause": "killed by SIGKILL", "pid": 7}, "killed by SIGKILL (pid 7)"),
    ({"event": "restarted", "outage_s": 1.2, "flows_read": 20, "groups_read": 6,
      "switches_read": 4, "changes": {}}, "restarted warm in 1.20 s"),
    ({"event": "restarted", "outage_s": 1.2, "changes": {"flow_add": 2}}, "2 flow_add"),
    ({"event": "restart failed", "cause": "no port"}, "restart failed: no port")])
def test_the_console_says_what_happened_to_the_controller(event, says):
    assert says in controller_event(ControllerEvent.from_json(event))
