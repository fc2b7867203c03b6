"""Policy ops -> OpenFlow 1.5 messages (os-ken's parser classes), and the one property os-ken
has no class for: Open vSwitch's ``selection_method=hash`` group property.

The translation needs only a datapath's ``ofproto`` and ``ofproto_parser`` modules, so it is
tested offline against os-ken's own OpenFlow 1.5 parser (serialize, then parse back).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from controllers.policy import CONTROLLER_PORT, FlowEntry, GroupEntry, Op, OpKind


class HashSelection:
    """Open vSwitch's group property ``selection_method=hash`` (an ONF/NTR experimenter
    property of OpenFlow 1.5 group mods): the switch hashes the 5-tuple with ``basis`` to pick a
    bucket, in the slow path, so the datapath needs no recirculation (OVS's default, dp_hash,
    recirculates every packet and seeds every switch alike)."""

    EXPERIMENTER_NTR = 0x0000154D
    NTRT_SELECTION_METHOD = 1
    OFPGPT_EXPERIMENTER = 0xFFFF
    # OXM (OpenFlow basic class) field ids and widths; the "value" of each TLV is its mask
    FIELDS = ((10, 1), (11, 4), (12, 4), (13, 2), (14, 2), (15, 2), (16, 2))

    def __init__(self, basis: int) -> None:
        self.basis = basis

    def serialize(self) -> bytes:
        fields = b"".join(struct.pack("!HBB", 0x8000, field << 1, width) + b"\xff" * width
                          for field, width in self.FIELDS)
        length = 40 + len(fields)
        body = struct.pack("!HHII4x16sQ", self.OFPGPT_EXPERIMENTER, length,
                           self.EXPERIMENTER_NTR, self.NTRT_SELECTION_METHOD, b"hash",
                           self.basis) + fields
        return body + b"\0" * (-len(body) % 8)


def _clear(dp, _op: Op) -> list:
    ofp, parser = dp.ofproto, dp.ofproto_parser
    return [parser.OFPFlowMod(dp, command=ofp.OFPFC_DELETE, table_id=ofp.OFPTT_ALL,
                              out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY,
                              match=parser.OFPMatch()),
            parser.OFPGroupMod(dp, command=ofp.OFPGC_DELETE, group_id=ofp.OFPG_ALL)]


def _barrier(dp, _op: Op) -> list:
    return [dp.ofproto_parser.OFPBarrierRequest(dp)]


def _group(command: str) -> Callable[[object, Op], list]:
    def build(dp, op: Op) -> list:
        ofp, parser = dp.ofproto, dp.ofproto_parser
        entry: GroupEntry = op.entry
        buckets = [parser.OFPBucket(
            bucket_id=i, actions=[parser.OFPActionOutput(p)],
            properties=[parser.OFPGroupBucketPropWatch(type_=ofp.OFPGBPT_WATCH_PORT, watch=p)])
            for i, p in enumerate(entry.ports)]
        props = [] if op.kind == OpKind.GROUP_DEL else [HashSelection(entry.hash_basis)]
        return [parser.OFPGroupMod(dp, command=getattr(ofp, command), type_=ofp.OFPGT_SELECT,
                                   group_id=entry.group_id, buckets=buckets, properties=props)]
    return build


def _flow_add(dp, op: Op) -> list:
    ofp, parser = dp.ofproto, dp.ofproto_parser
    entry: FlowEntry = op.entry
    actions = []
    for name, value in entry.actions:
        if name == "output":
            port = ofp.OFPP_CONTROLLER if value == CONTROLLER_PORT else value
            actions.append(parser.OFPActionOutput(port, ofp.OFPCML_NO_BUFFER))
        elif name == "group":
            actions.append(parser.OFPActionGroup(value))
        else:
            raise ValueError(f"unknown action {name}")
    inst = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions)] if actions else []
    return [parser.OFPFlowMod(dp, command=ofp.OFPFC_ADD, priority=entry.priority,
                              match=parser.OFPMatch(**dict(entry.match)), instructions=inst)]


def _flow_del(dp, op: Op) -> list:
    ofp, parser = dp.ofproto, dp.ofproto_parser
    entry: FlowEntry = op.entry
    return [parser.OFPFlowMod(dp, command=ofp.OFPFC_DELETE_STRICT, priority=entry.priority,
                              out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY,
                              match=parser.OFPMatch(**dict(entry.match)))]


TRANSLATE: dict[OpKind, Callable[[object, Op], list]] = {
    OpKind.CLEAR: _clear,
    OpKind.BARRIER: _barrier,
    OpKind.GROUP_ADD: _group("OFPGC_ADD"),
    OpKind.GROUP_MOD: _group("OFPGC_MODIFY"),
    OpKind.GROUP_DEL: _group("OFPGC_DELETE"),
    OpKind.FLOW_ADD: _flow_add,
    OpKind.FLOW_DEL: _flow_del,
}


def to_messages(dp, op: Op) -> list:
    """The OpenFlow 1.5 messages of one policy op for datapath ``dp``."""
    return TRANSLATE[op.kind](dp, op)
