"""What a switch-local choice weighs beyond its own ports (pure): the next switch's path
quality.

A switch balancing its own ports sees nothing of the links behind them: in a k=4 fat-tree,
pod 2's aggregation switch choosing between core1 and core2 for pod 1's hosts cannot see that
core1's only link into pod 1 is congested or degraded, though core1 has no other way there.
Broadcom's global load balancing and CONGA's path metric answer this by weighing the path's
quality, not the port's. A group whose selection weighs the next switch (``flowlet_next``,
``packet_next``) does it hop by hop, as path qualities spread from switch to switch:

- every such group publishes, at each packet it chooses for, the least load it found over
  its buckets: its *path quality* towards its destinations;
- each bucket's load is the longest of its own port's queue, the path quality published by
  the next switch's group towards the same destinations (what is left of it: a queue drains
  at least as fast as time passes while nothing joins it), and the queue of the first link
  every way on from the next switch takes, read as it is now (a quality is only as fresh as
  the last packet that passed: where the way on is fixed, its queue is read itself).

Recursively, a switch weighs the worst queue of the best way on beyond each port: an
aggregation switch each core's only link into the destination pod, an edge switch the best of
its aggregation switch's ways there and the destination pod's aggregation switch's link down
to the destination, which every one of those ways takes. Both are found here, from every
switch's tables: the one group through which the switch behind the bucket's port forwards
every destination of the bucket's group, and the links every way from it takes.

The next switches' qualities and queues are read where they are kept: in the datapath's maps,
which hold every switch of one machine. A switch of another machine is not weighed (its
qualities and queues are that machine's).
"""

from __future__ import annotations

from collections.abc import Iterable
from ipaddress import IPv4Network
from typing import NamedTuple

from testbed.plan import notices
from testbed.plan.notices import SwitchView

#: selection methods that weigh the next switch, and the datapath's selection for each
WEIGHS_NEXT = {"flowlet_next": "flowlet", "packet_next": "packet"}



class Beyond(NamedTuple):
    """What a bucket weighs beyond its port."""

    switch: str  # the switch behind the port
    group: int | None  # its group towards the same destinations (None: none)
    link: tuple[str, int] | None  # the first link every way on takes, (switch, port)


#: per switch, per group id, per port of the group: what it weighs beyond the port; a port
#: with nothing to weigh beyond it is left out
NextGroups = dict[str, dict[int, dict[int, Beyond]]]


def _ways_out(routes: list[tuple[IPv4Network, tuple[str, int]]],
              dsts: Iterable[IPv4Network]) -> set[tuple[str, int]] | None:
    """How a switch forwards the destinations in ``dsts``: the ways out of its routes that
    overlap them, ("group", id) or ("output", port); None where one has no route covering
    it."""
    ways: set[tuple[str, int]] = set()
    for dst in dsts:
        overlapping = [(d, hop) for d, hop in routes if d.overlaps(dst)]
        if not any(dst.subnet_of(d) for d, _ in overlapping):
            return None
        ways.update(hop for _, hop in overlapping)
    return ways


def _ways_of(name: str, dsts: tuple[IPv4Network, ...], routes: dict,
             memo: dict) -> set[tuple[str, int]] | None:
    """Switch ``name``'s ways out for ``dsts`` (:func:`_ways_out`), worked out once."""
    key = ("ways", name, dsts)
    if key not in memo:
        memo[key] = _ways_out(routes[name], dsts)
    return memo[key]


def _only_group(ways: set[tuple[str, int]] | None) -> int | None:
    """The one group of a switch's ways out (:func:`_ways_out`) for some destinations; None
    where it forwards one otherwise."""
    if ways is None or len(ways) != 1:
        return None
    (kind, value), = ways
    return value if kind == "group" else None


def _ports(view: SwitchView, ways: set[tuple[str, int]] | None) -> set[int] | None:
    """Every port ``view``'s switch forwards some destinations out of, from its ways out for
    them (:func:`_ways_out`); None where it forwards one elsewhere (to the controller,
    nowhere) or has no route for it."""
    if ways is None:
        return None
    ports: set[int] = set()
    for kind, value in ways:
        if kind == "output":
            ports.add(value)
        elif kind == "group" and (group := view.groups.get(value)) is not None:
            ports.update(group.ports)
        else:
            return None
    return ports


def _shared(name: str, dsts: tuple[IPv4Network, ...], views: dict[str, SwitchView],
            routes: dict, memo: dict, seen: frozenset[str] = frozenset()
            ) -> tuple[tuple[str, int], ...]:
    """The links (switch, port) every way from switch ``name`` towards ``dsts`` takes,
    nearest first, as far as ``views`` know the switches on the way."""
    key = (name, dsts)
    if key not in memo:
        view, ways = views[name], []
        for port in sorted(_ports(view, _ways_of(name, dsts, routes, memo)) or ()):
            peer = view.peers.get(port)
            tail = (_shared(peer, dsts, views, routes, memo, seen | {name})
                    if peer in views and peer not in seen else ())
            ways.append(((name, port),) + tail)
        memo[key] = tuple(link for link in ways[0] if all(link in w for w in ways[1:])) \
            if ways else ()
    return memo[key]


def next_groups(views: dict[str, SwitchView]) -> NextGroups:
    """For every group whose selection weighs the next switch, per port: the switch behind it,
    the group it forwards all of the group's destinations through and the first link every
    way from it towards them takes; ports whose switch behind is not in ``views``, or has
    neither, are left out."""
    routes = {name: notices.routes(v) for name, v in views.items()}
    memo: dict = {}
    out: NextGroups = {}
    for name, view in views.items():
        dsts = notices.group_destinations(routes[name])
        for gid, group in view.groups.items():
            if group.selection not in WEIGHS_NEXT or not dsts.get(gid):
                continue
            ahead = {}
            for port in group.ports:
                peer = view.peers.get(port)
                if peer not in views:
                    continue
                group = _only_group(_ways_of(peer, tuple(dsts[gid]), routes, memo))
                links = _shared(peer, tuple(dsts[gid]), views, routes, memo, frozenset({name}))
                if group is not None or links:
                    ahead[port] = Beyond(peer, group, links[0] if links else None)
            if ahead:
                out.setdefault(name, {})[gid] = ahead
    return out
