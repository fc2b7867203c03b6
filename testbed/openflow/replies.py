"""What an eBPF switch sends its controller beyond the handshake, as OpenFlow 1.5 bytes (sans
I/O): packet-ins, and the multipart replies for switch description, port statistics and flow
statistics (``OFPMP_FLOW_DESC``, ``OFPMP_FLOW_STATS``). os-ken parses these messages but does not
serialize them (a controller never sends them), so they are packed here with its ofproto
layouts; the unit tests parse every one back with os-ken's own parser.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

from os_ken.ofproto import ofproto_v1_5 as ofp
from os_ken.ofproto import ofproto_v1_5_parser as parser

from testbed.model.openflow import CONTROLLER_PORT, FlowEntry

HEADER = struct.Struct(ofp.OFP_HEADER_PACK_STR)
#: a multipart reply's parts go in messages of at most this many bytes (OpenFlow's length is 16
#: bits); every message but the last says ``OFPMPF_REPLY_MORE``
MAX_MESSAGE = 65_000


@dataclass(frozen=True)
class PortCounters:
    """One port's counters, as the kernel keeps them for its interface."""

    rx_packets: int = 0
    tx_packets: int = 0
    rx_bytes: int = 0
    tx_bytes: int = 0
    rx_dropped: int = 0
    tx_dropped: int = 0
    rx_errors: int = 0
    tx_errors: int = 0


def message(msg_type: int, xid: int, body: bytes, version: int = ofp.OFP_VERSION) -> bytes:
    return HEADER.pack(version, msg_type, HEADER.size + len(body), xid) + body


def _padded(data: bytes | bytearray) -> bytes:
    return bytes(data) + b"\0" * (-len(data) % 8)


def match_bytes(match: Iterable[tuple[str, object]], of_parser=parser) -> bytes:
    """A match as OXM fields, padded (the same bytes in OpenFlow 1.3 and 1.5)."""
    buf = bytearray()
    of_parser.OFPMatch(**dict(match)).serialize(buf, 0)
    return _padded(buf)


def packet_in(port: int, total_len: int, data: bytes, reason: int = ofp.OFPR_APPLY_ACTION,
              cookie: int = 0xFFFFFFFFFFFFFFFF, version: int = ofp.OFP_VERSION) -> bytes:
    """A packet (``data``: its first bytes, ``total_len`` of them in all) that came in on
    ``port``, for the controller (not buffered: the data is all there is). OpenFlow 1.3's
    packet-in has the same layout (``version``)."""
    body = struct.pack(ofp.OFP_PACKET_IN_PACK_STR, ofp.OFP_NO_BUFFER, total_len, reason, 0,
                       cookie)
    return message(ofp.OFPT_PACKET_IN, 0,
                   body + match_bytes([("in_port", port)]) + b"\0\0" + data, version)


def multipart(mp_type: int, xid: int, parts: list[bytes], version: int = ofp.OFP_VERSION
              ) -> bytes:
    """A multipart reply of ``parts``, in as many messages as their length needs."""
    out, chunk, size = [], [], 0
    for part in parts:
        if chunk and size + len(part) > MAX_MESSAGE:
            out.append((chunk, ofp.OFPMPF_REPLY_MORE))
            chunk, size = [], 0
        chunk.append(part)
        size += len(part)
    out.append((chunk, 0))
    return b"".join(message(ofp.OFPT_MULTIPART_REPLY, xid,
                            struct.pack(ofp.OFP_MULTIPART_REPLY_PACK_STR, mp_type, flags)
                            + b"".join(c), version) for c, flags in out)


def desc(dpid: int) -> bytes:
    """The switch description."""
    return struct.pack(ofp.OFP_DESC_PACK_STR, b"fabriclab", b"eBPF switch (tc, clsact)",
                       b"fabriclab", f"{dpid:016x}".encode(), b"testbed/switch")


def port_stats(counters: dict[int, PortCounters], port_no: int,
               duration_s: float) -> list[bytes]:
    """Port statistics of every port (``OFPP_ANY``) or of ``port_no``."""
    sec, nsec = int(duration_s), int((duration_s % 1) * 1e9)
    eth = struct.pack(ofp.OFP_PORT_STATS_PROP_ETHERNET_PACK_STR, ofp.OFPPSPT_ETHERNET,
                      ofp.OFP_PORT_STATS_PROP_ETHERNET_SIZE, 0, 0, 0, 0)
    return [struct.pack(ofp.OFP_PORT_STATS_PACK_STR, ofp.OFP_PORT_STATS_SIZE + len(eth), number,
                        sec, nsec, c.rx_packets, c.tx_packets, c.rx_bytes, c.tx_bytes,
                        c.rx_dropped, c.tx_dropped, c.rx_errors, c.tx_errors) + eth
            for number, c in sorted(counters.items())
            if port_no in (ofp.OFPP_ANY, number)]


def _stats(packets: int, nbytes: int, duration_s: float) -> bytes:
    buf = bytearray()
    sec, nsec = int(duration_s), int((duration_s % 1) * 1e9)
    parser.OFPStats(duration=(sec, nsec), packet_count=packets, byte_count=nbytes) \
        .serialize(buf, 0)
    return _padded(buf)


