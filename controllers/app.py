"""os-ken application: a thin shim over :class:`controllers.policy.FabricPolicy`.

Each handler decodes an OpenFlow event, asks the policy what to do (passing ``now``), and sends
the returned ops. The app publishes its view in a JSON status file (switches connected and
programmed, port and wiring mismatches, error replies, handler exceptions) that the testbed polls.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import struct
import threading
import time
import traceback

from os_ken.base import app_manager
from os_ken.controller import ofp_event
from os_ken.controller.handler import (
    CONFIG_DISPATCHER,
    DEAD_DISPATCHER,
    MAIN_DISPATCHER,
    set_ev_cls,
)
from os_ken.lib import hub
from os_ken.lib.packet import arp, ethernet, lldp, packet
from os_ken.ofproto import ofproto_v1_5

from controllers.policy import (
    CONTROLLER_PORT,
    ETH_TYPE_ARP,
    ETH_TYPE_LLDP,
    FabricPolicy,
    Op,
)
from testbed.topology import from_dict

LOG = logging.getLogger("fabriclab.controller")
LLDP_INTERVAL_S = 2.0
LLDP_MAC = "01:80:c2:00:00:0e"


def _guarded(handler):
    """Record a handler exception in the status file instead of losing it in a log."""

    @functools.wraps(handler)
    def wrapper(self, ev):
        try:
            with self.lock:
                handler(self, ev)
        except Exception:
            self.errors.append(f"exception in {handler.__name__}: {traceback.format_exc()}")
            self.write_status()
            raise
    return wrapper


class FabricController(app_manager.OSKenApp):
    """Proactive L3 ECMP controller for a fabriclab fabric."""

    OFP_VERSIONS = (ofproto_v1_5.OFP_VERSION,)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        conf = self.CONF.fabriclab
        with open(conf.topology, encoding="utf-8") as fh:
            self.policy = FabricPolicy(from_dict(json.load(fh)), conf.routing or "ecmp",
                                       conf.ecmp_seed or "per_switch")
        self.status_path = conf.status
        self.lock = threading.RLock()
        self.datapaths: dict[str, object] = {}
        self.port_desc: dict[int, dict[int, tuple[str, bool]]] = {}
        self.pending_barriers: dict[str, set[int]] = {}
        self.programmed: set[str] = set()
        self.errors: list[str] = []
        self.wiring: dict[tuple[str, int], str | None] = {}
        self.fabric_ends = [(e.node, e.port) for l in self.policy.topo.links
                            if l.tier == "fabric" for e in (l.a, l.b)]
        self.write_status()
        hub.spawn(self._lldp_loop)

    # -- status ----------------------------------------------------------------------------
    def write_status(self) -> None:
        topo = self.policy.topo
        status = {
            "pid": os.getpid(),
            "time": time.time(),
            "switches_expected": len(topo.switches),
            "connected": sorted(self.policy.connected),
            "programmed": sorted(self.programmed),
            "port_mismatches": [str(m) for ms in self.policy.mismatches.values() for m in ms],
            "wiring_mismatches": sorted(t for t in self.wiring.values() if t),
            "wiring_verified": sum(1 for e in self.fabric_ends if self.wiring.get(e) is None
                                   and e in self.wiring),
            "wiring_expected": len(self.fabric_ends),
            "links_down": sorted(n for n, up in self.policy.link_state().items() if not up),
            "errors": self.errors[-50:],
            "events": [f"{t:.3f} {text}" for t, text in self.policy.events[-200:]],
        }
        tmp = f"{self.status_path}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(status, fh, indent=1)
        os.replace(tmp, self.status_path)

    # -- sending -----------------------------------------------------------------------------
    def _send(self, name: str, ops: list[Op]) -> None:
        dp = self.datapaths.get(name)
        if dp is None:
            return
        for op in ops:
            msgs = _to_messages(dp, op)
            for msg in msgs:
                dp.send_msg(msg)
                if op.kind == "barrier":
                    self.pending_barriers.setdefault(name, set()).add(msg.xid)
                    self.programmed.discard(name)

    def _send_all(self, per_switch: dict[str, list[Op]]) -> None:
        for name, ops in per_switch.items():
            self._send(name, ops)

    # -- handlers ----------------------------------------------------------------------------
    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    @_guarded
    def on_features(self, ev) -> None:
        dp = ev.msg.datapath
        self.port_desc[dp.id] = {}
        dp.send_msg(dp.ofproto_parser.OFPPortDescStatsRequest(dp, 0, dp.ofproto.OFPP_ANY))

    @set_ev_cls(ofp_event.EventOFPPortDescStatsReply, MAIN_DISPATCHER)
    @_guarded
    def on_port_desc(self, ev) -> None:
        dp = ev.msg.datapath
        ofp = dp.ofproto
        ports = self.port_desc.setdefault(dp.id, {})
        for p in ev.msg.body:
            if p.port_no <= ofp.OFPP_MAX:
                ports[p.port_no] = (p.name.decode(), _live(ofp, p))
        if ev.msg.flags & ofp.OFPMPF_REPLY_MORE:
            return
        switch = self.policy.topo.switch_by_dpid(dp.id)
        ops = self.policy.switch_connected(dp.id, ports, time.time())
        if switch is not None:
            self.datapaths[switch.name] = dp
            self.pending_barriers.pop(switch.name, None)  # a reconnect starts from scratch
            self._send(switch.name, ops)
            self._send_all(self.policy.reconcile())
        self.write_status()

    @set_ev_cls(ofp_event.EventOFPStateChange, DEAD_DISPATCHER)
    @_guarded
    def on_state_change(self, ev) -> None:
        dp = ev.datapath
        if dp.id is None:
            return
        switch = self.policy.topo.switch_by_dpid(dp.id)
        if switch is not None and self.datapaths.get(switch.name) is dp:
            del self.datapaths[switch.name]
            self.programmed.discard(switch.name)
            # barriers sent on the dead connection are never answered
            self.pending_barriers.pop(switch.name, None)
            self.policy.switch_disconnected(dp.id, time.time())
            self.write_status()

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    @_guarded
    def on_port_status(self, ev) -> None:
        dp = ev.msg.datapath
        desc = ev.msg.desc
        live = _live(dp.ofproto, desc) and ev.msg.reason != dp.ofproto.OFPPR_DELETE
        self._send_all(self.policy.port_status(dp.id, desc.port_no, live, time.time()))
        self.write_status()

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    @_guarded
    def on_barrier(self, ev) -> None:
        switch = self.policy.topo.switch_by_dpid(ev.msg.datapath.id)
        if switch is None:
            return
        pending = self.pending_barriers.get(switch.name, set())
        pending.discard(ev.msg.xid)
        if not pending:
            self.programmed.add(switch.name)
        self.write_status()

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    @_guarded
    def on_error(self, ev) -> None:
        msg = ev.msg
        switch = self.policy.topo.switch_by_dpid(msg.datapath.id)
        name = switch.name if switch else f"{msg.datapath.id:016x}"
        self.errors.append(f"{name}: OpenFlow error type={msg.type} code={msg.code} "
                           f"data={msg.data[:64].hex()}")
        self.write_status()

    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    @_guarded
    def on_packet_in(self, ev) -> None:
        msg = ev.msg
        dp = msg.datapath
        pkt = packet.Packet(msg.data)
        eth = pkt.get_protocol(ethernet.ethernet)
        in_port = msg.match["in_port"]
        if eth is None:
            return
        if eth.ethertype == ETH_TYPE_LLDP:
            self._on_lldp(dp, in_port, pkt.get_protocol(lldp.lldp))
        elif eth.ethertype == ETH_TYPE_ARP:
            self._on_arp(dp, in_port, pkt.get_protocol(arp.arp))

    def _on_lldp(self, dp, in_port: int, probe) -> None:
        if probe is None:
            return
        chassis, port_tlv = probe.tlvs[0], probe.tlvs[1]
        try:
            peer_dpid = int(chassis.chassis_id.decode().removeprefix("dpid:"), 16)
            peer_port = int(port_tlv.port_id.decode())
        except (ValueError, AttributeError):
            return
        switch = self.policy.topo.switch_by_dpid(dp.id)
        if switch is None:
            return
        before = dict(self.wiring)
        self.wiring[(switch.name, in_port)] = self.policy.lldp_seen(
            dp.id, in_port, peer_dpid, peer_port, time.time())
        if self.wiring != before:
            self.write_status()

    def _on_arp(self, dp, in_port: int, req) -> None:
        if req is None or req.opcode != arp.ARP_REQUEST:
            return
        mac = self.policy.arp_reply(req.dst_ip)
        if mac is None:
            return
        reply = packet.Packet()
        reply.add_protocol(ethernet.ethernet(dst=req.src_mac, src=mac, ethertype=ETH_TYPE_ARP))
        reply.add_protocol(arp.arp(opcode=arp.ARP_REPLY, src_mac=mac, src_ip=req.dst_ip,
                                   dst_mac=req.src_mac, dst_ip=req.src_ip))
        self._packet_out(dp, in_port, reply)

    def _packet_out(self, dp, port: int, pkt) -> None:
        pkt.serialize()
        parser, ofp = dp.ofproto_parser, dp.ofproto
        dp.send_msg(parser.OFPPacketOut(dp, ofp.OFP_NO_BUFFER,
                                        parser.OFPMatch(in_port=ofp.OFPP_CONTROLLER),
                                        [parser.OFPActionOutput(port)], pkt.data))

    def _lldp_loop(self) -> None:
        """Probe every fabric port of every programmed switch, until all ends are verified,
        then at a slower pace (a rewiring or a miscabled port shows up later too)."""
        while True:
            with self.lock:
                verified = len(self.wiring) >= len(self.fabric_ends)
                for name in sorted(self.programmed):
                    self._send_probes(name)
            hub.sleep(LLDP_INTERVAL_S * (5 if verified else 1))

    def _send_probes(self, name: str) -> None:
        dp = self.datapaths.get(name)
        if dp is None:
            return
        for port, link in self.policy.topo.ports(name).items():
            if link.tier != "fabric":
                continue
            pkt = packet.Packet()
            pkt.add_protocol(ethernet.ethernet(dst=LLDP_MAC, src="02:00:00:00:00:01",
                                               ethertype=ETH_TYPE_LLDP))
            pkt.add_protocol(lldp.lldp([
                lldp.ChassisID(subtype=lldp.ChassisID.SUB_LOCALLY_ASSIGNED,
                               chassis_id=f"dpid:{dp.id:016x}".encode()),
                lldp.PortID(subtype=lldp.PortID.SUB_LOCALLY_ASSIGNED, port_id=str(port).encode()),
                lldp.TTL(ttl=120), lldp.End()]))
            self._packet_out(dp, port, pkt)


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


def _live(ofp, port) -> bool:
    return not (port.state & ofp.OFPPS_LINK_DOWN) and not (port.config & ofp.OFPPC_PORT_DOWN)


def _to_messages(dp, op: Op) -> list:
    """Translate one policy op into OpenFlow 1.5 messages for ``dp``."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    if op.kind == "clear":
        return [parser.OFPFlowMod(dp, command=ofp.OFPFC_DELETE, table_id=ofp.OFPTT_ALL,
                                  out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY,
                                  match=parser.OFPMatch()),
                parser.OFPGroupMod(dp, command=ofp.OFPGC_DELETE, group_id=ofp.OFPG_ALL)]
    if op.kind == "barrier":
        return [parser.OFPBarrierRequest(dp)]
    if op.kind in ("group_add", "group_mod", "group_del"):
        command = {"group_add": ofp.OFPGC_ADD, "group_mod": ofp.OFPGC_MODIFY,
                   "group_del": ofp.OFPGC_DELETE}[op.kind]
        buckets = [parser.OFPBucket(
            bucket_id=i, actions=[parser.OFPActionOutput(p)],
            properties=[parser.OFPGroupBucketPropWatch(type_=ofp.OFPGBPT_WATCH_PORT, watch=p)])
            for i, p in enumerate(op.entry.ports)]
        props = [] if op.kind == "group_del" else [HashSelection(op.entry.hash_basis)]
        return [parser.OFPGroupMod(dp, command=command, type_=ofp.OFPGT_SELECT,
                                   group_id=op.entry.group_id, buckets=buckets,
                                   properties=props)]
    entry = op.entry
    match = parser.OFPMatch(**dict(entry.match))
    if op.kind == "flow_del":
        return [parser.OFPFlowMod(dp, command=ofp.OFPFC_DELETE_STRICT, priority=entry.priority,
                                  out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY, match=match)]
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
    return [parser.OFPFlowMod(dp, command=ofp.OFPFC_ADD, priority=entry.priority, match=match,
                              instructions=inst)]
