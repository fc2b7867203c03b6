"""Policy ops -> OpenFlow 1.5 messages (os-ken's parser classes), and the one property os-ken
has no class for: Open vSwitch's ``selection_method`` group property.

The translation needs only a datapath's ``ofproto`` and ``ofproto_parser`` modules, so it is
tested offline against os-ken's own OpenFlow 1.5 parser (serialize, then parse back).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from controllers.routing.tables import CONTROLLER_PORT, FlowEntry, GroupEntry, Op, OpKind
from testbed.openflow import groups, replies


class HashSelection:
    """Open vSwitch's group property ``selection_method`` (an ONF/NTR experimenter property of
    OpenFlow 1.5 group mods), with the switch's ``basis``:

    * ``hash``: the switch hashes the 5-tuple fields listed in the property, in the slow path:
      no recirculation, and ``ofproto/trace`` resolves the bucket, but every new 5-tuple (a
      sprayed packet's new source port) is an upcall and a datapath flow of its own;
    * ``dp_hash``: the datapath hashes the 5-tuple (``hash(l4(basis))``, the basis in the low
      32 bits of the parameter, algorithm 0 above) and recirculates; its flows match the hash's
      bucket bits only, so spraying costs no upcalls, but a trace stops at the recirculation.

    The eBPF switches read the same property for their switch-local methods, ``flowlet``
    (``gap_us``) and ``packet`` (:class:`testbed.model.openflow.GroupEntry`).
    """

    def __init__(self, basis: int, method: str = "hash", gap_us: int = 0) -> None:
        if method not in groups.METHODS:
            raise ValueError(f"unknown selection method {method!r}")
        self.basis = basis
        self.method = method
        self.gap_us = gap_us

    def serialize(self) -> bytes:
        return groups.selection_property(self.basis, self.method, self.gap_us)


class Rebalance:
    """fabriclab's group property: a flowlet group's reactive rebalancing (quality delta and
    chance per packet, percent), which the eBPF switches read."""

    def __init__(self, delta_pct: int, chance_pct: int) -> None:
        self.delta_pct, self.chance_pct = delta_pct, chance_pct

    def serialize(self) -> bytes:
        return groups.rebalance_property(self.delta_pct, self.chance_pct)


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
        buckets = groups.buckets(entry)
        ff = entry.kind == "ff"
        props = [] if op.kind == OpKind.GROUP_DEL or ff else [
            HashSelection(entry.hash_basis, entry.selection, entry.gap_us)] + (
            [Rebalance(*entry.rebalance)] if any(entry.rebalance) else [])
        return [parser.OFPGroupMod(dp, command=getattr(ofp, command),
                                   type_=ofp.OFPGT_FF if ff else ofp.OFPGT_SELECT,
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
        elif name == "punt":  # a copy of the first ``value`` bytes to the controller
            actions.append(parser.OFPActionOutput(ofp.OFPP_CONTROLLER, value))
        else:
            raise ValueError(f"unknown action {name}")
    inst = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions)] if actions else []
    command = ofp.OFPFC_MODIFY_STRICT if op.kind == OpKind.FLOW_MOD else ofp.OFPFC_ADD
    return [parser.OFPFlowMod(dp, cookie=entry.cookie, command=command,
                              priority=entry.priority, match=parser.OFPMatch(**dict(entry.match)),
                              instructions=inst)]


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
    OpKind.FLOW_MOD: _flow_add,
    OpKind.FLOW_DEL: _flow_del,
}


def to_messages(dp, op: Op) -> list:
    """The OpenFlow 1.5 messages of one policy op for datapath ``dp``."""
    return TRANSLATE[op.kind](dp, op)


# -- what a switch holds, read back (a warm start) ---------------------------------------------
def flow_entry(stat) -> FlowEntry | None:
    """The entry of one ``OFPMP_FLOW_DESC`` part as the tables hold it (its match's fields
    sorted by name), or None for an entry no policy installs (instructions other than apply
    actions, actions other than output and group)."""
    actions = replies.actions_of(stat.instructions)
    if actions is None:
        return None
    return FlowEntry(stat.priority, tuple(sorted(stat.match.items())), actions, stat.cookie)


class GroupDesc:
    """One ``OFPMP_GROUP_DESC`` part read by :mod:`testbed.openflow.groups` (``entry``: None for
    a group no policy installs, ``error`` says why)."""

    def __init__(self, raw: bytes, offset: int) -> None:
        (self.length,) = struct.unpack_from("!H", raw, offset)
        self.entry, self.error = None, ""
        try:
            self.entry, _ = groups.read_desc(raw, offset)
        except (groups.BadGroup, struct.error) as err:
            self.error = str(err)
        if self.length < groups.DESC.size:  # the reply's loop must move on
            self.length = len(raw) - offset

    @classmethod
    def parser(cls, buf, offset: int) -> GroupDesc:
        return cls(bytes(buf), offset)


def read_groups_by_layout() -> None:
    """Make os-ken read group descriptions with :class:`GroupDesc`: its own parser reads a
    group's properties up to a length counted past the group (into the next group's header),
    which misreads every group but the last one of a reply and can loop on a zero length."""
    from os_ken.ofproto import ofproto_v1_5_parser
    ofproto_v1_5_parser.OFPGroupDescStatsReply.cls_stats_body_cls = GroupDesc
