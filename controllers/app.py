"""os-ken application: a thin shim over :class:`controllers.routing.policy.FabricPolicy` and
:class:`controllers.routing.session.Session`.

Each handler decodes an OpenFlow event, asks the policy what to do (passing ``now``), sends the
returned ops (translated by :mod:`controllers.routing.ofmsgs`) and tells the session what it sent and
received. The session's status document (switches connected and programmed, port and wiring
mismatches, error replies, handler exceptions) is written to a JSON file the testbed polls.
Started with ``--warm-start`` (a restart), it reads each switch's tables back before it
programmes it (:mod:`controllers.readback`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import threading
import time
import traceback
from collections import Counter

from os_ken.base import app_manager
from os_ken.controller import ofp_event
from os_ken.controller.handler import (
    CONFIG_DISPATCHER,
    DEAD_DISPATCHER,
    MAIN_DISPATCHER,
    set_ev_cls,
)
from os_ken.lib import hub
from os_ken.lib.packet import arp, ethernet, ipv4, lldp, packet, tcp, udp
from os_ken.ofproto import ofproto_v1_5

from controllers.routing.adaptive import FlowKey
from controllers.routing.ofmsgs import read_groups_by_layout
from controllers.readback import ReadBack, WarmStart
from controllers.routing.policy import FabricPolicy
from controllers.routing.tables import (
    ETH_TYPE_ARP,
    ETH_TYPE_IPV4,
    ETH_TYPE_LLDP,
    FLOW_COOKIE,
    Op,
    OpKind,
    SwitchTables,
)
from controllers.routing.session import Session
from controllers.outbox import Outbox
from telemetry.model import metrics
from telemetry.exporter import CallbackCollector, Exporter
from testbed.linux.files import write_json_atomic
from testbed.model.topology import from_dict

LOG = logging.getLogger("fabriclab.controller")
LLDP_INTERVAL_S = 2.0
STATUS_INTERVAL_S = 0.1  # the status document is written at most this often
LLDP_MAC = "01:80:c2:00:00:0e"
read_groups_by_layout()  # os-ken's own parser misreads a reply of several groups


def _guarded(handler):
    """Record a handler exception in the status file instead of losing it in a log."""

    @functools.wraps(handler)
    def wrapper(self, ev):
        try:
            with self.lock:
                handler(self, ev)
        except Exception:
            self.session.error(f"exception in {handler.__name__}: {traceback.format_exc()}")
            self.write_status(force=True)
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
                                       conf.ecmp_selection, conf.spray_weights,
                                       float(conf.poll_interval_s), conf.granularity,
                                       float(conf.flowlet_gap_us), conf.load,
                                       tuple(int(p) for p in conf.rebalance.split(",")))
        self.session = Session(self.policy)
        LOG.info("routing %s, ECMP seed %s, selection %s, spray weights %s, poll %s s, "
                 "granularity %s, flowlet gap %s us, load %s, rebalance %s", conf.routing,
                 conf.ecmp_seed, conf.ecmp_selection, conf.spray_weights,
                 conf.poll_interval_s, conf.granularity, conf.flowlet_gap_us, conf.load,
                 conf.rebalance)
        self.status_path = conf.status
        self.warm_start = bool(conf.warm_start)
        self.readback = WarmStart(self.policy.topo, self._warm_started)
        self.lock = threading.RLock()
        self.out = Outbox(self.policy, self.session)  # the switches' connections: sending
        self.port_desc: dict[int, dict[int, tuple[str, bool]]] = {}
        self.poll_s = float(conf.poll_interval_s)
        self.pending_flow_stats: set[str] = set()
        self.flow_counters: dict[int, dict[FlowKey, int]] = {}  # dpid -> this round's
        self.port_counters: dict[int, dict[int, int]] = {}
        self.stats_rounds = self.early_rounds = 0
        self.cpu: Counter[str] = Counter()  # thread CPU seconds by activity (see _cpu)
        self.wake = threading.Event()  # a new flow: the statistics loop looks at its due time
        self.status_written_at, self.status_pending = 0.0, False
        self.round_started = 0.0
        self.port_events = self.reroutes = 0
        self.poll_times = metrics.poll_histogram()
        # the controller's exporter (127.0.0.1; the status names it): on the port its
        # predecessor served (a restart keeps Prometheus's target), else one from the OS
        self.exporter = Exporter([CallbackCollector(
            lambda: metrics.controller_families(self.metric_stats(), self.poll_times))],
            port=int(conf.metrics_port or 0)).start(or_any=True)
        self.write_status(force=True)
        hub.spawn(self._status_loop)
        hub.spawn(self._lldp_loop)
        if self.policy.adaptive is not None:
            hub.spawn(self._stats_loop)

    def write_status(self, force: bool = False) -> None:
        """Write the status document, at most every ``STATUS_INTERVAL_S`` (a later change is
        written by the status loop): every barrier reply asked for one, and writing each took
        a third of the controller's CPU under the adaptive mode's churn."""
        now = time.monotonic()
        if not force and now - self.status_written_at < STATUS_INTERVAL_S:
            self.status_pending = True
            return
        self.status_written_at, self.status_pending = now, False
        self._write_status()

    def _status_loop(self) -> None:
        while True:
            hub.sleep(STATUS_INTERVAL_S)
            with self.lock:
                self.out.release(self.out.stager.expired(time.time()))
                if self.status_pending:
                    self.write_status()

    def _write_status(self) -> None:
        doc = self.session.status(time.time(), os.getpid())
        cpu = os.times()
        doc["cpu_s"] = round(cpu.user + cpu.system, 3)  # the controller's, since it started
        doc["routing"] = str(self.policy.routing)  # what this controller runs
        doc["metrics"] = self.exporter.target
        if self.policy.adaptive is not None:
            doc["adaptive"] = {**self.policy.adaptive.report(), "poll_s": self.poll_s,
                               "stats_rounds": self.stats_rounds,
                               "early_rounds": self.early_rounds, "cpu_s": doc["cpu_s"],
                               # this thread's CPU in the statistics' requests and replies
                               # (os-ken's parsing in the switches' receive threads aside)
                               # and in the placements they trigger
                               "stats_cpu_s": round(self.cpu["stats"], 3),
                               "placement_cpu_s": round(self.cpu["placement"], 3)}
        write_json_atomic(self.status_path, doc)

    def metric_stats(self) -> dict:
        """The counters :func:`telemetry.model.metrics.controller_families` exports."""
        with self.lock:
            cpu = os.times()
            adaptive = self.policy.adaptive
            return {"switches_expected": len(self.policy.topo.switches),
                    "connected": len(self.policy.connected),
                    "programmed": len(self.session.programmed), "ops": dict(self.out.op_counts),
                    "port_events": self.port_events, "reroutes": self.reroutes,
                    "links_down": sum(1 for up in self.policy.link_state().values() if not up),
                    "placements": adaptive.placements if adaptive else 0,
                    "moves": adaptive.moves if adaptive else 0, "cpu_s": cpu.user + cpu.system}

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
        if switch is not None and self.warm_start:
            self.readback.request(dp, switch.name, ports)
        else:
            self._programme(dp, ports)
        self.write_status()

    def _warm_started(self, name: str, back: ReadBack) -> None:
        """A switch's tables read back: programmed from them, what was found recorded."""
        ops = self._programme(back.dp, back.ports, SwitchTables(back.flows, back.groups))
        self.session.warm_started(name, len(back.flows), len(back.groups), back.unreadable,
                                  back.youngest_s, ops)
        self.write_status()

    def _programme(self, dp, ports: dict, found: SwitchTables | None = None) -> list[Op]:
        """Bring a switch that described its ports to its desired state (from a clear, or from
        ``found``: its tables as read back); returns the ops sent to it."""
        switch = self.policy.topo.switch_by_dpid(dp.id)
        ops = self.policy.switch_connected(dp.id, ports, time.time(), found)
        if found is not None and not ops:  # nothing differs: the barrier's reply says so
            ops = [Op(OpKind.BARRIER)]
        if switch is not None:
            self.out.datapaths[switch.name] = dp
            self.session.connected(switch.name)  # a reconnect starts from scratch
            self.out.release(self.out.stager.left(switch.name))
            self.out.send(switch.name, ops)
            self.out.send_all(self.policy.reconcile())
        return ops

    @set_ev_cls(ofp_event.EventOFPGroupDescStatsReply, MAIN_DISPATCHER)
    @_guarded
    def on_group_desc(self, ev) -> None:
        self.readback.reply(ev.msg)

    @set_ev_cls(ofp_event.EventOFPStateChange, DEAD_DISPATCHER)
    @_guarded
    def on_state_change(self, ev) -> None:
        dp = ev.datapath
        if dp.id is None:
            return
        switch = self.policy.topo.switch_by_dpid(dp.id)
        if switch is not None:
            self.readback.forget(switch.name, dp)
        if switch is not None and self.out.datapaths.get(switch.name) is dp:
            del self.out.datapaths[switch.name]
            self.session.disconnected(switch.name)
            self.out.release(self.out.stager.left(switch.name))
            heard = time.time()
            changes = self.policy.switch_disconnected(dp.id, heard)  # a switch failure
            self.reroutes += any(changes.values())
            self.out.reroute(changes, f"{switch.name} disconnected", heard)
            self.write_status()

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    @_guarded
    def on_port_status(self, ev) -> None:
        dp = ev.msg.datapath
        desc = ev.msg.desc
        live = _live(dp.ofproto, desc) and ev.msg.reason != dp.ofproto.OFPPR_DELETE
        heard = time.time()
        changes = self.policy.port_status(dp.id, desc.port_no, live, heard)
        self.port_events += 1
        self.reroutes += any(changes.values())
        switch = self.policy.topo.switch_by_dpid(dp.id)
        cause = (f"{switch.name if switch else dp.id} port {desc.port_no} "
                 f"{'up' if live else 'down'}")
        self.out.reroute(changes, cause, heard)
        self.write_status()

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    @_guarded
    def on_barrier(self, ev) -> None:
        switch = self.policy.topo.switch_by_dpid(ev.msg.datapath.id)
        if switch is None:
            return
        self.session.barrier_replied(switch.name, ev.msg.xid, time.time())
        self.out.release(self.out.stager.answered(switch.name, ev.msg.xid))
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
        elif eth.ethertype == ETH_TYPE_IPV4 and self.policy.adaptive is not None:
            self._on_new_flow(dp, in_port, pkt)

    def _on_new_flow(self, dp, in_port: int, pkt) -> None:
        """The headers of a packet that no flow entry knew (the switch forwarded the packet
        itself): learn its flow."""
        ip = pkt.get_protocol(ipv4.ipv4)
        if ip is None:
            return
        l4 = pkt.get_protocol(tcp.tcp) or pkt.get_protocol(udp.udp)
        key = FlowKey(ip.src, ip.dst, ip.proto, l4.src_port if l4 else 0,
                      l4.dst_port if l4 else 0)
        ops = self.policy.new_flow(dp.id, in_port, key, time.time())
        self.out.send_all(ops)
        if ops:  # a flow learned now (not another punted packet of a known one): its first
            self.wake.set()  # sample may be due before the next poll

    # -- the adaptive mode's statistics ----------------------------------------------------------
    def _stats_loop(self) -> None:
        """Every poll interval: the per-flow entries' counters of every access switch and every
        switch's port counters; a round ends when every flow-stats reply is in. A new flow
        brings the next round forward (:meth:`AdaptiveRouting.next_round`)."""
        last_poll = last_round = time.time()
        while True:
            with self.lock:
                due, only = self.policy.adaptive.next_round(last_poll, last_round)
            if time.time() < due:
                self.wake.wait(due - time.time())
                self.wake.clear()
                continue  # a new flow may have moved the round forward: look again
            last_round = time.time()
            if not only:
                last_poll = last_round
            with self.lock:
                if self.pending_flow_stats:  # the last round is not complete: adapt anyway
                    self._end_round()
                self._send_stats_requests(only)

    def _send_stats_requests(self, only: set[str]) -> None:
        """A full poll (``only`` empty), or an early round: the flows of those switches."""
        with self._cpu("stats"):
            self.round_started = time.monotonic()
            access = only or {sw.name for sw in self.policy.topo.access_switches}
            self.early_rounds += 1 if only else 0
            for name, dp in sorted(self.out.datapaths.items()):
                parser, ofp = dp.ofproto_parser, dp.ofproto
                if not only:
                    dp.send_msg(parser.OFPPortStatsRequest(dp, 0, ofp.OFPP_ANY))
                if name in access:
                    self.pending_flow_stats.add(name)
                    dp.send_msg(parser.OFPFlowDescStatsRequest(
                        dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY, FLOW_COOKIE,
                        0xFFFFFFFFFFFFFFFF, parser.OFPMatch()))

    @contextlib.contextmanager
    def _cpu(self, what: str):
        """Count this thread's CPU time under ``what`` (the status reports it)."""
        start = time.thread_time()
        try:
            yield
        finally:
            self.cpu[what] += time.thread_time() - start

    def _end_round(self) -> None:
        with self._cpu("placement"):
            self._adapt_round()

    def _adapt_round(self) -> None:
        now = time.time()
        self.poll_times.observe((), time.monotonic() - self.round_started)
        self.pending_flow_stats.clear()
        for dpid, counters in self.flow_counters.items():
            self.policy.flow_stats(dpid, counters, now)
        self.flow_counters.clear()
        self.stats_rounds += 1
        self.out.send_all(self.policy.adapt(now))
        self.write_status()

    @set_ev_cls(ofp_event.EventOFPFlowDescStatsReply, MAIN_DISPATCHER)
    @_guarded
    def on_flow_stats(self, ev) -> None:
        msg = ev.msg
        if self.readback.reply(msg):
            return
        with self._cpu("stats"):
            for stat in msg.body:
                key = FlowKey.from_match(dict(stat.match.items()))
                if key is not None:
                    self.flow_counters.setdefault(msg.datapath.id, {})[key] = int(
                        stat.stats.get("byte_count", 0))
        if msg.flags & msg.datapath.ofproto.OFPMPF_REPLY_MORE:
            return
        switch = self.policy.topo.switch_by_dpid(msg.datapath.id)
        if switch is None or switch.name not in self.pending_flow_stats:
            # a reply to a round that already ended (the next one began first): its counters
            # wait for the next round's end; ending a round on it would take rates over a
            # sliver of time
            return
        self.pending_flow_stats.discard(switch.name)
        if not self.pending_flow_stats:
            self._end_round()

    @set_ev_cls(ofp_event.EventOFPPortStatsReply, MAIN_DISPATCHER)
    @_guarded
    def on_port_stats(self, ev) -> None:
        with self._cpu("stats"):
            self._port_stats(ev.msg)

    def _port_stats(self, msg) -> None:
        ofp = msg.datapath.ofproto
        counters = self.port_counters.setdefault(msg.datapath.id, {})
        for stat in msg.body:
            if stat.port_no <= ofp.OFPP_MAX:
                counters[stat.port_no] = stat.tx_bytes
        if msg.flags & ofp.OFPMPF_REPLY_MORE:
            return
        self.policy.port_stats(msg.datapath.id, self.port_counters.pop(msg.datapath.id),
                               time.time())

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
        dp = self.out.datapaths.get(name)
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
    """Up, and live for fast failover: a link failure clears ``LIVE`` first (its switch sees
    the loss of signal at once, testbed/fabric/linkfail.py), ``LINK_DOWN`` follows with the carrier."""
    return (not (port.state & ofp.OFPPS_LINK_DOWN) and not (port.config & ofp.OFPPC_PORT_DOWN)
            and bool(port.state & ofp.OFPPS_LIVE))
