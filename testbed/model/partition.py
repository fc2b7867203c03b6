"""Partitioning a fabric over several machines (pure): which machine builds which nodes, which
links are cut (VXLAN tunnels on the underlay), and each machine's share of the load.

Groups stay whole: a fat-tree's pod (its edges, aggregations and hosts), a leaf-spine's leaf
with its hosts, a server with its GPUs and scale-up switch (with the rail leaves spread like a
leaf-spine's); the top tier (cores, spines) is spread over the machines after them. Groups go
to machines in proportion to their budgets: each next group to the machine whose load is the
smallest share of its budget, the load being the switch traffic of every host sending at its
line rate to uniformly spread destinations (:func:`switch_loads`: the fidelity model's
Mbit-hop/s, per switch); where that ties (servers load no switch of their own), the machine
with the fewest hosts for its budget.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, fields

from testbed.errors import ConfigError
from testbed.model.spec import Requirement, TestbedSpec
from testbed.model.topology import Link, Topology


@dataclass(frozen=True)
class Machine:
    """One machine of a cluster: its name and its measured budget (Mbit-hop/s its switches
    carry with fidelity)."""

    name: str
    budget_mbit_hops: float


@dataclass(frozen=True)
class Partition:
    """Where every node is built, the links between machines, and each machine's load."""

    machines: tuple[Machine, ...]
    place: dict[str, str]  # node -> machine name
    cut: tuple[Link, ...]  # links whose ends are on two machines
    load: dict[str, float]  # machine name -> Mbit-hop/s at full load

    def nodes(self, machine: str) -> list[str]:
        return [n for n, m in self.place.items() if m == machine]

    def describe(self) -> list[str]:
        """One line per machine, then the cut links."""
        lines = []
        for m in self.machines:
            nodes = self.nodes(m.name)
            share = self.load[m.name] / m.budget_mbit_hops if m.budget_mbit_hops else 0.0
            lines.append(f"{m.name}: {sum(1 for n in nodes if not n.startswith('nvs'))} nodes, "
                         f"{self.load[m.name]:,.0f} Mbit-hop/s at full load, {share:.0%} of its "
                         f"{m.budget_mbit_hops:,.0f}")
        lines.append(f"{len(self.cut)} cut links (VXLAN): "
                     + ", ".join(l.name for l in self.cut[:8])
                     + (", ..." if len(self.cut) > 8 else ""))
        return lines


def switch_loads(topo: Topology) -> dict[str, float]:
    """Each switch's traffic (Mbit/s entering it) when every host sends at its line rate to
    uniformly spread destinations, split evenly over the equal-cost paths; a server's own GPU
    pairs stay on its scale-up and load no switch. The sum is the fidelity model's Mbit-hop/s."""
    hosts = topo.hosts
    load = {s.name: 0.0 for s in topo.switches}
    if len(hosts) < 2:
        return load
    at = {h.name: topo.attachment(h.name).node for h in hosts}
    server = {nic: s.index for s in topo.servers for g in s.gpus for nic in topo.nics(g)}
    shares: dict[tuple[str, str], dict] = {}
    plane = {h.name: topo.plane_of(h.name) for h in hosts}  # a multi-plane NIC sends on its own
    peers = {p: sum(1 for h in hosts if plane[h.name] == p) - 1 for p in set(plane.values())}
    for src in hosts:
        rate = topo.host_link(src.name).rate_mbps / max(1, peers[plane[src.name]])
        for dst in hosts:
            if dst is src or (src.name in server and server[src.name] == server.get(dst.name)) \
                    or plane[dst.name] != plane[src.name]:
                continue
            a, b = at[src.name], at[dst.name]
            load[a] += rate  # in from the source's NIC
            key = (a, b)
            if key not in shares:
                shares[key] = topo.path_shares(a, b)
            for (_, nxt), share in shares[key].items():
                load[nxt] += rate * share
    return load


