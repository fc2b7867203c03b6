"""os-ken application: a thin shim over :class:`controllers.policy.FabricPolicy` and
:class:`controllers.session.Session`.

Each handler decodes an OpenFlow event, asks the policy what to do (passing ``now``), sends the
returned ops (translated by :mod:`controllers.ofmsgs`) and tells the session what it sent and
received. The session's status document (switches connected and programmed, port and wiring
mismatches, error replies, handler exceptions) is written to a JSON file the testbed polls.
"""

from __future__ import annotations

import functools
import json
import logging
import os
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

from controllers.ofmsgs import to_messages
from controllers.policy import ETH_TYPE_ARP, ETH_TYPE_LLDP, FabricPolicy, Op, OpKind
from controllers.session import Session
from testbed.files import write_json_atomic
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
            self.session.error(f"exception in {handler.__name__}: {traceback.format_exc()}")
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
            self.policy = FabricPolicy(from_dict(json.load(fh)), conf.routing, conf.ecmp_seed,
                                       conf.ecmp_selection, conf.spray_weights)
        self.session = Session(self.policy)
        self.status_path = conf.status
        self.lock = threading.RLock()
        self.datapaths: dict[str, object] = {}
        self.port_desc: dict[int, dict[int, tuple[str, bool]]] = {}
        self.write_status()
        hub.spawn(self._lldp_loop)

    def write_status(self) -> None:
        write_json_atomic(self.status_path, self.session.status(time.time(), os.getpid()))

    # -- sending -----------------------------------------------------------------------------
    def _send(self, name: str, ops: list[Op]) -> None:
        dp = self.datapaths.get(name)
        if dp is None:
            return
        for op in ops:
            for msg in to_messages(dp, op):
                dp.send_msg(msg)
                if op.kind == OpKind.BARRIER:
                    self.session.barrier_sent(name, msg.xid)

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
            self.session.connected(switch.name)  # a reconnect starts from scratch
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
            self.session.disconnected(switch.name)
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
        self.session.barrier_replied(switch.name, ev.msg.xid)
        self.write_status()

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    @_guarded
    def on_error(self, ev) -> None:
        msg = ev.msg
        switch = self.policy.topo.switch_by_dpid(msg.datapath.id)
        name = switch.name if switch else f"{msg.datapath.id:016x}"
        self.session.error(f"{name}: OpenFlow error type={msg.type} code={msg.code} "
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
        if self.session.lldp_seen(dp.id, in_port, peer_dpid, peer_port, time.time()):
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
                verified = self.session.wiring_complete
                for name in sorted(self.session.programmed):
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


def _live(ofp, port) -> bool:
    return not (port.state & ofp.OFPPS_LINK_DOWN) and not (port.config & ofp.OFPPC_PORT_DOWN)
