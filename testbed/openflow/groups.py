"""OpenFlow 1.5 group bodies both ways, sans I/O: the buckets and properties of a group mod or
a group description read into a :class:`testbed.model.openflow.GroupEntry`, and a group
description (``OFPMP_GROUP_DESC``) packed from one.

A group mod and a group description share their tail: 16 bytes of header, the buckets
(``bucket_array_len`` bytes), then the group's properties up to the end of the group. os-ken's
own parsers read a bucket's properties, and a group description's, up to a length counted from
the wrong offset (past the bucket, past the group into the next one), so these are read here by
their layout and written with os-ken's bucket class. Open vSwitch's ``selection_method`` (an
ONF/NTR experimenter property) carries the hash method and basis; the eBPF switches also read
the switch-local methods from it (``flowlet``, its gap in microseconds in the parameter's high
32 bits, and ``packet``), and a flowlet group's reactive rebalancing from fabriclab's own
experimenter property.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from os_ken.ofproto import ofproto_v1_5 as ofp
from os_ken.ofproto import ofproto_v1_5_parser as parser

from testbed.model.openflow import (FABRICLAB_EXPERIMENTER, FLT_REBALANCE, NTR_EXPERIMENTER,
                                    NTRT_SELECTION_METHOD, GroupEntry)

DESC = struct.Struct(ofp.OFP_GROUP_DESC_STATS_PACK_STR)  # length, type, group id, buckets' length


class BadGroup(ValueError):
    """A group body this switch does not hold (a bucket other than one output)."""


@dataclass(frozen=True)
class Bucket:
    """One bucket as read: its output ports (a switch's bucket has exactly one) and weight."""

    outputs: tuple[int, ...]
    actions: int
    weight: int = 1


def read_buckets(raw: bytes, offset: int, end: int) -> list[Bucket]:
    """The buckets from ``offset`` to ``end``, each read within its own length."""
    out = []
    while offset + ofp.OFP_BUCKET_SIZE <= end:
        (blen,) = struct.unpack_from("!H", raw, offset)
        if blen < ofp.OFP_BUCKET_SIZE or offset + blen > end:
            raise BadGroup(f"bucket of length {blen} at offset {offset}")
        bucket = parser.OFPBucket.parser(raw[offset:offset + blen], 0)
        offset += blen
        outs = tuple(a.port for a in bucket.actions if isinstance(a, parser.OFPActionOutput))
        weight = next((p.weight for p in bucket.properties
                       if isinstance(p, parser.OFPGroupBucketPropWeight)), 1)
        out.append(Bucket(outs, len(bucket.actions), weight))
    return out


#: selection methods: Open vSwitch's (``hash``, ``dp_hash``) and the eBPF switches' local ones
METHODS = ("hash", "dp_hash", "flowlet", "packet", "flowlet_next", "packet_next")


def _experimenter_props(raw: bytes, offset: int, end: int, size: int):
    """The experimenter group properties of at least ``size`` bytes from ``offset`` to
    ``end``: (experimenter, exp_type, offset of the property) each."""
    while offset + 8 <= end:
        ptype, plen = struct.unpack_from("!HH", raw, offset)
        if plen < 8:
            break
        if ptype == 0xFFFF and plen >= size and offset + size <= end:
            yield (*struct.unpack_from("!II", raw, offset + 4), offset)
        offset += (plen + 7) // 8 * 8


def read_selection(raw: bytes, offset: int, end: int) -> tuple[int, str, int]:
    """The group properties from ``offset`` to ``end``: the selection method's (basis, method,
    flowlet gap in us); (0, "hash", 0) when there is none."""
    basis, selection, gap_us = 0, "hash", 0
    for experimenter, exp_type, at in _experimenter_props(raw, offset, end, 40):
        if (experimenter, exp_type) == (NTR_EXPERIMENTER, NTRT_SELECTION_METHOD):
            selection = raw[at + 16:at + 32].rstrip(b"\0").decode(errors="replace")
            param = struct.unpack_from("!Q", raw, at + 32)[0]
            basis = param & 0xFFFFFFFF
            gap_us = param >> 32 if selection.startswith("flowlet") else 0
    return basis, selection, gap_us


def read_rebalance(raw: bytes, offset: int, end: int) -> tuple[int, int]:
    """The group properties from ``offset`` to ``end``: fabriclab's rebalancing property's
    (quality delta, chance), percent; (0, 0) when there is none."""
    for experimenter, exp_type, at in _experimenter_props(raw, offset, end, 16):
        if (experimenter, exp_type) == (FABRICLAB_EXPERIMENTER, FLT_REBALANCE):
            return struct.unpack_from("!BB", raw, at + 12)
    return 0, 0


def rebalance_property(delta_pct: int, chance_pct: int) -> bytes:
    """fabriclab's group property (an experimenter property): a flowlet group's reactive
    rebalancing, its quality delta and chance per packet in percent (1-100 each)."""
    if not (1 <= delta_pct <= 100 and 1 <= chance_pct <= 100):
        raise ValueError(f"rebalancing ({delta_pct}, {chance_pct}) is not two percentages")
    return struct.pack("!HHIIBB2x", 0xFFFF, 16, FABRICLAB_EXPERIMENTER, FLT_REBALANCE,
                       delta_pct, chance_pct)


def entry(group_id: int, kind: int, buckets: list[Bucket], basis: int,
          selection: str, gap_us: int = 0,
          rebalance: tuple[int, int] = (0, 0)) -> GroupEntry:
    """The entry of a SELECT or fast-failover group whose buckets each output to one port."""
    if kind not in (ofp.OFPGT_SELECT, ofp.OFPGT_FF):
        raise BadGroup(f"group {group_id}: type {kind}")
    if any(len(b.outputs) != 1 or b.actions != 1 for b in buckets):
        raise BadGroup(f"group {group_id}: a bucket is not one output")
    ff = kind == ofp.OFPGT_FF
    weights = tuple(b.weight for b in buckets)
    return GroupEntry(group_id, tuple(b.outputs[0] for b in buckets),
                      0 if ff else basis, "hash" if ff else selection,
                      () if ff or all(w == 1 for w in weights) else weights,
                      "ff" if ff else "select", 0 if ff else gap_us,
                      (0, 0) if ff or not selection.startswith("flowlet") else rebalance)


def read_desc(raw: bytes, offset: int) -> tuple[GroupEntry, int]:
    """One group description at ``offset`` of a multipart reply: (its entry, its length)."""
    length, kind, group_id, buckets_len = DESC.unpack_from(raw, offset)
    end = offset + length
    if length < DESC.size or end > len(raw) or DESC.size + buckets_len > length:
        raise BadGroup(f"group description of length {length} at offset {offset}")
    start = offset + DESC.size
    buckets = read_buckets(raw, start, start + buckets_len)
    basis, selection, gap_us = read_selection(raw, start + buckets_len, end)
    rebalance = read_rebalance(raw, start + buckets_len, end)
    return entry(group_id, kind, buckets, basis, selection, gap_us, rebalance), length


def describe(group: GroupEntry) -> str:
    """One group as ``ovs-ofctl dump-groups`` prints it, with the switch-local methods (which
    ovs-ofctl refuses to read) and a flowlet group's gap: ``group_id=3,type=select,
    selection_method=flowlet,flowlet_gap_us=120,bucket=bucket_id:0,watch_port:1,
    actions=output:1,...``."""
    head = f"group_id={group.group_id},type={'select' if group.kind == 'select' else 'ff'}"
    if group.kind == "select":
        head += f",selection_method={group.selection}"
        if group.hash_basis:
            head += f",selection_method_param={group.hash_basis}"
        if group.selection.startswith("flowlet"):
            head += f",flowlet_gap_us={group.gap_us}"
        if any(group.rebalance):
            delta, chance = group.rebalance
            head += f",rebalance_delta={delta}%,rebalance_chance={chance}%"
    weights = group.weights or (None,) * len(group.ports)
    return head + "".join(
        f",bucket=bucket_id:{i},{'' if w is None else f'weight:{w},'}watch_port:{p},"
        f"actions=output:{p}" for i, (p, w) in enumerate(zip(group.ports, weights)))


def selection_property(basis: int, method: str, gap_us: int = 0) -> bytes:
    """Open vSwitch's ``selection_method`` group property: the 5-tuple's fields for ``hash``,
    none for ``dp_hash`` (the datapath hashes the 5-tuple) or the local methods (``flowlet``,
    ``flowlet_next``: ``gap_us`` in the parameter's high 32 bits; ``packet``, ``packet_next``;
    the ``_next`` ones weigh the next switch's port as well)."""
    if method not in METHODS:
        raise ValueError(f"unknown selection method {method!r}")
    if not 0 <= gap_us < 1 << 32:
        raise ValueError(f"flowlet gap {gap_us} us does not fit 32 bits")
    # OXM (OpenFlow basic class) field ids and widths; the "value" of each TLV is its mask
    fields = b"" if method != "hash" else b"".join(
        struct.pack("!HBB", 0x8000, field << 1, width) + b"\xff" * width
        for field, width in ((10, 1), (11, 4), (12, 4), (13, 2), (14, 2), (15, 2), (16, 2)))
    gap = gap_us << 32 if method.startswith("flowlet") else 0
    body = struct.pack("!HHII4x16sQ", 0xFFFF, 40 + len(fields), NTR_EXPERIMENTER,
                       NTRT_SELECTION_METHOD, method.encode(),
                       (basis & 0xFFFFFFFF) | gap) + fields
    return body + b"\0" * (-len(body) % 8)


def buckets(group: GroupEntry) -> list:
    """os-ken bucket objects of ``group``: one output each, watching its port, weighted when
    the group has weights."""
    weights = group.weights or (None,) * len(group.ports)
    return [parser.OFPBucket(
        bucket_id=i, actions=[parser.OFPActionOutput(p)],
        properties=[parser.OFPGroupBucketPropWatch(type_=ofp.OFPGBPT_WATCH_PORT, watch=p)]
        + ([parser.OFPGroupBucketPropWeight(type_=ofp.OFPGBPT_WEIGHT, weight=w)]
           if w is not None else []))
        for i, (p, w) in enumerate(zip(group.ports, weights))]


def desc(group: GroupEntry) -> bytes:
    """``group``'s description, as a switch answers ``OFPMP_GROUP_DESC``."""
    buf = bytearray()
    for bucket in buckets(group):
        bucket.serialize(buf, len(buf))
    ff = group.kind == "ff"
    props = b"" if ff else selection_property(group.hash_basis, group.selection, group.gap_us)
    if not ff and any(group.rebalance):
        props += rebalance_property(*group.rebalance)
    return DESC.pack(DESC.size + len(buf) + len(props), ofp.OFPGT_FF if ff else ofp.OFPGT_SELECT,
                     group.group_id, len(buf)) + bytes(buf) + props