def instructions(actions: tuple[tuple[str, object], ...], of_parser=parser) -> bytes:
    """A flow's actions as one apply-actions instruction (the same bytes in 1.3 and 1.5)."""
    acts = []
    for name, value in actions:
        if name == "output":
            port = ofp.OFPP_CONTROLLER if value == CONTROLLER_PORT else int(value)
            acts.append(of_parser.OFPActionOutput(port, ofp.OFPCML_NO_BUFFER))
        elif name == "group":
            acts.append(of_parser.OFPActionGroup(int(value)))
        elif name == "punt":
            acts.append(of_parser.OFPActionOutput(ofp.OFPP_CONTROLLER, int(value)))
    if not acts:
        return b""
    buf = bytearray()
    of_parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, acts).serialize(buf, 0)
    return bytes(buf)


@dataclass(frozen=True)
class FlowQuery:
    """A flow statistics request: the flows whose cookie matches under ``cookie_mask`` and whose
    match includes every field of ``match``."""

    cookie: int = 0
    cookie_mask: int = 0
    match: tuple[tuple[str, object], ...] = ()

    @classmethod
    def parse(cls, raw: bytes, of_parser=parser) -> FlowQuery:
        """The query of a multipart request's body (``raw``: the whole message; the same
        layout in 1.3 and 1.5)."""
        at = ofp.OFP_MULTIPART_REQUEST_SIZE
        _table, _out_port, _out_group, cookie, mask = struct.unpack_from(
            ofp.OFP_FLOW_STATS_REQUEST_0_PACK_STR, raw, at)
        match = of_parser.OFPMatch.parser(raw, at + struct.calcsize(
            ofp.OFP_FLOW_STATS_REQUEST_0_PACK_STR))
        return cls(cookie, mask, tuple(sorted(match.items())))

    def selects(self, flow: FlowEntry) -> bool:
        if (flow.cookie & self.cookie_mask) != (self.cookie & self.cookie_mask):
            return False
        return set(self.match) <= set(flow.match)


def flows(entries: Iterable[FlowEntry], counts, age, with_actions: bool) -> list[bytes]:
    """``OFPMP_FLOW_DESC`` (``with_actions``) or ``OFPMP_FLOW_STATS`` entries of ``entries``;
    ``counts(entry)`` gives an entry's (packets, bytes), ``age(entry)`` its seconds installed."""
    out = []
    for entry in entries:
        match, stats = match_bytes(entry.match), _stats(*counts(entry), age(entry))
        if with_actions:
            inst = instructions(entry.actions)
            length = ofp.OFP_FLOW_DESC_0_SIZE + len(match) + len(stats) + len(inst)
            out.append(struct.pack(ofp.OFP_FLOW_DESC_0_PACK_STR, length, 0, entry.priority,
                                   0, 0, 0, 0, entry.cookie) + match + stats + inst)
        else:
            length = ofp.OFP_FLOW_STATS_0_SIZE + len(match) + len(stats)
            out.append(struct.pack(ofp.OFP_FLOW_STATS_0_PACK_STR, length, 0,
                                   ofp.OFPFSR_STATS_REQUEST, entry.priority) + match + stats)
    return out


def read_actions(raw: bytes, offset: int, length: int, of_parser=parser) -> list:
    """The actions of ``length`` bytes at ``offset`` of a message (a packet-out's), as
    os-ken's.

    Raises:
        ValueError: actions that run past the message, or one shorter than an action can be.
    """
    end = offset + length
    if end > len(raw):
        raise ValueError(f"actions of {length} bytes in a message of {len(raw)}")
    actions = []
    while offset < end:
        action = of_parser.OFPAction.parser(raw, offset)
        if action.len < 8:
            raise ValueError(f"action of length {action.len}")
        offset += action.len
        actions.append(action)
    return actions


def actions_of(flow_instructions, of_parser=parser) -> tuple | None:
    """os-ken's instructions of a flow (a flow mod, a flow description; ``of_parser``: the
    version's parser module) as the tables hold them: ``("output", port)``,
    ``("output", CONTROLLER_PORT)``, ``("punt", bytes)``, ``("group", id)``; None for
    anything else (other instructions or actions)."""
    out = []
    for inst in flow_instructions:
        if not isinstance(inst, of_parser.OFPInstructionActions) or \
                inst.type != ofp.OFPIT_APPLY_ACTIONS:
            return None
        for action in inst.actions:
            if isinstance(action, of_parser.OFPActionOutput):
                if action.port == ofp.OFPP_CONTROLLER:
                    out.append(("output", CONTROLLER_PORT) if action.max_len in (
                        ofp.OFPCML_NO_BUFFER, 0xFFFF) else ("punt", action.max_len))
                else:
                    out.append(("output", action.port))
            elif isinstance(action, of_parser.OFPActionGroup):
                out.append(("group", action.group_id))
            else:
                return None
    return tuple(out)
