"""The fabric shapes: k-ary fat-trees, 2-tier leaf-spine fabrics and rings, built node by node
with their names, addresses, MACs, DPIDs and ports (rail-optimized fabrics of GPU servers:
:mod:`testbed.model.servers`, with the same builder). Pure."""

from __future__ import annotations

import ipaddress

from testbed.errors import ConfigError
from testbed.model.topology import _ROLE_CODE, Endpoint, Link, Node, Topology


# -- builders ---------------------------------------------------------------------------------
def _ifname(node: str, port: int) -> str:
    return f"{node}-eth{port}"


def _mac_for(ip: str) -> str:
    octets = ipaddress.ip_address(ip).packed
    return "02:00:" + ":".join(f"{b:02x}" for b in octets)


def _dpid(role: str, group: int, index: int) -> int:
    return (_ROLE_CODE[role] << 40) | (group << 16) | index


def _check_int(name: str, value: object, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(name, f"must be an integer, got {value!r}")
    if not low <= value <= high:
        raise ConfigError(name, f"must be between {low} and {high}, got {value}")


def _check_rate(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ConfigError(name, f"must be a number > 0, got {value!r}")


class _Builder:
    """Accumulates nodes and links with per-node port counters."""

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self.links: list[Link] = []

    def add(self, node: Node) -> Node:
        self.nodes[node.name] = node
        return node

    def connect(self, lower: str, lower_port: int, upper: str, upper_port: int,
                tier: str, rate_mbps: float) -> None:
        self.links.append(Link(Endpoint(lower, lower_port, _ifname(lower, lower_port)),
                               Endpoint(upper, upper_port, _ifname(upper, upper_port)),
                               tier, float(rate_mbps)))

    def add_hosts(self, switch: Node, count: int, prefix: str, rate_mbps: float) -> None:
        net = ipaddress.ip_network(switch.subnet)
        for i in range(1, count + 1):
            ip = str(net.network_address + i)
            host = self.add(Node(f"{prefix}_{i}", "host", switch.group, i, ip=ip, mac=_mac_for(ip)))
            self.connect(host.name, 0, switch.name, i, "host", rate_mbps)


def fat_tree(k: int, host_rate_mbps: float = 100.0, fabric_rate_mbps: float = 100.0) -> Topology:
    """Build a k-ary fat-tree (Al-Fares et al.): k pods, k^3/4 hosts, 5k^2/4 switches.

    Port numbering: edge ports 1..k/2 face hosts, k/2+1..k face aggregation; aggregation ports
    1..k/2 face edges, k/2+1..k face cores; core port p faces pod p.

    Args:
        k: switch radix, even and >= 4.
        host_rate_mbps: rate of host-edge links.
        fabric_rate_mbps: rate of edge-agg and agg-core links.

    Returns:
        The topology.

    Raises:
        ConfigError: for an odd or too small k, or a non-positive rate.
    """
    if not isinstance(k, int) or isinstance(k, bool):
        raise ConfigError("k", f"must be an integer, got {k!r}")
    if k < 4:
        raise ConfigError("k", f"must be >= 4, got {k}")
    if k % 2:
        raise ConfigError("k", f"must be even, got {k}")
    if k > 254:
        raise ConfigError("k", f"must be <= 254 (one /16 per pod), got {k}")
    _check_rate("host_rate_mbps", host_rate_mbps)
    _check_rate("fabric_rate_mbps", fabric_rate_mbps)
    half = k // 2
    b = _Builder()
    cores = [b.add(Node(f"core{i}", "core", 0, i, dpid=_dpid("core", 0, i)))
             for i in range(1, half * half + 1)]
    for pod in range(1, k + 1):
        aggs = [b.add(Node(f"agg{pod}_{i}", "agg", pod, i, dpid=_dpid("agg", pod, i)))
                for i in range(1, half + 1)]
        for e in range(1, half + 1):
            edge = b.add(Node(f"edge{pod}_{e}", "edge", pod, e, dpid=_dpid("edge", pod, e),
                              subnet=f"10.{pod}.{e}.0/24"))
            b.add_hosts(edge, half, f"h{pod}_{e}", host_rate_mbps)
            for a, agg in enumerate(aggs, start=1):
                b.connect(edge.name, half + a, agg.name, e, "fabric", fabric_rate_mbps)
        for a, agg in enumerate(aggs, start=1):
            for c in range(1, half + 1):
                core = cores[(a - 1) * half + (c - 1)]
                b.connect(agg.name, half + c, core.name, pod, "fabric", fabric_rate_mbps)
    return Topology("fat_tree", {"k": k, "host_rate_mbps": host_rate_mbps,
                                 "fabric_rate_mbps": fabric_rate_mbps}, b.nodes, tuple(b.links))


def leaf_spine(leaves: int, spines: int, hosts_per_leaf: int, host_rate_mbps: float = 100.0,
               fabric_rate_mbps: float = 100.0) -> Topology:
    """Build a 2-tier leaf-spine (folded Clos) fabric.

    Leaf ports 1..hosts_per_leaf face hosts, then one port per spine; spine port l faces leaf l.
    Oversubscription is ``hosts_per_leaf * host_rate / (spines * fabric_rate)``.

    Args:
        leaves: number of leaf switches (1..254).
        spines: number of spine switches (>= 1).
        hosts_per_leaf: hosts under each leaf (1..253).
        host_rate_mbps: rate of host-leaf links.
        fabric_rate_mbps: rate of leaf-spine links.

    Returns:
        The topology.

    Raises:
        ConfigError: naming the field that is out of range.
    """
    for name, value, low, high in (("leaves", leaves, 1, 254), ("spines", spines, 1, 254),
                                   ("hosts_per_leaf", hosts_per_leaf, 1, 253)):
        _check_int(name, value, low, high)
    _check_rate("host_rate_mbps", host_rate_mbps)
    _check_rate("fabric_rate_mbps", fabric_rate_mbps)
    b = _Builder()
    spine_nodes = [b.add(Node(f"spine{i}", "spine", 0, i, dpid=_dpid("spine", 0, i)))
                   for i in range(1, spines + 1)]
    for l in range(1, leaves + 1):
        leaf = b.add(Node(f"leaf{l}", "leaf", l, l, dpid=_dpid("leaf", l, l),
                          subnet=f"10.0.{l}.0/24"))
        b.add_hosts(leaf, hosts_per_leaf, f"h{l}", host_rate_mbps)
        for s, spine in enumerate(spine_nodes, start=1):
            b.connect(leaf.name, hosts_per_leaf + s, spine.name, l, "fabric", fabric_rate_mbps)
    return Topology("leaf_spine", {"leaves": leaves, "spines": spines,
                                   "hosts_per_leaf": hosts_per_leaf,
                                   "host_rate_mbps": host_rate_mbps,
                                   "fabric_rate_mbps": fabric_rate_mbps},
                    b.nodes, tuple(b.links))


def ring(leaves: int, hosts_per_leaf: int, host_rate_mbps: float = 100.0,
         fabric_rate_mbps: float = 100.0) -> Topology:
    """Build a ring of leaf switches: not a data-center fabric, but the smallest one whose
    shortest-path routes form a cycle of buffer dependencies (the PFC deadlock experiment).

    Leaf ports 1..hosts_per_leaf face hosts, port ``hosts_per_leaf + 1`` the next leaf
    (clockwise) and ``hosts_per_leaf + 2`` the previous one. With five or more leaves a flow to
    the leaf two ahead has one shortest path, clockwise.

    Raises:
        ConfigError: naming the field that is out of range.
    """
    for name, value, low, high in (("leaves", leaves, 3, 254),
                                   ("hosts_per_leaf", hosts_per_leaf, 1, 253)):
        _check_int(name, value, low, high)
    _check_rate("host_rate_mbps", host_rate_mbps)
    _check_rate("fabric_rate_mbps", fabric_rate_mbps)
    b = _Builder()
    nodes = []
    for l in range(1, leaves + 1):
        leaf = b.add(Node(f"leaf{l}", "leaf", l, l, dpid=_dpid("leaf", l, l),
                          subnet=f"10.0.{l}.0/24"))
        b.add_hosts(leaf, hosts_per_leaf, f"h{l}", host_rate_mbps)
        nodes.append(leaf)
    for i, leaf in enumerate(nodes):
        nxt = nodes[(i + 1) % leaves]
        b.connect(leaf.name, hosts_per_leaf + 1, nxt.name, hosts_per_leaf + 2, "fabric",
                  fabric_rate_mbps)
    return Topology("ring", {"leaves": leaves, "hosts_per_leaf": hosts_per_leaf,
                             "host_rate_mbps": host_rate_mbps,
                             "fabric_rate_mbps": fabric_rate_mbps}, b.nodes, tuple(b.links))
