"""Servers of GPUs (pure): scale-up domains and rail-optimized scale-out fabrics.

A server holds ``gpus_per_server`` GPUs. Each GPU is a rank endpoint with its own scale-out NIC
(a host of the fabric: its own network namespace, its NIC on port 0), named ``s{server}g{gpu}``
(1-based; GPU ``g`` is local rank ``g - 1``, as NCCL numbers them). The GPUs of a server are
joined by a scale-up domain, links of tier ``scale_up`` at their own rate that no OpenFlow
switch sees:

* ``switch`` (NVSwitch): every GPU to the server's scale-up switch ``nvs{server}`` (one hop
  through it between any two GPUs);
* ``full_mesh``: a link between every two GPUs of the server;
* ``cube_mesh``: DGX-1's hybrid cube-mesh of 8 GPUs: two fully connected quads, and GPU ``i``
  of one to GPU ``i`` of the other; a pair without a link relays through a GPU that has both.

Scale-out: on ``leaf_spine`` and ``fat_tree`` the GPUs take the hosts' places in order (server
1's GPUs under the first leaf, ...); ``rail_optimized`` puts GPU ``g`` of every server on rail
``g``'s leaf (``rail{g}`` or, with ``servers_per_leaf``, ``rail{g}_{j}``), with spines above
every rail leaf, so that same-rail traffic crosses one leaf and cross-rail traffic a spine.

A GPU's traffic to a GPU of its own server goes over the scale-up domain
(:func:`scale_up_routes`), anything else over its NIC.
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass, replace
from enum import StrEnum

import networkx as nx

from testbed.errors import ConfigError
from testbed.model.builders import (
    _Builder,
    _check_int,
    _check_rate,
    _dpid,
    _ifname,
    _mac_for,
)
from testbed.model.topology import Endpoint, Link, Node, Server, Topology

MAX_GPUS = 16  # per server: ports and names stay short; larger domains are NVL72 territory


class ScaleUp(StrEnum):
    """How a server's GPUs are joined."""

    SWITCH = "switch"
    FULL_MESH = "full_mesh"
    CUBE_MESH = "cube_mesh"


@dataclass(frozen=True)
class ServerSpec:
    """``fabric.servers``: how many servers, GPUs each, and their scale-up domain."""

    count: int
    gpus_per_server: int
    scale_up: ScaleUp = ScaleUp.SWITCH
    scale_up_rate_mbps: float = 100.0

    @property
    def gpus(self) -> int:
        return self.count * self.gpus_per_server

    def check(self) -> None:
        """Raises ConfigError naming the field (under ``servers``)."""
        _check_int("servers.count", self.count, 1, 254)
        _check_int("servers.gpus_per_server", self.gpus_per_server, 1, MAX_GPUS)
        _check_rate("servers.scale_up.rate_mbps", self.scale_up_rate_mbps)
        if self.scale_up == ScaleUp.CUBE_MESH and self.gpus_per_server != 8:
            raise ConfigError("servers.scale_up.kind", "cube_mesh is DGX-1's hybrid cube-mesh "
                                                       "of 8 GPUs: gpus_per_server must be 8, "
                                                       f"got {self.gpus_per_server}")


@dataclass(frozen=True)
class ScaleUpHop:
    """How a GPU reaches a GPU of its own server: out of ``ifname``, to ``via`` (the GPU that
    relays it, cube-mesh only) or directly (None)."""

    ifname: str
    via: str | None = None


def gpu_name(server: int, gpu: int) -> str:
    """``s{server}g{gpu}``, both 1-based."""
    return f"s{server}g{gpu}"


def cube_mesh_pairs() -> list[tuple[int, int]]:
    """DGX-1's hybrid cube-mesh (1-based GPUs): quads 1-4 and 5-8 fully connected, and ``i``
    to ``i + 4``: 16 links, four per GPU."""
    pairs = []
    for quad in (range(1, 5), range(5, 9)):
        pairs += [(a, b) for a in quad for b in quad if a < b]
    return pairs + [(i, i + 4) for i in range(1, 5)]


