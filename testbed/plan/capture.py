"""Where ``fabriclab capture`` listens: a link or a port of a running fabric, named as a user
names it, resolved to one interface and the namespace it is in."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.errors import ConfigError
from testbed.model.topology import Topology
from testbed.plan.failplan import target_link


@dataclass(frozen=True)
class CapturePoint:
    """An interface to capture on: a switch port (root namespace, ``host`` None) or a host's
    NIC (inside ``host``'s namespace: the GPU's, for a plane's NIC)."""

    ifname: str
    host: str | None
    what: str  # for the user: "link edge1_1-agg1_1 at edge1_1 (edge1_1-eth3)"


def capture_point(topo: Topology, target: list[str]) -> CapturePoint:
    """``[a, b]``: the link between nodes a and b, at a's end; ``[port]``: a switch port's
    interface (``edge1_1-eth3``) or a host's NIC (a host with one link).

    Raises:
        ConfigError: naming ``target``: unknown node or port, no such link, a switch alone or a
            host with several links (name the link).
    """
    if len(target) == 2:
        a, b = target
        link = target_link(topo, a, b)
        return _at(topo, link.end(a).ifname, a, f"link {a}-{b} at {a}")
    if len(target) != 1:
        raise ConfigError("target", "give a link (two nodes: edge1_1 agg1_1) or a port "
                                    "(edge1_1-eth3, or a host with one link)")
    name = target[0]
    ends = {e.ifname: e.node for link in topo.links for e in (link.a, link.b)}
    if name in ends:
        return _at(topo, name, ends[name], f"port {name} of {ends[name]}")
    node = topo.nodes.get(name)
    if node is None:
        raise ConfigError("target", f"no node or port {name!r} in the running fabric")
    links = list(topo.ports(name).values())
    if node.is_switch or len(links) != 1:
        some = ", ".join(f"{name} {l.other(name).node}" for l in links[:3])
        raise ConfigError("target", f"{name} has {len(links)} links: name one ({some}, ...) "
                                    f"or a port ({links[0].end(name).ifname}, ...)"
                          if links else f"{name} has no links")
    return _at(topo, links[0].end(name).ifname, name, f"{name}'s NIC")


def _at(topo: Topology, ifname: str, node: str, what: str) -> CapturePoint:
    host = None if topo.nodes[node].is_switch else topo.nic_owner(node)
    return CapturePoint(ifname, host, f"{what} ({ifname})")
