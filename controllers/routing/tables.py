"""Pure forwarding tables: from the intended topology and live link state to per-switch tables.

The tables of every switch, and the operations that turn one table into another
(:func:`compute_tables`, :func:`diff_tables`); :class:`controllers.routing.policy.FabricPolicy`
keeps them in step with the switches. Nothing here imports os_ken or touches a socket.

Forwarding is L3 on the host addresses (MACs are not rewritten; hosts hold static ARP entries or
ask the controller):

* on an access switch, one /32 route per attached host -> output port;
* routing ``ecmp``: on every switch, one route per other access switch's /24 -> a SELECT group
  whose buckets are the ports on shortest paths towards it (per-flow ECMP: the switch hashes the
  5-tuple). Each switch hashes with its own basis (seed ``per_switch``, as real switches seed their
  hash per device) unless the seed is ``shared``: then every switch computes the same hash and the
  fabric polarizes (a switch whose upstream neighbour already split flows by that hash sends them
  all to one bucket) -- kept as an option because it is a real phenomenon worth showing;
* routing ``dmodk``: destination-based static routing as InfiniBand fat-trees do (D-mod-k): one
  route per remote host, whose up-port at tier ``t`` is ``(d // c^t) mod c`` for host number
  ``d`` and ``c`` uplink choices. Shift permutations (and any pattern whose destinations differ in
  those digits) then get link-disjoint paths, so it doubles as "paths pinned disjoint". The
  route outputs to a fast-failover group (that port first, then the other live ones), so a
  local link failure moves the traffic at once, before the controller recomputes the choice;
* routing ``spray``: the switch side of packet spraying. Open vSwitch cannot pick a bucket per
  packet, so the senders vary the entropy (the UDP source port) per packet and the switches hash
  it: the ``ecmp`` groups, hashed in the datapath (``dp_hash``: no upcall per new source port),
  with bucket weights (``spray_weights``): ``capacity`` gives each port its share of the capacity
  towards the destination (below), ``equal`` sprays blindly, which overloads the thinner side of
  paths made asymmetric by a failure (Dixit et al., INFOCOM'13);
* routing ``adaptive``: the ``ecmp`` tables, plus what :mod:`controllers.routing.adaptive` decides: at
  access switches IPv4 from a host port that no flow entry knows is forwarded as the routes
  do and its first 128 bytes go to the controller (``PRIORITY_DETECT``: a copy of each route
  per host port, plus a punt), which adds an exact-match entry for the flow (``PRIORITY_FLOW``,
  the same forwarding: its counter is the flow's); nothing waits for the controller; an elephant placed on a path gets
  an exact-match entry at every switch of that path; the groups' bucket weights follow the
  measured residual capacity of their ports (WCMP) for the mice;
* ARP and LLDP go to the controller; anything else is dropped by the table-miss entry.

Link failures are handled by recomputing the desired tables on the live graph and sending the
difference, which in practice modifies the buckets of the affected groups only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from controllers.routing.adaptive import AdaptiveRouting
from testbed.model.openflow import (
    CONTROLLER_PORT,
    SHARED_HASH_BASIS,
    FlowEntry,
    GroupEntry,
)
from testbed.model.spec import EcmpSeed, EcmpSelection, Routing, SprayWeights
from testbed.model.routes import distances_to, dmodk_port, host_numbers, next_hops
from testbed.model.topology import ACCESS_ROLES, Node, Topology
from testbed.plan.groups import hash_basis

ETH_TYPE_IPV4 = 0x0800
ETH_TYPE_ARP = 0x0806
ETH_TYPE_LLDP = 0x88CC
PRIORITY_MISS = 0
PRIORITY_PREFIX = 100
PRIORITY_REMOTE_HOST = 150
PRIORITY_HOST = 200
PRIORITY_DETECT = 210
PRIORITY_FLOW = 250
FLOW_COOKIE = 0xADA0  # the adaptive mode's per-flow entries (their counters are polled)
PUNT_BYTES = 128  # what a new flow's punted packets carry to the controller: the headers
PRIORITY_PUNT = 300


@dataclass
class SwitchTables:
    """The desired (or installed) flow and group tables of one switch."""

    flows: dict[tuple, FlowEntry] = field(default_factory=dict)
    groups: dict[int, GroupEntry] = field(default_factory=dict)

    def add_flow(self, entry: FlowEntry) -> None:
        self.flows[entry.key] = entry

    def add_group(self, entry: GroupEntry) -> None:
        self.groups[entry.group_id] = entry


class OpKind(StrEnum):
    """What an :class:`Op` does to a switch."""

    CLEAR = "clear"  # delete every flow and group
    GROUP_ADD = "group_add"
    GROUP_MOD = "group_mod"
    GROUP_DEL = "group_del"
    FLOW_ADD = "flow_add"  # add or replace (same priority and match)
    FLOW_MOD = "flow_mod"  # change an existing entry's actions, keeping its counters
    FLOW_DEL = "flow_del"
    BARRIER = "barrier"  # the switch answers once everything before it is applied


@dataclass(frozen=True)
class Op:
    """One change to a switch; ``entry`` is the FlowEntry/GroupEntry concerned (None for
    clear and barrier)."""

    kind: OpKind
    entry: FlowEntry | GroupEntry | None = None


@dataclass(frozen=True)
class PortMismatch:
    """A difference between the intended ports of a switch and the ones it reported."""

    switch: str
    port: int
    expected: str | None
    found: str | None

    def __str__(self) -> str:
        if self.found is None:
            return f"{self.switch}: port {self.port} ({self.expected}) missing"
        if self.expected is None:
            return f"{self.switch}: unexpected port {self.port} ({self.found})"
        return f"{self.switch}: port {self.port} is {self.found!r}, expected {self.expected!r}"


def _prefix_match(subnet: str) -> tuple[tuple[str, object], ...]:
    addr, plen = subnet.split("/")
    mask = ".".join(str((0xFFFFFFFF << (32 - int(plen)) >> (24 - 8 * i)) & 0xFF) for i in range(4))
    return (("eth_type", ETH_TYPE_IPV4), ("ipv4_dst", (addr, mask)))


def compute_tables(topo: Topology, link_up: dict[str, bool], routing: Routing = Routing.ECMP,
                   ecmp_seed: EcmpSeed = EcmpSeed.PER_SWITCH,
                   ecmp_selection: EcmpSelection = EcmpSelection.HASH,
                   spray_weights: SprayWeights = SprayWeights.CAPACITY,
                   adaptive: AdaptiveRouting | None = None,
                   local: tuple = ("flowlet", 0, (0, 0))) -> dict[str, SwitchTables]:
    """Compute the desired tables of every switch for the given link state.

    Args:
        topo: the intended topology.
        link_up: link name -> up; links not present count as up.
        routing: ``ecmp``, ``dmodk`` or ``spray``.
        ecmp_seed: ``per_switch`` or ``shared`` hash basis (ecmp, spray).
        ecmp_selection: ``hash`` or ``dp_hash`` (ecmp; spray always hashes in the datapath).
        spray_weights: ``capacity`` or ``equal`` bucket weights (spray only).
        adaptive: the adaptive mode's flows and loads (adaptive only).
        local: local_adaptive's selection (``flowlet``, ``packet``, ``flowlet_next``,
            ``packet_next``), flowlet gap in us and flowlets' reactive rebalancing
            (quality delta, chance; percent): the groups' selection method, which the eBPF
            switches apply per packet.

    Returns:
        switch name -> desired tables.
    """
    routing, ecmp_seed = Routing(routing), EcmpSeed(ecmp_seed)  # ValueError when unknown
    selection = EcmpSelection(ecmp_selection)
    tables = _base_tables(topo)
    if routing == Routing.ECMP:
        _add_ecmp(topo, link_up, ecmp_seed, selection, tables)
    elif routing == Routing.LOCAL_ADAPTIVE:
        _add_ecmp(topo, link_up, ecmp_seed, local[0], tables, gap_us=local[1],
                  rebalance=tuple(local[2]) if len(local) > 2 else (0, 0))
    elif routing == Routing.SPRAY:
        _add_ecmp(topo, link_up, ecmp_seed, EcmpSelection.DP_HASH, tables,
                  SprayWeights(spray_weights) == SprayWeights.CAPACITY)
    elif routing == Routing.ADAPTIVE:
        adaptive = adaptive or AdaptiveRouting(topo)
        # the routes and detection entries change only with the links: computed once per
        # link state (recomputing them took most of each statistics round's CPU)
        key = (frozenset(k for k, v in link_up.items() if not v), ecmp_seed, selection)
        static = adaptive.table_cache.get(key)
        if static is None:
            _add_ecmp(topo, link_up, ecmp_seed, selection, tables)
            _add_detection(topo, tables)
            adaptive.table_cache.clear()
            static = adaptive.table_cache[key] = tables
        tables = {name: SwitchTables(dict(t.flows), dict(t.groups))
                  for name, t in static.items()}
        _add_adaptive(topo, adaptive, tables)
    else:
        _add_dmodk(topo, link_up, tables)
    return tables


def _base_tables(topo: Topology) -> dict[str, SwitchTables]:
    """Table-miss, punts, and the /32 routes of directly attached hosts."""
    tables = {sw.name: SwitchTables() for sw in topo.switches}
    for sw in topo.switches:
        t = tables[sw.name]
        t.add_flow(FlowEntry(PRIORITY_MISS, (), ()))
        t.add_flow(FlowEntry(PRIORITY_PUNT, (("eth_type", ETH_TYPE_LLDP),),
                             (("output", CONTROLLER_PORT),)))
        for port, link in topo.ports(sw.name).items():
            if link.tier == "host":
                host = topo.nodes[link.other(sw.name).node]
                t.add_flow(FlowEntry(PRIORITY_HOST, (("eth_type", ETH_TYPE_IPV4),
                                                     ("ipv4_dst", (host.ip, "255.255.255.255"))),
                                     (("output", port),)))
        if sw.role in ACCESS_ROLES:
            t.add_flow(FlowEntry(PRIORITY_PUNT, (("eth_type", ETH_TYPE_ARP),),
                                 (("output", CONTROLLER_PORT),)))
    return tables


def _add_ecmp(topo: Topology, link_up: dict[str, bool], seed: str, selection: str,
              tables: dict[str, SwitchTables], weighted: bool = False, gap_us: int = 0,
              rebalance: tuple[int, int] = (0, 0)) -> None:
    flowlet = str(selection).startswith("flowlet")
    for gid, dst in enumerate(topo.access_switches, start=1):
        dist = distances_to(topo, dst.name, link_up)
        plane = distances_to(topo, dst.name, {})  # a multi-plane fabric's: its own switches
        shares = capacity_shares(topo, dst.name, dist, link_up) if weighted else {}
        for sw in topo.switches:
            if sw.name == dst.name or sw.name not in plane:
                continue
            ports = tuple(sorted(next_hops(topo, sw.name, dist, link_up)))
            weights = bucket_weights([shares.get((sw.name, p), 0.0) for p in ports])
            tables[sw.name].add_group(GroupEntry(
                gid, ports, hash_basis(sw, seed), str(selection), weights,
                gap_us=gap_us if flowlet else 0, rebalance=rebalance if flowlet else (0, 0)))
            tables[sw.name].add_flow(FlowEntry(PRIORITY_PREFIX, _prefix_match(dst.subnet),
                                               (("group", gid),)))


def _add_detection(topo: Topology, tables: dict[str, SwitchTables]) -> None:
    """At access switches, from host ports: forward as the routes do and punt the headers
    (a new flow's first packets)."""
    for sw in topo.access_switches:
        routes = [f for f in tables[sw.name].flows.values()
                  if f.priority in (PRIORITY_PREFIX, PRIORITY_HOST)]
        for port, link in topo.ports(sw.name).items():
            if link.tier != "host":
                continue
            for route in routes:  # forwarded as the route says, and its headers punted
                tables[sw.name].add_flow(FlowEntry(
                    PRIORITY_DETECT, (("in_port", port),) + route.match,
                    route.actions + (("punt", PUNT_BYTES),)))


def _add_adaptive(topo: Topology, adaptive: AdaptiveRouting,
                  tables: dict[str, SwitchTables]) -> None:
    """WCMP weights on the groups, the elephants' entries along their paths, the other
    flows' counting entries at their source switches."""
    for sw in topo.switches:  # WCMP for the mice
        t = tables[sw.name]
        for g in list(t.groups.values()):
            weights = adaptive.bucket_weights(sw.name, g.ports)
            if weights:
                t.groups[g.group_id] = GroupEntry(g.group_id, g.ports, g.hash_basis,
                                                  g.selection, weights)
    for flow in adaptive.flows.values():
        match = flow.key.match()
        if flow.path is not None:
            for node, nxt in zip(flow.path[1:-1], flow.path[2:]):
                port = adaptive.link(node, nxt).end(node).port
                tables[node].add_flow(FlowEntry(PRIORITY_FLOW, match, (("output", port),),
                                                FLOW_COOKIE))
            continue
        unplaced = adaptive.entry_cache.get(flow.key)
        if unplaced is None:
            unplaced = adaptive.entry_cache[flow.key] = unplaced_flow_entry(topo, flow)
        first, entry = unplaced
        tables[first].add_flow(entry)


def unplaced_flow_entry(topo: Topology, flow) -> tuple[str, FlowEntry]:
    """A flow not (yet) placed: its exact entry at its source access switch, forwarding as the
    routes do (the destination's ECMP group, or the host port), there to count its bytes."""
    gid = {sw.name: i for i, sw in enumerate(topo.access_switches, start=1)}
    first = topo.attachment(flow.src_host).node
    last = topo.attachment(flow.dst_host)
    action = (("output", last.port),) if last.node == first else (("group", gid[last.node]),)
    return first, FlowEntry(PRIORITY_FLOW, flow.key.match(), action, FLOW_COOKIE)


def capacity_shares(topo: Topology, target: str, dist: dict[str, int],
                    link_up: dict[str, bool]) -> dict[tuple[str, int], float]:
    """(switch, port) -> the capacity towards ``target`` behind that port, on the live
    shortest-path DAG.

    A switch's capacity towards the target is the sum over its next-hop ports of
    ``min(link rate, next hop's capacity / its fan-in)``, the fan-in being how many switches
    use that next hop towards the target: a next hop's onward capacity is shared by everything
    that feeds it. In a k=4 fat-tree with one core link down, an edge switch's uplink to the
    aggregation switch that lost it gets 1/3 of the pod's traffic instead of 1/2.
    """
    order = sorted((n for n in dist if topo.nodes[n].is_switch), key=lambda n: dist[n])
    hops = {n: list(next_hops(topo, n, dist, link_up)) for n in order}
    fan_in: dict[str, int] = {}
    for n in order:
        for port in hops[n]:
            peer = topo.ports(n)[port].other(n).node
            fan_in[peer] = fan_in.get(peer, 0) + 1
    capacity = {target: float("inf")}
    shares: dict[tuple[str, int], float] = {}
    for n in order[1:] if order and order[0] == target else order:
        total = 0.0
        for port in hops[n]:
            link = topo.ports(n)[port]
            peer = link.other(n).node
            share = min(link.rate_mbps, capacity.get(peer, 0.0) / max(1, fan_in.get(peer, 1)))
            shares[(n, port)] = share
            total += share
        capacity[n] = total
    return shares


def bucket_weights(shares: list[float], scale: int = 100) -> tuple[int, ...]:
    """Integer SELECT bucket weights in proportion to ``shares`` (empty when all are equal or
    unknown: OpenFlow's default of equal buckets)."""
    top = max(shares, default=0.0)
    if top <= 0 or all(abs(s - top) <= 1e-9 * top for s in shares):
        return ()
    return tuple(max(1, round(scale * s / top)) for s in shares)


DMODK_GROUP_BASE = 1000  # fast-failover group ids (below: the ECMP groups, one per access switch)


def _add_dmodk(topo: Topology, link_up: dict[str, bool],
               tables: dict[str, SwitchTables]) -> None:
    number = host_numbers(topo)
    failover: dict[tuple[str, tuple[int, ...]], int] = {}

    def group_for(switch: str, first: int, live: list[int]) -> int:
        order = (first, *(p for p in live if p != first))
        key = (switch, order)
        if key not in failover:
            failover[key] = DMODK_GROUP_BASE + sum(1 for k in failover if k[0] == switch)
            tables[switch].add_group(GroupEntry(failover[key], order, kind="ff"))
        return failover[key]

    for dst in topo.access_switches:
        dist = distances_to(topo, dst.name, link_up)
        intact = distances_to(topo, dst.name, {})
        local = [l.other(dst.name).node for l in topo.ports(dst.name).values() if l.tier == "host"]
        for sw in topo.switches:
            if sw.name == dst.name:
                continue
            live = sorted(next_hops(topo, sw.name, dist, link_up))
            choices = max(1, len(list(next_hops(topo, sw.name, intact, {}))))
            for host in local:
                if not live:
                    continue
                port = dmodk_port(topo, sw.name, number[host], live, choices)
                action = (("group", group_for(sw.name, port, live)),) if len(live) > 1 else (
                    ("output", port),)
                tables[sw.name].add_flow(FlowEntry(
                    PRIORITY_REMOTE_HOST, (("eth_type", ETH_TYPE_IPV4),
                                           ("ipv4_dst", (topo.nodes[host].ip, "255.255.255.255"))),
                    action))


def diff_tables(old: SwitchTables | None, new: SwitchTables) -> list[Op]:
    """The ops that turn ``old`` into ``new``; ``old=None`` means unknown (clear first).

    Groups are added or changed before the flows that point at them, and deleted after them.
    """
    ops: list[Op] = []
    if old is None:
        ops.append(Op(OpKind.CLEAR))
        old = SwitchTables()
    for gid, group in sorted(new.groups.items()):
        if gid not in old.groups:
            ops.append(Op(OpKind.GROUP_ADD, group))
        elif old.groups[gid] != group:
            ops.append(Op(OpKind.GROUP_MOD, group))
    changed = [(key, flow) for key, flow in new.flows.items() if old.flows.get(key) != flow]
    for key, flow in sorted(changed, key=lambda kv: _sort_key(kv[0])):  # only what differs
        if key not in old.flows:
            ops.append(Op(OpKind.FLOW_ADD, flow))
        else:  # a modify keeps the entry's counters (an add resets them)
            ops.append(Op(OpKind.FLOW_MOD, flow))
    gone = [(key, flow) for key, flow in old.flows.items() if key not in new.flows]
    for key, flow in sorted(gone, key=lambda kv: _sort_key(kv[0])):
        ops.append(Op(OpKind.FLOW_DEL, flow))
    for gid, group in sorted(old.groups.items()):
        if gid not in new.groups:
            ops.append(Op(OpKind.GROUP_DEL, group))
    if ops:
        ops.append(Op(OpKind.BARRIER))
    return ops


#: masks that select every bit: a field under one of them is matched exactly
FULL_MASKS = frozenset({"255.255.255.255", "ff:ff:ff:ff:ff:ff",
                        "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"})


def canonical(match: tuple[tuple[str, object], ...]) -> tuple:
    """A match as the switch sees it: fields in name order, a field under a full mask as an
    exact one (a /32 route reads back unmasked)."""
    return tuple(sorted((name, value[0] if isinstance(value, tuple) and len(value) == 2
                         and value[1] in FULL_MASKS else value) for name, value in match))


def adopt(desired: SwitchTables, found: SwitchTables) -> SwitchTables:
    """What a switch holds (``found``: read back, as the switch reports its matches) keyed as
    ``desired`` keys the same entries, so that :func:`diff_tables` from it changes only what
    differs. Without it, a route read back in another form would be added under the desired
    form and deleted under the read one: one entry on the switch, deleted."""
    keys = {(prio, canonical(match)): match for prio, match in desired.flows}
    out = SwitchTables(groups=dict(found.groups))
    for flow in found.flows.values():
        match = keys.get((flow.priority, canonical(flow.match)), flow.match)
        out.add_flow(FlowEntry(flow.priority, match, flow.actions, flow.cookie))
    return out


def _sort_key(key: tuple) -> tuple:
    return (key[0], repr(key[1]))


def check_ports(topo: Topology, switch: Node, reported: dict[int, str]) -> list[PortMismatch]:
    """Compare the ports a switch reported (number -> name) with the intended ones."""
    expected = {port: link.end(switch.name).ifname for port, link in topo.ports(switch.name).items()}
    out = []
    for port in sorted(set(expected) | set(reported)):
        if expected.get(port) != reported.get(port):
            out.append(PortMismatch(switch.name, port, expected.get(port), reported.get(port)))
    return out