def _groups(topo: Topology) -> tuple[list[list[str]], list[str]]:
    """The groups kept whole, and the top-tier switches spread after them."""
    top = {"fat_tree": "core", "leaf_spine": "spine", "ring": "spine"}.get(topo.kind)
    if top is not None and not (topo.kind == "leaf_spine" and topo.servers):
        groups: dict[int, list[str]] = {}  # pods, or leaves with their hosts
        for node in topo.nodes.values():
            if node.role != top:
                groups.setdefault(node.group, []).append(node.name)
        return [groups[g] for g in sorted(groups)], [n.name for n in topo.switches
                                                    if n.role == top]
    if topo.servers:
        groups = [[*s.gpus, *(nic for plane in s.planes for nic in plane),
                   *([s.switch] if s.switch else [])] for s in topo.servers]
        spread = [n.name for n in topo.switches]  # leaves and spines: every server uses them
        return groups, spread
    raise ConfigError("cluster", f"no partitioning for topology {topo.kind}")


def partition(topo: Topology, machines: list[Machine]) -> Partition:
    """Place ``topo`` on ``machines`` (see the module docstring).

    Raises:
        ConfigError: ``cluster.machines`` when there are none, more machines than groups, or a
            budget that is not positive.
    """
    if not machines:
        raise ConfigError("cluster.machines", "a cluster needs at least one machine")
    for i, m in enumerate(machines):
        if m.budget_mbit_hops <= 0:
            raise ConfigError(f"cluster.machines[{i}].budget_mbit_hops",
                              f"must be > 0, got {m.budget_mbit_hops}")
    groups, spread = _groups(topo)
    if len(machines) > len(groups):
        raise ConfigError("cluster.machines", f"{len(machines)} machines for {len(groups)} "
                                              f"groups of {topo.kind} (pods, leaves or "
                                              "servers): some would build nothing")
    switch_load = switch_loads(topo)
    load = {m.name: 0.0 for m in machines}
    hosts = {m.name: 0 for m in machines}  # namespaces (TCP stacks, agents) built there
    place: dict[str, str] = {}

    def lightest() -> Machine:  # by switch load; where that ties (servers: none), by hosts
        return min(machines, key=lambda m: (load[m.name] / m.budget_mbit_hops,
                                            hosts[m.name] / m.budget_mbit_hops,
                                            machines.index(m)))

    for group in groups:
        machine = lightest()
        for node in group:
            place[node] = machine.name
            load[machine.name] += switch_load.get(node, 0.0)
            hosts[machine.name] += node in topo.nodes and topo.nodes[node].role == "host"
    for node in sorted(spread, key=lambda n: -switch_load[n]):
        if node in place:
            continue
        machine = lightest()
        place[node] = machine.name
        load[machine.name] += switch_load[node]
    cut = tuple(l for l in (*topo.links, *topo.scale_up)
                if place[l.a.node] != place[l.b.node])
    return Partition(tuple(machines), place, cut, load)


#: VXLAN's encapsulation (outer IPv4 20, UDP 8, VXLAN 8, inner Ethernet 14): an underlay
#: carries a fabric MTU's frames only if its own MTU is this much larger
VXLAN_OVERHEAD = 50
VXLAN_PORT = 4789
FIRST_VNI = 1000  # VNIs of a run's cut links: FIRST_VNI + the link's index in the cut


@dataclass(frozen=True)
class CutLink:
    """A link between two machines as a VXLAN tunnel on the underlay: each end a VXLAN device
    named as the veth end would be (so shaping, switch ports and counters are unchanged), with
    its own VNI, from its machine's underlay address to the other's."""

    link: Link
    vni: int
    a_machine: str
    b_machine: str
    a_underlay: str
    b_underlay: str

    def end(self, machine: str) -> tuple[str, str, str]:
        """On ``machine``: the device's name, and the local and remote underlay addresses."""
        if machine == self.a_machine:
            return self.link.a.ifname, self.a_underlay, self.b_underlay
        if machine == self.b_machine:
            return self.link.b.ifname, self.b_underlay, self.a_underlay
        raise ValueError(f"{self.link.name} has no end on {machine}")