def scale_up_links(spec: ServerSpec) -> tuple[tuple[Server, ...], tuple[Link, ...]]:
    """The servers (GPU names, scale-up switch) and their scale-up links. A GPU's scale-up
    ports are 1, 2, ... (its NIC is port 0); a scale-up switch's port ``g`` faces GPU ``g``."""
    servers, links = [], []
    rate = float(spec.scale_up_rate_mbps)
    for s in range(1, spec.count + 1):
        gpus = tuple(gpu_name(s, g) for g in range(1, spec.gpus_per_server + 1))
        switch = f"nvs{s}" if spec.scale_up == ScaleUp.SWITCH else None
        servers.append(Server(f"s{s}", s, gpus, str(spec.scale_up), switch))
        if switch is not None:
            for g, gpu in enumerate(gpus, start=1):
                links.append(Link(Endpoint(gpu, 1, _ifname(gpu, 1)),
                                  Endpoint(switch, g, _ifname(switch, g)), "scale_up", rate))
            continue
        if spec.scale_up == ScaleUp.FULL_MESH:
            pairs = [(a, b) for a in range(1, len(gpus) + 1) for b in range(a + 1, len(gpus) + 1)]
        else:
            pairs = cube_mesh_pairs()
        next_port = dict.fromkeys(gpus, 1)
        for a, b in pairs:
            ga, gb = gpus[a - 1], gpus[b - 1]
            pa, pb = next_port[ga], next_port[gb]
            next_port[ga], next_port[gb] = pa + 1, pb + 1
            links.append(Link(Endpoint(ga, pa, _ifname(ga, pa)), Endpoint(gb, pb, _ifname(gb, pb)),
                              "scale_up", rate))
    return tuple(servers), tuple(links)


