"""Pure topology model: k-ary fat-trees and 2-tier leaf-spine fabrics (servers of GPUs and
rail-optimized fabrics: :mod:`testbed.model.servers`).

Nothing here touches the system. The model fixes every name, DPID, port number, MAC and IP address
so that the adapters, the controller and the reports all agree on them.

Naming (1-based indices):

* fat-tree: ``core{i}``, ``agg{pod}_{i}``, ``edge{pod}_{i}``, hosts ``h{pod}_{edge}_{i}``;
* leaf-spine: ``spine{i}``, ``leaf{i}``, hosts ``h{leaf}_{i}``;
* interfaces: ``{node}-eth{port}`` (hosts have one interface, port 0).

Addressing: every edge (or leaf) switch owns the /24 ``10.{pod}.{edge}.0`` (leaf-spine:
``10.0.{leaf}.0``); its i-th host is ``.i``. All hosts share one on-link /8, and the switches route
on the /24s.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property

import networkx as nx

from testbed.errors import ConfigError

IFNAMSIZ = 15  # Linux interface names hold at most 15 characters
HOST_NETWORK = ipaddress.ip_network("10.0.0.0/8")
HOST_PREFIX_LEN = HOST_NETWORK.prefixlen
#: a multi-plane NIC's prefix: plane ``p`` is ``10.{p - 1}.0.0/16``, more specific than the
#: plane-1 NIC's ``/8``, so each plane's traffic leaves by its own NIC
PLANE_PREFIX_LEN = 16

# DPID layout: role code in the top byte, then group (pod/leaf) and index.
_ROLE_CODE = {"core": 0x01, "agg": 0x02, "edge": 0x03, "spine": 0x11, "leaf": 0x12}
SWITCH_ROLES = tuple(_ROLE_CODE)
#: Roles whose switches own a host subnet (where routes terminate).
ACCESS_ROLES = ("edge", "leaf")
#: Tier of each switch role, counted from the hosts' switches (0) up.
ROLE_TIER = {"edge": 0, "leaf": 0, "agg": 1, "spine": 1, "core": 2}




def hostname(name: str) -> str:
    """A node's name as a hostname: a hostname has letters, digits, dots and hyphens only
    (RFC 1123; Open MPI refuses any other), so ``h1_1_1`` is ``h1-1-1``."""
    return re.sub(r"[^A-Za-z0-9.-]", "-", name)

@dataclass(frozen=True)
class Node:
    """A switch or a host of the fabric."""

    name: str
    role: str  # core | agg | edge | spine | leaf | host
    group: int = 0  # pod (fat-tree) or leaf index; 0 where it does not apply
    index: int = 0
    dpid: int | None = None  # switches only
    ip: str | None = None  # hosts only
    mac: str | None = None  # hosts only
    subnet: str | None = None  # access switches only: the /24 they own

    @property
    def is_switch(self) -> bool:
        return self.role != "host"

    @property
    def dpid_hex(self) -> str:
        """The DPID as the 16 hex digits Open vSwitch expects."""
        if self.dpid is None:
            raise ValueError(f"{self.name} is not a switch")
        return f"{self.dpid:016x}"


@dataclass(frozen=True)
class Endpoint:
    """One end of a link: a node, its port number and the interface name."""

    node: str
    port: int
    ifname: str


@dataclass(frozen=True)
class Link:
    """A point-to-point link. ``a`` is the lower-tier end (host, edge, leaf, agg)."""

    a: Endpoint
    b: Endpoint
    tier: str  # "host" (host-access) or "fabric" (switch-switch)
    rate_mbps: float

    @property
    def name(self) -> str:
        """A stable name for the link, such as ``edge1_1:3-agg1_1:1``."""
        return f"{self.a.node}:{self.a.port}-{self.b.node}:{self.b.port}"

    def other(self, node: str) -> Endpoint:
        """The end of this link that is not on ``node``."""
        return self.b if self.a.node == node else self.a

    def end(self, node: str) -> Endpoint:
        """The end of this link on ``node``."""
        return self.a if self.a.node == node else self.b


@dataclass(frozen=True)
class Server:
    """A server of GPUs (:mod:`testbed.model.servers`): its GPUs are hosts of the fabric, in local
    rank order (GPU ``g`` of every server is on rail ``g``), joined by a scale-up domain."""

    name: str  # s{index}
    index: int  # 1-based
    gpus: tuple[str, ...]
    scale_up: str  # switch | full_mesh | cube_mesh
    switch: str | None = None  # the scale-up switch's name (kind switch)
    #: a multi-plane fabric's other NICs: for plane 2, 3, ... the NIC of each GPU (in GPU
    #: order), hosts of that plane in the GPU's namespace (the GPU itself is its plane-1 NIC)
    planes: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True)
class Topology:
    """An immutable fabric: nodes, links, and the questions asked of them.

    ``links`` are the scale-out network's (what the controller routes); a fabric of servers
    also has ``servers`` and their ``scale_up`` links (tier ``scale_up``), which no OpenFlow
    switch sees.
    """

    kind: str  # fat_tree | leaf_spine | ring | rail_optimized
    params: dict
    nodes: dict[str, Node]
    links: tuple[Link, ...]
    servers: tuple[Server, ...] = ()
    scale_up: tuple[Link, ...] = ()
    _by_port: dict = field(default_factory=dict, compare=False, repr=False)
    _by_node: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for link in (*self.links, *self.scale_up):
            for end in (link.a, link.b):
                if len(end.ifname) > IFNAMSIZ:
                    raise ConfigError(
                        "fabric", f"interface name {end.ifname!r} exceeds {IFNAMSIZ} characters; "
                        "the fabric is too large for Linux interface names")
                key = (end.node, end.port)
                if key in self._by_port:
                    raise AssertionError(f"port {key} used twice")
                self._by_port[key] = link
                if link.tier != "scale_up":  # ports() is the scale-out network's
                    self._by_node.setdefault(end.node, {})[end.port] = link

    # -- selections ---------------------------------------------------------------------------
    @property
    def hosts(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.role == "host"]

    @property
    def switches(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.is_switch]

    @property
    def access_switches(self) -> list[Node]:
        """Edge (fat-tree) or leaf (leaf-spine) switches: the ones hosts attach to."""
        return [n for n in self.nodes.values() if n.role in ACCESS_ROLES]

    def etc_hosts(self) -> str:
        """The ``/etc/hosts`` every host of the fabric sees: loopback, then each host's (and
        each plane NIC's) address, name and hostname (:func:`hostname`, where it differs),
        so that a launcher or ``socket.gethostbyname`` finds every node by either."""
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        lines += [f"{h.ip}\t{h.name}" + (f" {hostname(h.name)}" if hostname(h.name) != h.name
                                         else "") for h in self.hosts if h.ip]
        return "\n".join(lines) + "\n"

    def rank_hosts(self) -> list[str]:
        """The hosts in rank order: a fabric of servers numbers its GPUs as NCCL does (rank
        ``r`` is GPU ``r % gpus_per_server`` of server ``r // gpus_per_server``), any other
        its hosts in attachment order."""
        if self.servers:
            return [gpu for server in self.servers for gpu in server.gpus]
        return [h.name for h in self.hosts]

    def server_of(self, host: str) -> Server | None:
        """The server whose GPU ``host`` is (None: a plain host)."""
        return self._server_by_gpu.get(host)

    @cached_property
    def _server_by_gpu(self) -> dict[str, Server]:
        return {gpu: server for server in self.servers for gpu in server.gpus}

    def nics(self, host: str) -> tuple[str, ...]:
        """A rank host's NICs by plane (the host itself first; one NIC without planes)."""
        return self._nics.get(host, (host,))

    def nic_owner(self, host: str) -> str:
        """The rank host (GPU) whose namespace a NIC is in: a plane's NIC's GPU, else itself."""
        return self._owner.get(host, host)

    def plane_of(self, host: str) -> int:
        """The plane (1-based) a host's NIC is on: 1 without planes."""
        owner = self.nic_owner(host)
        return self.nics(owner).index(host) + 1

    @cached_property
    def _nics(self) -> dict[str, tuple[str, ...]]:
        return {gpu: (gpu, *(plane[i] for plane in server.planes))
                for server in self.servers if server.planes
                for i, gpu in enumerate(server.gpus)}

    @cached_property
    def _owner(self) -> dict[str, str]:
        return {nic: gpu for gpu, nics in self._nics.items() for nic in nics[1:]}

    def scale_up_ports(self, node: str) -> dict[int, Link]:
        """Map port number -> scale-up link for one GPU or scale-up switch."""
        return {end.port: link for link in self.scale_up for end in (link.a, link.b)
                if end.node == node}

    def switch_by_dpid(self, dpid: int) -> Node | None:
        for node in self.switches:
            if node.dpid == dpid:
                return node
        return None

    def ports(self, node: str) -> dict[int, Link]:
        """Map port number -> link for one node."""
        return dict(sorted(self._by_node.get(node, {}).items()))

    def link_at(self, node: str, port: int) -> Link | None:
        return self._by_port.get((node, port))

    def host_link(self, host: str) -> Link:
        """The single access link of a host."""
        return self._by_port[(host, 0)]

    def attachment(self, host: str) -> Endpoint:
        """The switch port a host is attached to."""
        return self.host_link(host).other(host)

    def find_link(self, node1: str, node2: str) -> Link:
        """The link between two adjacent nodes (the first one, if there are several)."""
        for link in self.links:
            if {link.a.node, link.b.node} == {node1, node2}:
                return link
        raise KeyError(f"no link between {node1} and {node2}")

    # -- graph questions ----------------------------------------------------------------------
    @cached_property
    def graph(self) -> nx.MultiGraph:
        graph = nx.MultiGraph()
        graph.add_nodes_from(self.nodes)
        for link in self.links:
            graph.add_edge(link.a.node, link.b.node, key=link.name)
        return graph

    def equal_cost_paths(self, src: str, dst: str) -> list[list[str]]:
        """All shortest node paths from ``src`` to ``dst`` (hosts or switches), sorted."""
        simple = nx.Graph(self.graph)
        return sorted(nx.all_shortest_paths(simple, src, dst))

    def path_shares(self, src_switch: str, dst_switch: str) -> dict[tuple[str, str], float]:
        """The directed switch-to-switch hops of the shortest paths between two switches, each
        with the share of a flow that an even split over those paths puts on it."""
        if src_switch == dst_switch:
            return {}
        graph = nx.Graph(self.graph.subgraph(n.name for n in self.switches))
        paths = list(nx.all_shortest_paths(graph, src_switch, dst_switch))
        shares: dict[tuple[str, str], float] = {}
        for path in paths:
            for hop in zip(path, path[1:]):
                shares[hop] = shares.get(hop, 0.0) + 1 / len(paths)
        return shares

    # -- summary ------------------------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        """Node and link counts per role and tier."""
        out: dict[str, int] = {"hosts": len(self.hosts), "switches": len(self.switches),
                               "links": len(self.links)}
        for role in SWITCH_ROLES:
            n = sum(1 for s in self.switches if s.role == role)
            if n:
                out[role] = n
        return out

    def oversubscription(self) -> float:
        """Access-tier ratio: host bandwidth below an access switch over its uplink bandwidth."""
        sw = self.access_switches[0]
        down = sum(l.rate_mbps for l in self.ports(sw.name).values() if l.tier == "host")
        up = sum(l.rate_mbps for l in self.ports(sw.name).values() if l.tier == "fabric")
        return down / up

    def to_dict(self) -> dict:
        """A JSON-serialisable form, read back by :func:`from_dict` (the controller's input)."""
        return {
            "kind": self.kind,
            "params": self.params,
            "nodes": [vars(n) for n in self.nodes.values()],
            "links": [_link_dict(l) for l in self.links],
            "servers": [{**vars(s), "gpus": list(s.gpus),
                         "planes": [list(plane) for plane in s.planes]} for s in self.servers],
            "scale_up": [_link_dict(l) for l in self.scale_up],
        }


def _link_dict(link: Link) -> dict:
    return {"a": vars(link.a), "b": vars(link.b), "tier": link.tier, "rate_mbps": link.rate_mbps}


def _link(data: dict) -> Link:
    return Link(Endpoint(**data["a"]), Endpoint(**data["b"]), data["tier"], data["rate_mbps"])


def from_dict(data: dict) -> Topology:
    """Rebuild a :class:`Topology` from :meth:`Topology.to_dict` output."""
    nodes = {n["name"]: Node(**n) for n in data["nodes"]}
    return Topology(data["kind"], dict(data["params"]), nodes,
                    tuple(_link(l) for l in data["links"]),
                    tuple(Server(**{**s, "gpus": tuple(s["gpus"]),
                                    "planes": tuple(map(tuple, s.get("planes", ())))})
                          for s in data.get("servers", [])),
                    tuple(_link(l) for l in data.get("scale_up", [])))


def feeds(topo: Topology, node: str, ingress: Link, egress: Link) -> bool:
    """Whether the controller's routing can forward a packet that entered switch ``node`` by
    ``ingress`` out of ``egress``: another port, and not back up after coming down (up-down
    routing: a packet from a higher tier only goes down)."""
    if ingress is egress:
        return False
    tier = ROLE_TIER.get(topo.nodes[node].role, -1)
    up = lambda link: ROLE_TIER.get(topo.nodes[link.other(node).node].role, -1) > tier  # noqa
    return not (up(ingress) and up(egress))


def all_interfaces(topo: Topology) -> Iterable[Endpoint]:
    """Every link end of the topology."""
    for link in topo.links:
        yield link.a
        yield link.b


def shard_switches(topo: Topology, shards: int,
                   only: frozenset[str] | None = None) -> list[list[str]]:
    """Split the switches into ``shards`` near-equal groups that keep neighbours together
    (pods, then the core), e.g. to spread them over several switch processes.

    Args:
        topo: the topology.
        shards: how many groups (capped at the number of switches).
        only: the switches to split (a cluster machine's); None: all.

    Returns:
        Non-empty lists of switch names.
    """
    if shards < 1:
        raise ConfigError("shards", f"must be >= 1, got {shards}")
    order = sorted((s for s in topo.switches if only is None or s.name in only),
                   key=lambda s: (s.group == 0, s.group, s.role, s.index))
    n = min(shards, len(order))
    size, extra = divmod(len(order), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        out.append([s.name for s in order[start:end]])
        start = end
    return out
