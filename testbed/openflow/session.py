"""One eBPF switch's OpenFlow session, sans I/O: bytes from the controller in, the bytes to
answer out, and the switch's flow and group tables kept as the controller set them. The switch
speaks OpenFlow 1.5 and 1.3 (the version of most Ryu and os-ken apps and tutorials); the hello
carries both in its version bitmap, and the session speaks the one negotiated
(:mod:`testbed.openflow.v13` holds what 1.3 lays out otherwise).

It answers as Open vSwitch does for what fabriclab's controller and common os-ken apps use:
the handshake (hello, features with the datapath id, port descriptions with each port's
number, name, MAC and liveness), configuration, echo, barriers, flow mods (add, modify strict,
delete, delete strict; one table), group mods (SELECT with weighted buckets and the
selection method's hash basis, fast failover; :mod:`testbed.openflow.groups`), packet-out and
packet-in, switch description, port and flow statistics and flow and group descriptions
(:mod:`testbed.openflow.replies`), and port status when a port's carrier changes. A
packet-out may name a port, ``FLOOD`` or ``ALL`` (every port but the one it came in on, or
every port) or ``IN_PORT``.
Anything outside that is answered with the OpenFlow error a switch sends, never ignored: a
match the datapath cannot look up (:mod:`testbed.plan.tss`) is ``OFPET_BAD_MATCH``. Requests
are parsed by os-ken's OpenFlow 1.5 parser; the few switch-to-controller bodies os-ken does not
serialize are packed with its ofproto layouts.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from os_ken.ofproto import ofproto_parser, ofproto_protocol
from os_ken.ofproto import ofproto_v1_5 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as parser13
from os_ken.ofproto import ofproto_v1_5_parser as parser

from testbed.model.openflow import CONTROLLER_PORT, FlowEntry, GroupEntry
from testbed.plan import tss
from testbed.openflow import groups, replies, v13
from testbed.openflow.replies import FlowQuery, PortCounters

HEADER = replies.HEADER
#: the versions this switch speaks, highest first (1.5: 0x06, 1.3: 0x04)
VERSIONS = (ofp.OFP_VERSION, v13.VERSION)
#: OpenFlow's version numbers as people write them
VERSION_NAMES = {1: "1.0", 2: "1.1", 3: "1.2", 4: "1.3", 5: "1.4", 6: "1.5"}


@dataclass(frozen=True)
class Port:
    """A switch port as the controller sees it."""

    number: int
    name: str
    mac: str
    live: bool = True
    speed_kbps: int = 10_000


def _port_bytes(port: Port, version: int = ofp.OFP_VERSION) -> bytes:
    if version == v13.VERSION:
        return v13.port(port.number, port.name, port.mac, port.live, port.speed_kbps)
    eth = struct.pack(ofp.OFP_PORT_DESC_PROP_ETHERNET_PACK_STR, ofp.OFPPDPT_ETHERNET, 32,
                      0, 0, 0, 0, port.speed_kbps, port.speed_kbps)
    state = ofp.OFPPS_LIVE if port.live else ofp.OFPPS_LINK_DOWN
    head = struct.pack(ofp.OFP_PORT_PACK_STR, port.number, 40 + len(eth),
                       bytes.fromhex(port.mac.replace(":", "")), port.name.encode()[:15], 0, state)
    return head + eth


_message = replies.message


class Counters(Protocol):
    """Where a session reads its statistics: the datapath's."""

    def ports(self) -> dict[int, PortCounters]: ...

    def flow(self, entry: FlowEntry) -> tuple[int, int]: ...


class NoCounters:
    """Statistics of a switch that counts nothing (every counter 0)."""

    def __init__(self, ports: list[int] = ()) -> None:
        self.numbers = list(ports)

    def ports(self) -> dict[int, PortCounters]:
        return {n: PortCounters() for n in self.numbers}

    def flow(self, entry: FlowEntry) -> tuple[int, int]:
        return (0, 0)


