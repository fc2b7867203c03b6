"""What a switch-local choice weighs beyond its own ports (pure): the first link every way
beyond the next switch takes.

A switch balancing its own ports sees nothing of the links behind them: in a k=4 fat-tree,
pod 2's aggregation switch choosing between core1 and core2 for pod 1's hosts cannot see that
core1's only link into pod 1 is congested or degraded, though core1 has no other way there.
Broadcom's global load balancing and CONGA's path metric answer this by weighing the path's
quality, not the port's. The eBPF switches weigh one link beyond each port: for each bucket
of a group whose selection weighs the next switch (``flowlet_next``, ``packet_next``), the
first link that every way from the switch behind it towards the group's destinations takes;
the datapath weighs the longer of the two queues (the bucket's port, that link's port). The
links on which the ways beyond part are the next switches' own choices.

In a leaf-spine fabric this is the whole path (a spine has one port to each leaf). In a
fat-tree an aggregation switch weighs each core's only link into the destination pod; an edge
switch weighs, for a destination in another pod, the link from the destination pod's
aggregation switch down to the destination edge switch (whichever core the aggregation
switch above it picks, the flow arrives there), and for one in its own pod the aggregation
switch's link down to it.

The queue beyond is read where it is kept: in the datapath's maps, which hold every switch of
one machine. Links beyond a switch of another machine are not weighed (their queues are that
machine's).
"""

from __future__ import annotations

from ipaddress import IPv4Network

from testbed.plan.notices import SwitchView, destination, forwarding

#: selection methods that weigh the next switch, and the datapath's selection for each
WEIGHS_NEXT = {"flowlet_next": "flowlet", "packet_next": "packet"}

#: per switch, per group id, per port of the group: the link weighed beyond it, (switch, port);
#: a port with nothing to weigh beyond it is left out
NextPorts = dict[str, dict[int, dict[int, tuple[str, int]]]]


def _routes(view: SwitchView) -> list[tuple[IPv4Network, tuple[str, int]]]:
    return [(d, hop) for f in view.flows
            if (d := destination(f)) is not None and (hop := forwarding(f)) is not None]


def _ports(view: SwitchView, routes: list[tuple[IPv4Network, tuple[str, int]]],
           dsts: tuple[IPv4Network, ...]) -> set[int] | None:
    """Every port ``view``'s switch forwards the destinations in ``dsts`` out of (its routes
    that overlap them, one of them covering each); None where it forwards one elsewhere (to
    the controller, nowhere) or has no route for it."""
    ports: set[int] = set()
    for dst in dsts:
        overlapping = [(d, hop) for d, hop in routes if d.overlaps(dst)]
        if not any(dst.subnet_of(d) for d, _ in overlapping):
            return None
        for _, (kind, value) in overlapping:
            if kind == "output":
                ports.add(value)
            elif (group := view.groups.get(value)) is not None:
                ports.update(group.ports)
            else:
                return None
    return ports


Shared = tuple[tuple[str, int], ...]  # links as (switch, port), in the order a packet takes them


def _shared(name: str, dsts: tuple[IPv4Network, ...], views: dict[str, SwitchView],
            routes: dict, memo: dict, seen: frozenset[str] = frozenset()) -> Shared:
    """The links every way from switch ``name`` towards ``dsts`` takes, nearest first, as far
    as ``views`` know the switches on the way."""
    key = (name, dsts)
    if key in memo:
        return memo[key]
    view = views[name]
    ports = _ports(view, routes[name], dsts)
    ways: list[Shared] = []
    for port in sorted(ports or ()):
        peer = view.peers.get(port)
        tail = (_shared(peer, dsts, views, routes, memo, seen | {name})
                if peer in views and peer not in seen else ())
        ways.append(((name, port),) + tail)
    common = tuple(link for link in ways[0] if all(link in way for way in ways[1:])) \
        if ways else ()
    memo[key] = common
    return common


def next_ports(views: dict[str, SwitchView]) -> NextPorts:
    """For every group whose selection weighs the next switch, per port: the first link that
    every way from the switch behind it towards the group's destinations takes, as (switch,
    port); ports whose switch behind is not in ``views``, or whose ways share no link, are
    left out."""
    routes = {name: _routes(v) for name, v in views.items()}
    memo: dict = {}
    out: NextPorts = {}
    for name, view in views.items():
        dsts: dict[int, list[IPv4Network]] = {}
        for dst, (kind, value) in routes[name]:
            if kind == "group":
                dsts.setdefault(value, []).append(dst)
        for gid, group in view.groups.items():
            if group.selection not in WEIGHS_NEXT or not dsts.get(gid):
                continue
            ahead = {}
            for port in group.ports:
                peer = view.peers.get(port)
                if peer in views and (shared := _shared(
                        peer, tuple(dsts[gid]), views, routes, memo, frozenset({name}))):
                    ahead[port] = shared[0]
            if ahead:
                out.setdefault(name, {})[gid] = ahead
    return out
