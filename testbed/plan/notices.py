"""Fault notices between switches (pure): where a switch can no longer forward a destination,
the switches that send it that destination stop doing so, before any controller acts.

A switch whose route to a destination lost every live port (a SELECT or fast-failover group
with none left, an output to a dead port) has *stranded* that destination. InfiniBand fabrics
answer this in the switches (NVIDIA's SHIELD: fault routing notifications): the switch tells
its neighbours, and each neighbour whose own route to the destination spreads over several
ports stops using the port towards it; a neighbour left with no port strands the destination
in turn and tells its own. A k=4 fat-tree's core1 losing its only link to pod 2 is the case
that matters: without notices the other pods' aggregation switches keep hashing pod 2's flows
to core1, which drops them until the controller has heard of the failure and changed every
one of those switches (tens of milliseconds); with them the flows move at once.

Notices only take ports away from a switch's groups, never add one, so the forwarding stays
loop-free whenever the controller's tables are (every switch forwards along a subset of its
next hops); a notice lasts while its cause does (the port comes back, or the controller's new
tables no longer strand the destination) and ends by itself then. The computation is the least
fixpoint of "stranded" and "stopped using" over every switch, from the switches' tables as the
controller set them and the ports' liveness.

A destination is a flow's ``ipv4_dst`` prefix, for flows that match nothing else but the
Ethernet type (the routes); a neighbour's group is narrowed only where every route through it
goes to destinations stranded behind that port. Flows of other matches (the adaptive routing's
exact-match entries) are left as they are.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import lru_cache
from ipaddress import IPv4Network

from testbed.model.openflow import CONTROLLER_PORT, FlowEntry, GroupEntry

#: per switch, per group id: the ports it stops using
Exclusions = dict[str, dict[int, frozenset[int]]]


@dataclass(frozen=True)
class SwitchView:
    """One switch as the notices see it: its tables as the controller set them, its dead
    ports, and what is behind each port (port -> the neighbouring switch's name)."""

    flows: tuple[FlowEntry, ...]
    groups: dict[int, GroupEntry]
    dead: frozenset[int] = frozenset()
    peers: dict[int, str] = field(default_factory=dict)


@lru_cache(maxsize=65536)  # the same entries, every time a switch's tables change
def destination(entry: FlowEntry) -> IPv4Network | None:
    """The destinations a route forwards: its ``ipv4_dst`` prefix, where it matches nothing
    else but the Ethernet type; None for any other flow."""
    fields = dict(entry.match)
    if "ipv4_dst" not in fields or set(fields) - {"eth_type", "ipv4_dst"}:
        return None
    value = fields["ipv4_dst"]
    address, mask = value if isinstance(value, tuple) else (value, "255.255.255.255")
    try:
        return IPv4Network(f"{address}/{mask}", strict=False)
    except ValueError:
        return None


@lru_cache(maxsize=65536)
def forwarding(entry: FlowEntry) -> tuple[str, int] | None:
    """A route's way out: ("group", id) or ("output", port); None for anything else."""
    for name, value in entry.actions:
        if name == "group" or (name == "output" and value != CONTROLLER_PORT):
            return name, value
    return None


def _covered(dsts: Iterable[IPv4Network], stranded: set[IPv4Network]) -> bool:
    if not stranded:
        return False
    if all(d in stranded for d in dsts):  # the same prefixes, as routes mostly are
        return True
    return all(any(d.subnet_of(s) for s in stranded) for d in dsts)


Route = tuple[IPv4Network, tuple[str, int]]  # a destination and its way out


def routes(view: SwitchView) -> list[Route]:
    """A switch's routes: (destination, way out) of each flow that is one."""
    return [(d, hop) for f in view.flows
            if (d := destination(f)) is not None and (hop := forwarding(f)) is not None]


def group_destinations(pairs: list[Route]) -> dict[int, list[IPv4Network]]:
    """Group id -> the destinations of the routes through it."""
    out: dict[int, list[IPv4Network]] = {}
    for dst, (kind, value) in pairs:
        if kind == "group":
            out.setdefault(value, []).append(dst)
    return out


def exclusions(views: dict[str, SwitchView]) -> Exclusions:
    """Per switch and group, the ports it stops using because the neighbour behind them
    stranded every destination the group forwards (empty where nothing is stranded)."""
    by_switch = {name: routes(v) for name, v in views.items()}
    # switch -> group id -> its routes' destinations
    by_group = {name: group_destinations(pairs) for name, pairs in by_switch.items()}
    excluded: Exclusions = {name: {} for name in views}
    stranded: dict[str, set[IPv4Network]] = {name: set() for name in views}
    for _ in range(len(views) + 1):  # monotone: each round strands and excludes more, or ends
        for name, v in views.items():
            for dst, (kind, value) in by_switch[name]:
                if kind == "output":
                    ports: Iterable[int] = (value,)
                elif (group := v.groups.get(value)) is not None:
                    ports = set(group.ports) - excluded[name].get(value, frozenset())
                else:
                    continue
                if all(p in v.dead for p in ports):
                    stranded[name].add(dst)
        changed = False
        for name, v in views.items():
            for gid, dsts in by_group[name].items():
                group = v.groups.get(gid)
                if group is None:
                    continue
                stop = frozenset(p for p in group.ports if p in v.peers
                                 and _covered(dsts, stranded.get(v.peers[p], set())))
                if stop and stop != excluded[name].get(gid):
                    excluded[name][gid] = stop
                    changed = True
        if not changed:
            break
    return {name: groups for name, groups in excluded.items() if groups}


def narrowed(group: GroupEntry, stop: frozenset[int] | None) -> GroupEntry:
    """``group`` without the ports in ``stop`` (their weights with them)."""
    if not stop:
        return group
    keep = [i for i, port in enumerate(group.ports) if port not in stop]
    return replace(group, ports=tuple(group.ports[i] for i in keep),
                   weights=tuple(group.weights[i] for i in keep) if group.weights else ())
