"""Pure forwarding policy: the controller's state machine over the switches' events.

The controller app is a shim over :class:`FabricPolicy`: it decodes OpenFlow events, calls the
policy with ``now``, and sends the :class:`controllers.routing.tables.Op` lists the policy
returns. The tables themselves (what each routing mode installs) are
:mod:`controllers.routing.tables`'. Nothing here imports os_ken or touches a socket, so the
whole policy is tested against a fake flow table.
"""

from __future__ import annotations

from controllers.routing.adaptive import AdaptiveRouting, FlowKey
from controllers.routing.tables import (
    Op,
    PortMismatch,
    FLOW_COOKIE,
    SwitchTables,
    adopt,
    check_ports,
    compute_tables,
    diff_tables,
    unplaced_flow_entry,
)
from testbed.model.spec import EcmpSeed, EcmpSelection, Routing, SprayWeights
from testbed.model.topology import ACCESS_ROLES, Topology


class FabricPolicy:
    """Controller state and decisions for one fabric; every method returns what to send.

    Args:
        topo: the intended topology.
        routing: the routing mode.
        ecmp_seed: the ECMP hash basis (ecmp only).
        ecmp_selection: where the ECMP hash is computed (ecmp only).
        spray_weights: the spray mode's bucket weights.
        poll_s: the adaptive mode's statistics interval.
        granularity: local_adaptive: ``flowlet`` or ``packet``.
        flowlet_gap_us: local_adaptive flowlets' idle gap.
        load: local_adaptive: ``local`` (the switch's ports) or ``next_switch`` (also the
            next switches' path qualities: the groups' selection ``flowlet_next``,
            ``packet_next``).
        rebalance: local_adaptive flowlets' reactive rebalancing, (quality delta, chance per
            packet) in percent; (0, 0): off.
    """

    def __init__(self, topo: Topology, routing: Routing = Routing.ECMP,
                 ecmp_seed: EcmpSeed = EcmpSeed.PER_SWITCH,
                 ecmp_selection: EcmpSelection = EcmpSelection.HASH,
                 spray_weights: SprayWeights = SprayWeights.CAPACITY,
                 poll_s: float = 1.0, granularity: str = "flowlet",
                 flowlet_gap_us: float = 0.0, load: str = "local",
                 rebalance: tuple[int, int] = (0, 0)) -> None:
        self.topo = topo
        ahead = "_next" if str(load) == "next_switch" else ""
        self.local = (f"{granularity}{ahead}", int(round(flowlet_gap_us)), tuple(rebalance))
        self.routing = Routing(routing)
        self.ecmp_seed = EcmpSeed(ecmp_seed)
        self.ecmp_selection = EcmpSelection(ecmp_selection)
        self.spray_weights = SprayWeights(spray_weights)
        self.adaptive = (AdaptiveRouting(topo, poll_s) if self.routing == Routing.ADAPTIVE
                         else None)
        self.port_up: dict[tuple[str, int], bool] = {}
        self.installed: dict[str, SwitchTables] = {}
        self.connected: set[str] = set()
        self.mismatches: dict[str, list[PortMismatch]] = {}
        self.events: list[tuple[float, str]] = []
        # each switch's tables before the ops last computed for it (loop-free staging)
        self.previous: dict[str, SwitchTables | None] = {}
        self._desired: dict[str, SwitchTables] | None = None

    # -- queries ------------------------------------------------------------------------------
    def link_state(self) -> dict[str, bool]:
        """Link name -> up, from the port states reported so far (unknown counts as up)."""
        return {link.name: self._link_up(link) for link in self.topo.links}

    def _link_up(self, link) -> bool:
        """Whether every switch end of ``link`` is up (an unknown port counts as up)."""
        return all(self.port_up.get((e.node, e.port), True) for e in (link.a, link.b)
                   if self.topo.nodes[e.node].is_switch)

    def desired(self) -> dict[str, SwitchTables]:
        if self._desired is None:
            self._desired = compute_tables(self.topo, self.link_state(), self.routing,
                                           self.ecmp_seed, self.ecmp_selection,
                                           self.spray_weights, self.adaptive, self.local)
        return self._desired

    # -- events -------------------------------------------------------------------------------
    def switch_connected(self, dpid: int, ports: dict[int, tuple[str, bool]],
                         now: float, found: SwitchTables | None = None) -> list[Op]:
        """A switch (re)connected and described its ports.

        Args:
            dpid: its datapath id.
            ports: port number -> (interface name, live) for its physical ports.
            now: the current time.
            found: its flows and groups as it reported them (a warm start), or None: unknown.

        Returns:
            The ops that bring this switch to its desired state: from a clear, or, with
            ``found``, only what differs (entries kept keep their counters). Port-state
            changes that affect other switches are folded in by :meth:`reconcile`, which the
            caller runs next.
        """
        switch = self.topo.switch_by_dpid(dpid)
        if switch is None:
            self.events.append((now, f"unknown datapath {dpid:016x} connected"))
            return []
        self.connected.add(switch.name)
        self.mismatches[switch.name] = check_ports(self.topo, switch,
                                                   {p: n for p, (n, _) in ports.items()})
        for mismatch in self.mismatches[switch.name]:
            self.events.append((now, f"port mismatch: {mismatch}"))
        for port in self.topo.ports(switch.name):
            live = ports.get(port, ("", False))[1]
            self._set_port(switch.name, port, live)
        self.events.append((now, f"{switch.name} connected"))
        self.installed.pop(switch.name, None)
        if found is not None:
            self._relearn(switch.name, found, now)
            self.installed[switch.name] = adopt(self.desired()[switch.name], found)
        return self._sync(switch.name)

    def _relearn(self, switch: str, found: SwitchTables, now: float) -> None:
        """The adaptive mode's per-flow entries an access switch holds, learned again as flows
        (a warm start keeps them; their placements are made again at the next round)."""
        if self.adaptive is None or self.topo.nodes[switch].role not in ACCESS_ROLES:
            return
        learned = False
        for flow in found.flows.values():
            key = FlowKey.from_match(dict(flow.match)) if flow.cookie == FLOW_COOKIE else None
            if key is not None and key not in self.adaptive.flows:
                learned |= self.adaptive.new_flow(key, now) is not None
        if learned:
            self._desired = None

    def switch_disconnected(self, dpid: int, now: float) -> dict[str, list[Op]]:
        """A switch's OpenFlow connection ended: its vswitchd died or the switch went away. A
        switch failure: its links count as down until it reconnects and reports its ports
        (:meth:`switch_connected`), since its neighbours' ports keep their carrier and their
        groups' watch ports would keep sending into it. Returns the ops that route the other
        connected switches around it."""
        switch = self.topo.switch_by_dpid(dpid)
        if switch is None:
            return {}
        self.connected.discard(switch.name)
        self.installed.pop(switch.name, None)
        self.events.append((now, f"{switch.name} disconnected"))
        for port in self.topo.ports(switch.name):
            self._set_port(switch.name, port, False)
        return self.reconcile()

    def port_status(self, dpid: int, port: int, live: bool, now: float) -> dict[str, list[Op]]:
        """A port went up or down; returns the ops for every connected switch affected."""
        switch = self.topo.switch_by_dpid(dpid)
        if switch is None or self.topo.link_at(switch.name, port) is None:
            return {}
        if self.port_up.get((switch.name, port), True) != live:
            self.events.append((now, f"{switch.name} port {port} {'up' if live else 'down'}"))
        self._set_port(switch.name, port, live)
        return self.reconcile()

    # -- the adaptive mode's inputs (each returns the ops for the switches it changes) -------
    def new_flow(self, dpid: int, in_port: int, key: FlowKey, now: float
                 ) -> dict[str, list[Op]]:
        """A flow's first packet, punted by its source access switch from a host port."""
        switch = self.topo.switch_by_dpid(dpid)
        link = self.topo.link_at(switch.name, in_port) if switch else None
        if self.adaptive is None or link is None or link.tier != "host":
            return {}
        known = key in self.adaptive.flows
        flow = None if known else self.adaptive.new_flow(key, now)
        if flow is None:
            return {}
        if self._desired is None:
            return self.reconcile()
        # only its source switch changes: one entry more there (recomputing every switch's
        # tables for each new flow took most of the controller's CPU)
        first, entry = unplaced_flow_entry(self.topo, flow)
        tables = self._desired[first]
        self._desired[first] = SwitchTables(dict(tables.flows), dict(tables.groups))
        self._desired[first].add_flow(entry)
        ops = self._sync(first) if first in self.connected else []
        return {first: ops} if ops else {}

    def flow_stats(self, dpid: int, counters: dict[FlowKey, int], now: float) -> None:
        """Byte counters of the per-flow entries of one access switch."""
        switch = self.topo.switch_by_dpid(dpid)
        if self.adaptive is not None and switch is not None:
            self.adaptive.flow_stats(counters, now, switch.name)

    def port_stats(self, dpid: int, tx_bytes: dict[int, int], now: float) -> None:
        """Transmit byte counters of one switch's ports."""
        switch = self.topo.switch_by_dpid(dpid)
        if self.adaptive is not None and switch is not None:
            self.adaptive.port_stats(switch.name, tx_bytes, now)

    def adapt(self, now: float) -> dict[str, list[Op]]:
        """After a statistics round: forget idle flows, place the elephants, re-weight the
        groups; returns the ops of the switches whose tables change."""
        if self.adaptive is None:
            return {}
        gone = self.adaptive.expire(now)
        moved = self.adaptive.place(now, self.link_state())
        before = self.desired()
        self._desired = None
        if not (gone or moved) and self.desired() == before:
            return {}
        for key in gone:
            self.events.append((now, f"flow {key.src}->{key.dst} expired"))
        return self.reconcile()

    def reconcile(self) -> dict[str, list[Op]]:
        """Bring every connected switch to the desired state; returns the non-empty op lists."""
        out = {}
        for name in sorted(self.connected):
            ops = self._sync(name)
            if ops:
                out[name] = ops
        return out

    def _set_port(self, switch: str, port: int, live: bool) -> None:
        """A port's state; the tables are computed again only when it changes a link's (an
        unknown port counts as up: a switch connecting with every port live changes
        nothing, where recomputing every switch's tables at each of 80 connections cost the
        controller 5 s of a k=8 fabric's bring-up; the second end of a failed link to report
        changes nothing either, where recomputing delayed the first end's reroute: the
        switches' answers waited behind it)."""
        changed = self.port_up.get((switch, port), True) != live
        if not changed:
            return
        link = self.topo.link_at(switch, port)
        before = self._link_up(link) if link is not None else None
        self.port_up[(switch, port)] = live
        if link is not None and self._link_up(link) == before:
            return
        self._desired = None
        if self.adaptive is not None:
            self.adaptive.drop_dead_paths(self.link_state())

    def _sync(self, name: str) -> list[Op]:
        new = self.desired()[name]
        self.previous[name] = self.installed.get(name)
        ops = diff_tables(self.previous[name], new)
        self.installed[name] = new
        return ops

    def arp_reply(self, target_ip: str) -> str | None:
        """The MAC a proxy-ARP reply carries for ``target_ip``, or None for no reply."""
        for host in self.topo.hosts:
            if host.ip == target_ip:
                return host.mac
        return None

    def lldp_seen(self, dpid: int, in_port: int, peer_dpid: int, peer_port: int,
                  now: float) -> str | None:
        """Check one LLDP adjacency against the model; returns a mismatch text or None."""
        switch = self.topo.switch_by_dpid(dpid)
        peer = self.topo.switch_by_dpid(peer_dpid)
        if switch is None or peer is None:
            return None
        link = self.topo.link_at(switch.name, in_port)
        expected = link.other(switch.name) if link else None
        if expected and (expected.node, expected.port) == (peer.name, peer_port):
            return None
        text = (f"wiring mismatch: {switch.name} port {in_port} sees {peer.name} port {peer_port}, "
                f"expected {expected.node + ' port ' + str(expected.port) if expected else 'nothing'}")
        self.events.append((now, text))
        return text