def cut_links(plan: Partition, underlay: dict[str, str], fabric_mtu: int,
              underlay_mtu: dict[str, int]) -> list[CutLink]:
    """The VXLAN tunnels of a partition's cut links.

    Args:
        underlay: machine -> its underlay address.
        fabric_mtu: the fabric's MTU (``fabric.mtu``).
        underlay_mtu: machine -> the MTU of its underlay interface.

    Raises:
        ConfigError: ``cluster.machines[i]`` for a machine without an underlay address, or
            whose underlay MTU cannot carry the fabric's frames in VXLAN.
    """
    for i, m in enumerate(plan.machines):
        if m.name not in underlay:
            raise ConfigError(f"cluster.machines[{i}]", f"{m.name} has no underlay address")
        mtu = underlay_mtu.get(m.name)
        if mtu is not None and mtu < fabric_mtu + VXLAN_OVERHEAD:
            jumbo = " (a jumbo fabric needs a jumbo underlay)" if fabric_mtu > 1500 else ""
            raise ConfigError(f"cluster.machines[{i}]",
                              f"{m.name}'s underlay MTU is {mtu}: fabric.mtu {fabric_mtu} in "
                              f"VXLAN needs {fabric_mtu + VXLAN_OVERHEAD} or more{jumbo}")
    out = []
    for index, link in enumerate(plan.cut):
        a, b = plan.place[link.a.node], plan.place[link.b.node]
        out.append(CutLink(link, FIRST_VNI + index, a, b, underlay[a], underlay[b]))
    return out


@dataclass(frozen=True)
class MachinePart:
    """What one machine builds of a partitioned fabric: its hosts' namespaces, its switches,
    the links with both ends on it (veths, as on one machine), its servers' scale-up links,
    and its ends of the cut links (VXLAN devices: ``(tunnel, the node whose end it is)``)."""

    machine: str
    nodes: frozenset[str]  # every node of the model built here (hosts, NICs, switches, bridges)
    hosts: tuple[str, ...]  # namespaces to make here (a plane's NIC goes into its GPU's)
    switches: tuple[str, ...]  # OpenFlow switches (their vswitchds) here
    links: tuple[Link, ...]
    scale_up: tuple[Link, ...]
    tunnels: tuple[tuple[CutLink, str], ...]


def machine_part(topo: Topology, plan: Partition, tunnels: list[CutLink],
                 machine: str) -> MachinePart:
    """``machine``'s share of the build.

    Raises:
        ValueError: an unknown machine, or a scale-up link cut (a server is never split).
    """
    if machine not in {m.name for m in plan.machines}:
        raise ValueError(f"no machine {machine} in the partition")
    nodes = frozenset(n for n, m in plan.place.items() if m == machine)
    here = [l for l in topo.links if l.a.node in nodes and l.b.node in nodes]
    up = [l for l in topo.scale_up if l.a.node in nodes or l.b.node in nodes]
    split = [l.name for l in up if not (l.a.node in nodes and l.b.node in nodes)]
    if split:
        raise ValueError(f"scale-up links cut between machines: {', '.join(split)}")
    ends = tuple((t, t.link.a.node if t.a_machine == machine else t.link.b.node)
                 for t in tunnels if machine in (t.a_machine, t.b_machine))
    hosts = tuple(n for n in topo.rank_hosts() if n in nodes)
    switches = tuple(sw.name for sw in topo.switches if sw.name in nodes)
    return MachinePart(machine, nodes, hosts, switches, tuple(here), tuple(up), ends)


def machine_of(topo: Topology, place: dict[str, str], node: str) -> str:
    """The machine that builds ``node`` (a NIC goes with its GPU host)."""
    return place[topo.nic_owner(node) if node in topo.nodes else node]


def links_by_machine(topo: Topology, place: dict[str, str],
                     pairs: list[tuple[str, str]]) -> dict[str, list[tuple[str, str]]]:
    """Each machine with an end of these links, and those links (a cut link: both
    machines)."""
    by_machine: dict[str, list[tuple[str, str]]] = {}
    for a, b in pairs:
        link = topo.find_link(a, b)
        for machine in dict.fromkeys(machine_of(topo, place, e.node) for e in (link.a, link.b)):
            by_machine.setdefault(machine, []).append((a, b))
    return by_machine