class SwitchSession:
    """The session of switch ``dpid`` with ports ``ports``; ``on_change(flows, groups)`` is
    called after every flow or group mod with the whole tables. A flow's match is kept with its
    fields sorted by name (OpenFlow gives their order no meaning).

    Call :meth:`start` once connected, feed everything the controller sends to :meth:`receive`,
    send what they return."""

    def __init__(self, dpid: int, ports: list[Port],
                 on_change: Callable[[dict, dict], None] = lambda _f, _g: None,
                 counters: Counters | None = None, read_only: bool = False) -> None:
        self.dpid = dpid
        #: a management session (``ovs-ofctl``): it reads the tables and counters; a change
        #: is refused (``OFPBRC_EPERM``), the controller's alone
        self.read_only = read_only
        self.ports = {p.number: p for p in ports}
        self.counters = counters or NoCounters(list(self.ports))
        self.started = time.monotonic()
        self.flow_added: dict[tuple, float] = {}  # a flow's key -> when it was added
        self.on_change = on_change
        self.flows: dict[tuple, FlowEntry] = {}
        self.groups: dict[int, GroupEntry] = {}
        self.buffer = b""
        self.packets_out: list[tuple[int, bytes]] = []  # (port, frame) the agent sends
        self.version = ofp.OFP_VERSION  # until the controller's hello says another
        self.desc = ofproto_protocol.ProtocolDesc(version=ofp.OFP_VERSION)
        self.errors_sent = 0
        self.handshaken = False  # the controller asked for the features: it speaks to us
        self.refused = ""  # why version negotiation failed (the connection is to end)

    def carry(self, old: SwitchSession) -> SwitchSession:
        """Take over the tables of ``old``, this switch's previous session: a switch keeps
        what is installed when its controller goes (Open vSwitch's fail-secure mode), so a
        controller that reads the tables back finds them as they were, with their ages."""
        self.flows, self.groups = dict(old.flows), dict(old.groups)
        self.flow_added = dict(old.flow_added)
        return self

    def mirror(self, live: SwitchSession) -> SwitchSession:
        """Show what ``live`` (the switch's session with its controller) holds: its tables,
        their ages and its ports, as they are now (a management session's view)."""
        self.flows, self.groups, self.flow_added = live.flows, live.groups, live.flow_added
        self.ports = live.ports
        return self

    def start(self) -> bytes:
        """Our hello: OpenFlow 1.5, with a version bitmap of every version we speak (os-ken
        serializes no hello elements: packed here)."""
        bitmap = struct.pack("!HHI", ofp.OFPHET_VERSIONBITMAP, 8,
                             sum(1 << v for v in VERSIONS))
        return self._msg(ofp.OFPT_HELLO, 0, bitmap)

    def _msg(self, msg_type: int, xid: int, body: bytes) -> bytes:
        return _message(msg_type, xid, body, self.version)

    @property
    def v13(self) -> bool:
        """Whether the controller speaks OpenFlow 1.3."""
        return self.version == v13.VERSION

    def receive(self, data: bytes) -> bytes:
        """Every whole message in ``data`` (and what came before it) handled in order; the
        replies, concatenated."""
        self.buffer += data
        out = []
        while len(self.buffer) >= HEADER.size:
            version, msg_type, length, xid = HEADER.unpack_from(self.buffer)
            if length < HEADER.size:
                raise ValueError(f"OpenFlow message of length {length}")
            if len(self.buffer) < length:
                break
            raw, self.buffer = self.buffer[:length], self.buffer[length:]
            out.append(self._handle(version, msg_type, length, xid, raw))
        return b"".join(out)

    def packet_in(self, port: int, total_len: int, data: bytes) -> bytes:
        """A packet the datapath sent the controller (``data``: its first bytes)."""
        return replies.packet_in(port, total_len, data, version=self.version)

    def port_status(self, number: int, live: bool) -> bytes:
        """A port's carrier changed: the port status message to send."""
        port = self.ports[number] = Port(**{**self.ports[number].__dict__, "live": live})
        body = struct.pack("!B7x", ofp.OFPPR_MODIFY) + _port_bytes(port, self.version)
        return self._msg(ofp.OFPT_PORT_STATUS, 0, body)

    # -- handling -------------------------------------------------------------------------
    def _error(self, xid: int, err_type: int, code: int, raw: bytes) -> bytes:
        self.errors_sent += 1
        return self._msg(ofp.OFPT_ERROR, xid, struct.pack(ofp.OFP_ERROR_MSG_PACK_STR, err_type,
                                                          code) + raw[:64])

    def _handle(self, version: int, msg_type: int, length: int, xid: int, raw: bytes) -> bytes:
        if msg_type == ofp.OFPT_HELLO:
            return self._hello(version, xid, raw)
        if version != self.version:
            return self._error(xid, ofp.OFPET_BAD_REQUEST, ofp.OFPBRC_BAD_VERSION, raw)
        if msg_type == ofp.OFPT_ECHO_REQUEST:
            return self._msg(ofp.OFPT_ECHO_REPLY, xid, raw[HEADER.size:])
        if msg_type == ofp.OFPT_FEATURES_REQUEST:
            self.handshaken = True
            caps = ofp.OFPC_FLOW_STATS | ofp.OFPC_PORT_STATS | ofp.OFPC_GROUP_STATS
            return self._msg(ofp.OFPT_FEATURES_REPLY, xid, struct.pack(
                ofp.OFP_SWITCH_FEATURES_PACK_STR, self.dpid, 0, 1, 0, caps, 0))
        if msg_type == ofp.OFPT_SET_CONFIG:
            return b""
        if msg_type == ofp.OFPT_GET_CONFIG_REQUEST:
            return self._msg(ofp.OFPT_GET_CONFIG_REPLY, xid,
                             struct.pack(ofp.OFP_SWITCH_CONFIG_PACK_STR, 0, 0xFFFF))
        if msg_type == ofp.OFPT_BARRIER_REQUEST:
            return self._msg(ofp.OFPT_BARRIER_REPLY, xid, b"")
        if msg_type == ofp.OFPT_MULTIPART_REQUEST:
            (mp_type, _flags) = struct.unpack_from(ofp.OFP_MULTIPART_REQUEST_PACK_STR, raw,
                                                   HEADER.size)
            return self._multipart(mp_type, xid, raw)
        if self.read_only and msg_type in (ofp.OFPT_FLOW_MOD, ofp.OFPT_GROUP_MOD,
                                           ofp.OFPT_PACKET_OUT):
            return self._error(xid, ofp.OFPET_BAD_REQUEST, ofp.OFPBRC_EPERM, raw)
        if msg_type == ofp.OFPT_FLOW_MOD:
            msg = ofproto_parser.msg(self.desc, version, msg_type, length, xid, raw)
            return self._flow_mod(msg, xid, raw)
        if msg_type == ofp.OFPT_GROUP_MOD:  # os-ken parses no group mod: by its layout
            return self._group_mod(raw, xid)
        if msg_type == ofp.OFPT_PACKET_OUT:
            return self._packet_out(raw, xid)
        return self._error(xid, ofp.OFPET_BAD_REQUEST, ofp.OFPBRC_BAD_TYPE, raw)

    def _hello(self, version: int, xid: int, raw: bytes) -> bytes:
        """Version negotiation (OpenFlow 1.3.1 and later): with the controller's version
        bitmap, the highest version both speak; without one, the lower of the two hellos'
        versions, if this switch speaks it. Otherwise the switch answers HELLO_FAILED and the
        connection ends (:attr:`refused` names both sides' versions; the agent closes it)."""
        listed: set[int] = set()  # the version bitmap's, which says all when it is there
        bitmap = False
        at = HEADER.size
        while at + 4 <= len(raw):  # hello elements: the version bitmap (type 1)
            kind, length = struct.unpack_from("!HH", raw, at)
            if length < 4:
                break
            if kind == ofp.OFPHET_VERSIONBITMAP:
                bitmap = True
                for i in range((length - 4) // 4):
                    (bits,) = struct.unpack_from("!I", raw, at + 4 + 4 * i)
                    listed |= {32 * i + b for b in range(32) if bits >> b & 1}
            at += (length + 7) // 8 * 8
        versions = listed if bitmap else {version}
        common = [v for v in VERSIONS if v in versions] if bitmap else \
            [v for v in VERSIONS if v == min(version, ofp.OFP_VERSION)]
        if common:
            self.version = common[0]
            self.desc = ofproto_protocol.ProtocolDesc(version=self.version)
            return b""
        names = ", ".join(f"{VERSION_NAMES.get(v, '?')} (0x{v:02x})" for v in sorted(versions))
        ours = " and ".join(f"{VERSION_NAMES[v]} (0x{v:02x})" for v in sorted(VERSIONS))
        self.refused = (f"the controller speaks OpenFlow {names}; this switch speaks "
                        f"{ours}")
        return _message(ofp.OFPT_ERROR, xid, struct.pack(
            ofp.OFP_ERROR_MSG_PACK_STR, ofp.OFPET_HELLO_FAILED, ofp.OFPHFC_INCOMPATIBLE)
            + self.refused.encode())

    def _multipart(self, mp_type: int, xid: int, raw: bytes) -> bytes:
        now = time.monotonic()
        if mp_type == ofp.OFPMP_PORT_DESC:
            parts = [_port_bytes(p, self.version) for _, p in sorted(self.ports.items())]
        elif mp_type == ofp.OFPMP_DESC:
            parts = [replies.desc(self.dpid)]
        elif mp_type == ofp.OFPMP_PORT_STATS:
            (port_no,) = struct.unpack_from("!I", raw, ofp.OFP_MULTIPART_REQUEST_SIZE)
            if port_no != ofp.OFPP_ANY and port_no not in self.ports:
                return self._error(xid, ofp.OFPET_BAD_REQUEST, ofp.OFPBRC_BAD_PORT, raw)
            parts = (v13.port_stats if self.v13 else replies.port_stats)(
                self.counters.ports(), port_no, now - self.started)
        elif mp_type == ofp.OFPMP_FLOW_DESC or (mp_type == ofp.OFPMP_FLOW_STATS
                                                and not self.v13):
            query = FlowQuery.parse(raw, parser13 if self.v13 else parser)
            chosen = sorted((f for f in self.flows.values() if query.selects(f)),
                            key=lambda f: (-f.priority, f.match))
            age = lambda f: now - self.flow_added.get(f.key, now)  # noqa: E731
            parts = (v13.flows(chosen, self.counters.flow, age) if self.v13 else  # OFPMP_FLOW
                     replies.flows(chosen, self.counters.flow, age,
                                   mp_type == ofp.OFPMP_FLOW_DESC))
        elif mp_type == ofp.OFPMP_GROUP_DESC:
            (group_id,) = (ofp.OFPG_ALL,) if self.v13 else struct.unpack_from(  # 1.3: all
                "!I", raw, ofp.OFP_MULTIPART_REQUEST_SIZE)
            parts = [(v13.group_desc if self.v13 else groups.desc)(g)
                     for gid, g in sorted(self.groups.items())
                     if group_id in (ofp.OFPG_ALL, gid)]
        else:
            return self._error(xid, ofp.OFPET_BAD_REQUEST, ofp.OFPBRC_BAD_MULTIPART, raw)
        return replies.multipart(mp_type, xid, parts, self.version)

    def _packet_out(self, raw: bytes, xid: int) -> bytes:
        """A frame the controller sends out of ports (LLDP probes, a learning switch's
        floods): queued for the agent. Its ports: a port of this switch, ``FLOOD`` (every
        port but the one the frame came in on), ``ALL`` (with it) or ``IN_PORT``."""
        try:
            in_port, actions, frame = (v13.packet_out(raw) if self.v13 else
                                       self._packet_out_15(raw))
        except (ValueError, struct.error):
            return self._error(xid, ofp.OFPET_BAD_REQUEST, ofp.OFPBRC_BAD_LEN, raw)
        ports = []
        for action in actions:
            if not isinstance(action, (parser.OFPActionOutput, parser13.OFPActionOutput)):
                return self._error(xid, ofp.OFPET_BAD_ACTION, ofp.OFPBAC_BAD_TYPE, raw)
            if action.port in (ofp.OFPP_FLOOD, ofp.OFPP_ALL):
                ports += [n for n in sorted(self.ports)
                          if n != in_port or action.port == ofp.OFPP_ALL]
            elif action.port == ofp.OFPP_IN_PORT and in_port in self.ports:
                ports.append(in_port)
            elif action.port in self.ports:
                ports.append(action.port)
            else:  # OFPP_TABLE, LOCAL, NORMAL, CONTROLLER or no such port
                return self._error(xid, ofp.OFPET_BAD_ACTION, ofp.OFPBAC_BAD_OUT_PORT, raw)
        self.packets_out += [(port, frame) for port in ports]
        return b""

    @staticmethod
    def _packet_out_15(raw: bytes) -> tuple[int, list, bytes]:
        """An OpenFlow 1.5 packet-out: (the in_port of its match, its actions, the frame)."""
        _buffer_id, actions_len = struct.unpack_from("!IH2x", raw, HEADER.size)
        offset = HEADER.size + 8
        match = parser.OFPMatch.parser(raw, offset)
        _match_type, match_len = struct.unpack_from("!HH", raw, offset)
        offset += (match_len + 7) // 8 * 8
        actions = replies.read_actions(raw, offset, actions_len)
        return match.get("in_port", ofp.OFPP_CONTROLLER), actions, raw[offset + actions_len:]

    def _actions(self, instructions) -> tuple | None:
        """Apply-actions as the tables hold them; None for anything else (an output to a port
        this switch has not included)."""
        actions = replies.actions_of(instructions, parser13 if self.v13 else parser)
        if actions is None or any(name == "output" and value != CONTROLLER_PORT
                                  and value not in self.ports for name, value in actions):
            return None
        return actions

    def _flow_mod(self, msg, xid: int, raw: bytes) -> bytes:
        match = tuple(sorted(msg.match.items()))
        if msg.command in (ofp.OFPFC_DELETE, ofp.OFPFC_DELETE_STRICT):
            if msg.table_id not in (0, ofp.OFPTT_ALL):
                return self._error(xid, ofp.OFPET_FLOW_MOD_FAILED, ofp.OFPFMFC_BAD_TABLE_ID, raw)
            if msg.command == ofp.OFPFC_DELETE_STRICT:
                self.flows.pop((msg.priority, match), None)
            else:  # every flow whose match includes the given fields
                given = set(match)
                self.flows = {k: f for k, f in self.flows.items() if not given <= set(f.match)}
            self.flow_added = {k: t for k, t in self.flow_added.items() if k in self.flows}
            self.on_change(self.flows, self.groups)
            return b""
        if msg.table_id != 0:
            return self._error(xid, ofp.OFPET_FLOW_MOD_FAILED, ofp.OFPFMFC_BAD_TABLE_ID, raw)
        try:
            tss.split_match(match)
        except tss.UnsupportedMatch as err:
            return self._error(xid, err.type, err.code, raw)
        actions = self._actions(msg.instructions)
        if actions is None:
            return self._error(xid, ofp.OFPET_BAD_ACTION, ofp.OFPBAC_BAD_TYPE, raw)
        for name, value in actions:
            if name == "group" and value not in self.groups:
                return self._error(xid, ofp.OFPET_BAD_ACTION, ofp.OFPBAC_BAD_OUT_GROUP, raw)
        entry = FlowEntry(msg.priority, match, actions, msg.cookie)
        if msg.command in (ofp.OFPFC_ADD, ofp.OFPFC_MODIFY_STRICT, ofp.OFPFC_MODIFY):
            self.flows[entry.key] = entry
            self.flow_added.setdefault(entry.key, time.monotonic())
        else:
            return self._error(xid, ofp.OFPET_FLOW_MOD_FAILED, ofp.OFPFMFC_BAD_COMMAND, raw)
        self.on_change(self.flows, self.groups)
        return b""

    def _group_mod(self, raw: bytes, xid: int) -> bytes:
        if self.v13:
            try:
                command, kind, group_id, read = v13.group_mod(raw)
            except (groups.BadGroup, struct.error):
                return self._error(xid, ofp.OFPET_GROUP_MOD_FAILED, ofp.OFPGMFC_BAD_BUCKET, raw)
            return self._set_group(raw, xid, command, kind, group_id, read, 0, "hash")
        command, kind, group_id, buckets_len, _bucket_id = struct.unpack_from(
            ofp.OFP_GROUP_MOD_PACK_STR, raw, HEADER.size)
        body_end = ofp.OFP_GROUP_MOD_SIZE + buckets_len
        try:
            read = groups.read_buckets(raw, ofp.OFP_GROUP_MOD_SIZE, body_end)
            basis, selection, gap_us = groups.read_selection(raw, body_end, len(raw))
            rebalance = groups.read_rebalance(raw, body_end, len(raw))
        except groups.BadGroup:
            return self._error(xid, ofp.OFPET_GROUP_MOD_FAILED, ofp.OFPGMFC_BAD_BUCKET, raw)
        return self._set_group(raw, xid, command, kind, group_id, read, basis, selection,
                               gap_us, rebalance)

    def _set_group(self, raw: bytes, xid: int, command: int, kind: int, group_id: int,
                   read: list, basis: int, selection: str, gap_us: int = 0,
                   rebalance: tuple[int, int] = (0, 0)) -> bytes:
        if command == ofp.OFPGC_DELETE:
            if group_id == ofp.OFPG_ALL:
                self.groups.clear()
            else:
                self.groups.pop(group_id, None)
            self.on_change(self.flows, self.groups)
            return b""
        if kind not in (ofp.OFPGT_SELECT, ofp.OFPGT_FF) or selection not in groups.METHODS:
            return self._error(xid, ofp.OFPET_GROUP_MOD_FAILED, ofp.OFPGMFC_BAD_TYPE, raw)
        try:
            group = groups.entry(group_id, kind, read, basis, selection, gap_us, rebalance)
        except groups.BadGroup:
            return self._error(xid, ofp.OFPET_GROUP_MOD_FAILED, ofp.OFPGMFC_BAD_BUCKET, raw)
        if any(port not in self.ports for port in group.ports):
            return self._error(xid, ofp.OFPET_GROUP_MOD_FAILED, ofp.OFPGMFC_BAD_BUCKET, raw)
        exists = group_id in self.groups
        if command == ofp.OFPGC_ADD and exists:
            return self._error(xid, ofp.OFPET_GROUP_MOD_FAILED, ofp.OFPGMFC_GROUP_EXISTS, raw)
        if command == ofp.OFPGC_MODIFY and not exists:
            return self._error(xid, ofp.OFPET_GROUP_MOD_FAILED, ofp.OFPGMFC_UNKNOWN_GROUP, raw)
        if command not in (ofp.OFPGC_ADD, ofp.OFPGC_MODIFY):
            return self._error(xid, ofp.OFPET_GROUP_MOD_FAILED, ofp.OFPGMFC_BAD_COMMAND, raw)
        self.groups[group_id] = group
        self.on_change(self.flows, self.groups)
        return b""