def place_servers(topo: Topology, spec: ServerSpec) -> Topology:
    """``topo`` (a leaf-spine or fat-tree) with its hosts as the servers' GPUs, in order: host
    ``i`` (by attachment) becomes GPU ``i % gpus_per_server + 1`` of server
    ``i // gpus_per_server + 1``; addresses and ports stay.

    Raises:
        ConfigError: when the fabric's host count is not the servers' GPU count.
    """
    spec.check()
    hosts = sorted(topo.hosts, key=lambda h: (h.group, topo.attachment(h.name).node, h.index))
    if len(hosts) != spec.gpus:
        raise ConfigError("servers", f"{spec.count} servers x {spec.gpus_per_server} GPUs are "
                                     f"{spec.gpus} NICs, but the {topo.kind} has {len(hosts)} "
                                     "host ports")
    rename = {h.name: gpu_name(i // spec.gpus_per_server + 1, i % spec.gpus_per_server + 1)
              for i, h in enumerate(hosts)}
    nodes = {}
    for node in topo.nodes.values():
        name = rename.get(node.name, node.name)
        nodes[name] = Node(name, node.role, node.group, node.index, node.dpid, node.ip,
                           node.mac, node.subnet)

    def end(e: Endpoint) -> Endpoint:
        name = rename.get(e.node, e.node)
        return Endpoint(name, e.port, _ifname(name, e.port))

    links = tuple(Link(end(l.a), end(l.b), l.tier, l.rate_mbps) for l in topo.links)
    servers, up = scale_up_links(spec)
    return Topology(topo.kind, {**topo.params, **_params(spec)}, nodes, links, servers, up)


MAX_PLANES = 8


def nic_name(server: int, gpu: int, plane: int) -> str:
    """A GPU's NIC on ``plane``: the GPU itself on plane 1, ``s{server}g{gpu}n{plane}`` on the
    others."""
    return gpu_name(server, gpu) if plane == 1 else f"{gpu_name(server, gpu)}n{plane}"


def rail_optimized(spec: ServerSpec, spines: int, servers_per_leaf: int | None = None,
                   host_rate_mbps: float = 100.0, fabric_rate_mbps: float = 100.0,
                   planes: int = 1) -> Topology:
    """A rail-optimized fabric: one leaf per rail (GPU ``g`` of every server; with
    ``servers_per_leaf``, a rail's servers split over several leaves), every leaf to every
    spine; with ``planes``, that many such networks side by side, disjoint, each GPU with one
    NIC port on each (a multi-plane fabric: a NIC's ports split over planes, as 800G NICs are
    run as 2 x 400G, or 4 x 200G, planes).

    Leaf ports ``1..servers_per_leaf`` face GPUs, then one per spine; spine port ``l`` faces
    leaf ``l`` of its plane. Leaf ``l`` of plane ``p`` owns ``10.{p - 1}.{l}.0/24``. With one
    plane the switches are ``rail{g}[_{j}]`` and ``spine{i}``; with more, ``p{p}`` goes before
    each name, and a GPU's plane-``p`` NIC is the host ``s{s}g{g}n{p}`` (plane 1's is the GPU).

    Raises:
        ConfigError: naming the field that is out of range.
    """
    spec.check()
    per_leaf = spec.count if servers_per_leaf is None else servers_per_leaf
    _check_int("servers_per_leaf", per_leaf, 1, 253)
    _check_int("spines", spines, 1, 254)
    _check_int("planes", planes, 1, MAX_PLANES)
    _check_rate("host_rate_mbps", host_rate_mbps)
    _check_rate("fabric_rate_mbps", fabric_rate_mbps)
    groups = math.ceil(spec.count / per_leaf)
    if spec.gpus_per_server * groups > 254:
        raise ConfigError("servers", f"{spec.gpus_per_server * groups} rail leaves: at most "
                                     "254")
    b = _Builder()
    number = 0  # leaves across planes (their DPIDs)
    for plane in range(1, planes + 1):
        prefix = f"p{plane}" if planes > 1 else ""
        spine_nodes = [b.add(Node(f"{prefix}spine{i}", "spine", plane - 1, i,
                                  dpid=_dpid("spine", plane - 1, i)))
                       for i in range(1, spines + 1)]
        in_plane = 0
        for rail in range(1, spec.gpus_per_server + 1):
            for j in range(1, groups + 1):
                number += 1
                in_plane += 1
                name = f"{prefix}rail{rail}" if groups == 1 else f"{prefix}rail{rail}_{j}"
                leaf = b.add(Node(name, "leaf", number, number,
                                  dpid=_dpid("leaf", number, number),
                                  subnet=f"10.{plane - 1}.{in_plane}.0/24"))
                net = ipaddress.ip_network(leaf.subnet)
                first = (j - 1) * per_leaf
                for i, server in enumerate(range(first + 1,
                                                 min(first + per_leaf, spec.count) + 1), start=1):
                    ip = str(net.network_address + i)
                    nic = b.add(Node(nic_name(server, rail, plane), "host", number, i, ip=ip,
                                     mac=_mac_for(ip)))
                    b.connect(nic.name, 0, leaf.name, i, "host", host_rate_mbps)
                for s, spine in enumerate(spine_nodes, start=1):
                    b.connect(leaf.name, per_leaf + s, spine.name, in_plane, "fabric",
                              fabric_rate_mbps)
    servers, up = scale_up_links(spec)
    if planes > 1:
        servers = tuple(replace(server, planes=tuple(
            tuple(nic_name(server.index, g, plane) for g in range(1, spec.gpus_per_server + 1))
            for plane in range(2, planes + 1))) for server in servers)
    return Topology("rail_optimized", {"spines": spines, "servers_per_leaf": per_leaf,
                                       "planes": planes, "host_rate_mbps": host_rate_mbps,
                                       "fabric_rate_mbps": fabric_rate_mbps, **_params(spec)},
                    b.nodes, tuple(b.links), servers, up)


def _params(spec: ServerSpec) -> dict:
    return {"servers": spec.count, "gpus_per_server": spec.gpus_per_server,
            "scale_up": str(spec.scale_up), "scale_up_rate_mbps": spec.scale_up_rate_mbps}


def scale_up_routes(topo: Topology) -> dict[str, dict[str, ScaleUpHop]]:
    """For every GPU, how it reaches each other GPU of its server: the interface, and the GPU
    that relays (cube-mesh pairs without a link: the lowest-numbered GPU linked to both)."""
    routes: dict[str, dict[str, ScaleUpHop]] = {}
    for server in topo.servers:
        graph = nx.Graph()
        graph.add_nodes_from(server.gpus)
        out: dict[tuple[str, str], str] = {}  # (gpu, neighbour) -> the gpu's interface
        for link in topo.scale_up:
            if link.a.node in server.gpus or link.b.node in server.gpus:
                graph.add_edge(link.a.node, link.b.node)
                out[(link.a.node, link.b.node)] = link.a.ifname
                out[(link.b.node, link.a.node)] = link.b.ifname
        for gpu in server.gpus:
            table = routes.setdefault(gpu, {})
            for peer in server.gpus:
                if peer == gpu:
                    continue
                if server.switch is not None:
                    table[peer] = ScaleUpHop(out[(gpu, server.switch)])
                elif graph.has_edge(gpu, peer):
                    table[peer] = ScaleUpHop(out[(gpu, peer)])
                else:
                    via = min((n for n in graph[gpu] if graph.has_edge(n, peer)),
                              key=server.gpus.index)
                    table[peer] = ScaleUpHop(out[(gpu, via)], via)
    return routes


def describe(topo: Topology) -> str | None:
    """Both domains in a line (None: no servers): ``4 servers x 4 GPUs; scale-up: switch,
    16 links at 40 Mbit/s; scale-out: one NIC per GPU on 4 rails``."""
    if not topo.servers:
        return None
    gpus = len(topo.servers[0].gpus)
    rate = topo.scale_up[0].rate_mbps if topo.scale_up else 0.0
    planes = 1 + len(topo.servers[0].planes)
    rails = (f"on {gpus} rails" if topo.kind == "rail_optimized"
             else f"in order on the {topo.kind}")
    nic = "one NIC per GPU" if planes == 1 else f"one NIC per GPU with a port on each of " \
                                                 f"{planes} planes,"
    return (f"{len(topo.servers)} servers x {gpus} GPUs; scale-up: {topo.servers[0].scale_up}, "
            f"{len(topo.scale_up)} links at {rate:g} Mbit/s; scale-out: {nic} {rails}")