def check_cluster_spec(spec: TestbedSpec) -> None:
    """What a cluster does not offer yet, refused by field before anything is built."""
    if spec.pfc is not None:
        raise ConfigError("fabric.pfc", "PFC is not offered on a cluster yet (a pause would "
                                        "cross machines): run it on one machine")
    if not spec.controller.own:
        key = "app" if spec.controller.app else "remote"
        raise ConfigError(f"controller.{key}", "a controller of your own is not offered on a "
                                               "cluster yet (readiness is read from each "
                                               "machine's switches): run it on one machine")


# -- a machine's part as data (what the coordinator sends its actor) -------------------------
@dataclass(frozen=True, kw_only=True)
class PartSpec(TestbedSpec):
    """A cluster machine's copy of the fabric's settings, sent as plain data
    (:mod:`testbed.model.plain`): the testbed's settings and what the experiment adds to
    them that a machine's build reads (planned failures, its workload's requirements)."""

    failures_planned: bool = False
    needs: tuple[Requirement, ...] = ()

    @classmethod
    def of(cls, spec: TestbedSpec) -> PartSpec:
        """The part of ``spec`` (an experiment, or any TestbedSpec) a machine needs."""
        base = {f.name: getattr(spec, f.name) for f in fields(TestbedSpec)}
        return cls(**base, failures_planned=spec.plans_failures(),
                   needs=tuple(spec.requirements()))

    def plans_failures(self) -> bool:
        return self.failures_planned

    def requirements(self) -> list[Requirement]:
        return list(self.needs)


def part_to_plain(part: MachinePart) -> dict:
    """A machine's share as names: the machine, where every node is built, and its tunnels
    (link, VNI, both machines and underlay addresses); :func:`part_from_plain` rebuilds it
    from the topology."""
    return {"machine": part.machine,
            "nodes": sorted(part.nodes),
            "tunnels": [{"link": t.link.name, "vni": t.vni, "a_machine": t.a_machine,
                         "b_machine": t.b_machine, "a_underlay": t.a_underlay,
                         "b_underlay": t.b_underlay} for t, _ in part.tunnels]}


def part_from_plain(topo: Topology, doc: object) -> MachinePart:
    """The :class:`MachinePart` ``doc`` names, every name checked against ``topo``.

    Raises:
        ConfigError: naming the first entry that is not of this fabric.
    """
    if not isinstance(doc, dict) or set(doc) != {"machine", "nodes", "tunnels"}:
        raise ConfigError("part", "a machine's part is {machine, nodes, tunnels}")
    machine, nodes, tunnels = doc["machine"], doc["nodes"], doc["tunnels"]
    if not isinstance(machine, str) or not machine:
        raise ConfigError("part.machine", "a machine's name is a string")
    if not isinstance(nodes, list) or not all(isinstance(n, str) and n in topo.nodes
                                              for n in nodes):
        raise ConfigError("part.nodes", "must be nodes of the fabric's topology")
    links = {l.name: l for l in topo.links}
    place = {n: machine for n in nodes}
    cut = []
    for i, t in enumerate(tunnels if isinstance(tunnels, list) else [None]):
        if not isinstance(t, dict) or t.get("link") not in links \
                or not isinstance(t.get("vni"), int) or not 0 < t["vni"] < 1 << 24 \
                or machine not in (t.get("a_machine"), t.get("b_machine")):
            raise ConfigError(f"part.tunnels[{i}]", "not a cut link of this fabric and machine")
        for end in ("a_underlay", "b_underlay"):
            try:
                ipaddress.ip_address(t.get(end))
            except ValueError:
                raise ConfigError(f"part.tunnels[{i}].{end}", "not an address") from None
        link = links[t["link"]]
        tunnel = CutLink(link, t["vni"], str(t["a_machine"]), str(t["b_machine"]),
                         t["a_underlay"], t["b_underlay"])
        for end, other in ((link.a.node, t["a_machine"]), (link.b.node, t["b_machine"])):
            place.setdefault(end, str(other))
        cut.append(tunnel)
    plan = Partition((Machine(machine, 0.0),), place, tuple(t.link for t in cut), {})
    try:
        return machine_part(topo, plan, cut, machine)
    except ValueError as err:
        raise ConfigError("part", str(err)) from None
