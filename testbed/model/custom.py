"""A fabric drawn by its user (``fabric.topology: custom``): nodes (hosts and switches) and the
links between them, each link's rate its own. Pure.

Each host hangs off one switch (its access switch, a ``leaf``, which owns the subnet of its
hosts and routes to them); a switch with no host is a ``spine``. Names become interface names
(``NAME-ethN``), so they are short: a letter, then letters, digits or ``_``, 10 at most.
Routing that follows shortest paths (ECMP, packet spraying, switch-local adaptive routing,
failover) works on any such graph; what needs a Clos's tiers (D-mod-k, the controller's
adaptive placement) is refused by name on it (:func:`clos_only`).
"""

from __future__ import annotations

import re

import networkx as nx

from testbed.errors import ConfigError
from testbed.model.builders import _Builder, _dpid, _mac_for
from testbed.model.topology import Node, Topology

NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,9}$")
KINDS = ("host", "switch")
#: routing modes that need a Clos's tiers
CLOS_ONLY = ("dmodk", "adaptive")


def custom(nodes: list[dict], links: list[dict], host_rate_mbps: float = 100.0,
           fabric_rate_mbps: float = 100.0) -> Topology:
    """The topology of ``nodes`` (``{name, kind: host|switch}``) and ``links`` (``{a, b,
    rate_mbps}``; without a rate, the tier's: host links ``host_rate_mbps``, switch links
    ``fabric_rate_mbps``).

    Raises:
        ConfigError: naming the node or link that is wrong (``nodes[2].name``, ``links[5]``).
    """
    kinds: dict[str, str] = {}
    for i, node in enumerate(nodes):
        name = node.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise ConfigError(f"nodes[{i}].name", f"{name!r}: a letter, then letters, digits "
                                                  "or _, 10 at most (it names interfaces)")
        if name in kinds:
            raise ConfigError(f"nodes[{i}].name", f"{name!r} is named twice")
        if node.get("kind") not in KINDS:
            raise ConfigError(f"nodes[{i}].kind", f"{node.get('kind')!r}: one of host, switch")
        kinds[name] = node["kind"]
    access: dict[str, str] = {}
    for i, link in enumerate(links):
        a, b = link.get("a"), link.get("b")
        for end, value in (("a", a), ("b", b)):
            if value not in kinds:
                raise ConfigError(f"links[{i}].{end}", f"{value!r} is not a node")
        if a == b:
            raise ConfigError(f"links[{i}]", f"{a} is linked to itself")
        hosts = [n for n in (a, b) if kinds[n] == "host"]
        if len(hosts) == 2:
            raise ConfigError(f"links[{i}]", f"{a} and {b} are both hosts: a host hangs off "
                                             "a switch")
        if hosts:
            host = hosts[0]
            if host in access:
                raise ConfigError(f"links[{i}]", f"host {host} has a link already (to "
                                                 f"{access[host]}): one switch per host")
            access[host] = b if host == a else a
    lonely = [n for n, k in kinds.items() if k == "host" and n not in access]
    if lonely:
        raise ConfigError("links", f"host {lonely[0]} has no link")
    if not any(k == "switch" for k in kinds.values()):
        raise ConfigError("nodes", "no switch")
    return _build(nodes, links, kinds, access, host_rate_mbps, fabric_rate_mbps)


def _build(nodes: list[dict], links: list[dict], kinds: dict[str, str], access: dict[str, str],
           host_rate: float, fabric_rate: float) -> Topology:
    b = _Builder()
    leaves = [n["name"] for n in nodes if n["kind"] == "switch" and n["name"] in access.values()]
    if len(leaves) > 254:
        raise ConfigError("nodes", f"{len(leaves)} switches with hosts: 254 at most")
    groups = {name: g for g, name in enumerate(leaves, start=1)}
    spines = [n["name"] for n in nodes if n["kind"] == "switch" and n["name"] not in groups]
    for name in leaves:
        g = groups[name]
        b.add(Node(name, "leaf", g, g, dpid=_dpid("leaf", g, g), subnet=f"10.0.{g}.0/24"))
    for i, name in enumerate(spines, start=1):
        b.add(Node(name, "spine", 0, i, dpid=_dpid("spine", 0, i)))
    ports = {n: 0 for n in kinds}
    served: dict[str, int] = {}
    for i, link in enumerate(links):
        a, c = link["a"], link["b"]
        host = a if kinds[a] == "host" else c if kinds[c] == "host" else None
        rate = link.get("rate_mbps") or (host_rate if host else fabric_rate)
        if host is not None:
            switch = access[host]
            served[switch] = served.get(switch, 0) + 1
            if served[switch] > 253:
                raise ConfigError(f"links[{i}]", f"{switch} has more than 253 hosts")
            ip = f"10.0.{groups[switch]}.{served[switch]}"
            b.add(Node(host, "host", groups[switch], served[switch], ip=ip, mac=_mac_for(ip)))
            ports[switch] += 1
            b.connect(host, 0, switch, ports[switch], "host", rate)
            continue
        lower, upper = (a, c) if (a in groups) >= (c in groups) else (c, a)
        ports[lower] += 1
        ports[upper] += 1
        b.connect(lower, ports[lower], upper, ports[upper], "fabric", rate)
    topo = Topology("custom", {"nodes": len(nodes), "links": len(links),
                               "host_rate_mbps": host_rate, "fabric_rate_mbps": fabric_rate},
                    b.nodes, tuple(b.links))
    if not nx.is_connected(topo.graph):
        raise ConfigError("links", "the fabric is not connected: some hosts cannot reach others")
    return topo


def clos_only(routing: str, kind: str) -> None:
    """Refuse, by name, a routing mode that needs a Clos's tiers on a fabric without them."""
    if kind in ("custom", "ring") and routing in CLOS_ONLY:
        raise ConfigError("controller.routing", f"{routing} needs a Clos's tiers (fat_tree, "
                                                f"leaf_spine, rail_optimized), not a {kind} "
                                                "fabric: ecmp, spray or local_adaptive work "
                                                "on any graph")


def link_settings(fabric: dict) -> dict:
    """A custom fabric's raw section with its links' ``delay_us`` and ``queue_kb`` carried to
    the tiers (``host_link``/``fabric_link`` delay, the queue): the emulation sets them per
    tier, so the links of a tier must agree, and with what the section says itself.

    Raises:
        ConfigError: naming the link that disagrees.
    """
    kinds = {n.get("name"): n.get("kind") for n in fabric.get("nodes", [])}
    out = dict(fabric)
    set_by: dict[tuple[str, str], tuple[float, int]] = {}
    for i, link in enumerate(fabric.get("links", [])):
        tier = "host_link" if "host" in (kinds.get(link.get("a")), kinds.get(link.get("b"))) \
            else "fabric_link"
        for key, where in (("delay_us", (tier, "delay_us")), ("queue_kb", ("queue", "size_kb"))):
            if key not in link:
                continue
            value = link[key]
            given = (fabric.get(where[0]) or {}).get(where[1])
            earlier = set_by.get(where)
            if (given is not None and earlier is None and given != value) or (
                    earlier is not None and earlier[0] != value):
                first = f"links[{earlier[1]}]" if earlier else f"{where[0]}.{where[1]}"
                raise ConfigError(f"links[{i}].{key}", f"{value} differs from {first}'s "
                                  f"{earlier[0] if earlier else given}: the emulation sets it "
                                  f"per tier ({where[0]}), so a tier's links agree")
            set_by.setdefault(where, (value, i))
            out[where[0]] = {**(out.get(where[0]) or {}), where[1]: value}
    return out
