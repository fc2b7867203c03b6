"""OpenFlow 1.3 where it differs from 1.5, for an eBPF switch's session (sans I/O): the port
structure (a fixed 64 bytes, no properties) in port descriptions and port status, port and
flow statistics (``OFPMP_FLOW``: statistics and instructions in one entry), packet-out (an
``in_port`` field, not a match), and group mods and descriptions (buckets with weight and
watch port, no properties; 1.3 has no selection method, so a SELECT group hashes with basis 0).

Everything else a switch says (hello, features, configuration, echo, barrier, errors,
description, packet-in, the multipart framing, flow mod matches) has the same layout in both
versions; :mod:`testbed.openflow.session` uses this module when the controller speaks 1.3
(most Ryu and os-ken apps and tutorials). os-ken's 1.3 parser reads requests; replies are
packed with its 1.3 layouts and parsed back by it in the unit tests.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable

from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as parser

from testbed.model.openflow import FlowEntry, GroupEntry
from testbed.openflow import groups, replies
from testbed.openflow.replies import PortCounters

VERSION = ofp.OFP_VERSION  # 0x04
#: a port's speed in the port structure's bitmaps (10 Gbit/s copper; the rate is in curr_speed)
_FEATURES = ofp.OFPPF_10GB_FD | ofp.OFPPF_COPPER


def port(number: int, name: str, mac: str, live: bool, speed_kbps: int) -> bytes:
    """``ofp_port``: number, address, name, state (live or link down) and speed."""
    state = ofp.OFPPS_LIVE if live else ofp.OFPPS_LINK_DOWN
    return struct.pack(ofp.OFP_PORT_PACK_STR, number, bytes.fromhex(mac.replace(":", "")),
                       name.encode()[:15], 0, state, _FEATURES, _FEATURES, _FEATURES, 0,
                       speed_kbps, speed_kbps)


def port_status(reason: int, body: bytes) -> bytes:
    """The body of a port status message (``body``: :func:`port`'s)."""
    return struct.pack("!B7x", reason) + body


def port_stats(counters: dict[int, PortCounters], port_no: int,
               duration_s: float) -> list[bytes]:
    """Port statistics of every port (``OFPP_ANY``) or of ``port_no``."""
    sec, nsec = int(duration_s), int((duration_s % 1) * 1e9)
    return [struct.pack(ofp.OFP_PORT_STATS_PACK_STR, number, c.rx_packets, c.tx_packets,
                        c.rx_bytes, c.tx_bytes, c.rx_dropped, c.tx_dropped, c.rx_errors,
                        c.tx_errors, 0, 0, 0, 0, sec, nsec)
            for number, c in sorted(counters.items()) if port_no in (ofp.OFPP_ANY, number)]


def flows(entries: Iterable[FlowEntry], counts: Callable, age: Callable) -> list[bytes]:
    """``OFPMP_FLOW`` entries: each flow's match, counters, age and instructions."""
    out = []
    for entry in entries:
        match = replies.match_bytes(entry.match, parser)
        inst = replies.instructions(entry.actions, parser)
        packets, nbytes = counts(entry)
        seconds = age(entry)
        length = ofp.OFP_FLOW_STATS_0_SIZE + len(match) + len(inst)
        out.append(struct.pack(ofp.OFP_FLOW_STATS_0_PACK_STR, length, 0, int(seconds),
                               int(seconds % 1 * 1e9), entry.priority, 0, 0, 0, entry.cookie,
                               packets, nbytes) + match + inst)
    return out


def packet_out(raw: bytes) -> tuple[int, list, bytes]:
    """A packet-out: (its ``in_port``, its actions as os-ken's, the frame)."""
    _buffer, in_port, actions_len = struct.unpack_from(ofp.OFP_PACKET_OUT_PACK_STR, raw,
                                                       replies.HEADER.size)
    offset = ofp.OFP_PACKET_OUT_SIZE
    actions = replies.read_actions(raw, offset, actions_len, parser)
    return in_port, actions, raw[offset + actions_len:]


def group_mod(raw: bytes) -> tuple[int, int, int, list[groups.Bucket]]:
    """A group mod: (command, type, group id, buckets).

    Raises:
        groups.BadGroup: a bucket that runs past the message.
    """
    command, kind, group_id = struct.unpack_from(ofp.OFP_GROUP_MOD_PACK_STR, raw,
                                                 replies.HEADER.size)
    return command, kind, group_id, _buckets(raw, ofp.OFP_GROUP_MOD_SIZE, len(raw))


def _buckets(raw: bytes, offset: int, end: int) -> list[groups.Bucket]:
    out = []
    while offset + ofp.OFP_BUCKET_SIZE <= end:
        (blen,) = struct.unpack_from("!H", raw, offset)
        if blen < ofp.OFP_BUCKET_SIZE or offset + blen > end:
            raise groups.BadGroup(f"bucket of length {blen} at offset {offset}")
        bucket = parser.OFPBucket.parser(raw, offset)
        offset += blen
        outs = tuple(a.port for a in bucket.actions if isinstance(a, parser.OFPActionOutput))
        out.append(groups.Bucket(outs, len(bucket.actions), bucket.weight or 1))
    return out


def group_desc(group: GroupEntry) -> bytes:
    """One group's description (``OFPMP_GROUP_DESC``)."""
    ff = group.kind == "ff"
    weights = group.weights or (1,) * len(group.ports)
    buf = bytearray()
    for number, weight in zip(group.ports, weights):
        bucket = parser.OFPBucket(0 if ff else weight, number if ff else ofp.OFPP_ANY,
                                  ofp.OFPG_ANY, [parser.OFPActionOutput(number)])
        bucket.serialize(buf, len(buf))
    return struct.pack(ofp.OFP_GROUP_DESC_PACK_STR, ofp.OFP_GROUP_DESC_SIZE + len(buf),
                       ofp.OFPGT_FF if ff else ofp.OFPGT_SELECT, group.group_id) + bytes(buf)
