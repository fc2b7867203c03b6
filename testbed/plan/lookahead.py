"""What a switch-local choice weighs beyond its own ports (pure): the port the next switch
must take.

A switch balancing its own ports sees nothing of the links behind them: in a k=4 fat-tree,
pod 2's aggregation switch choosing between core1 and core2 for pod 1's hosts cannot see that
core1's only link into pod 1 is congested or degraded, though core1 has no other way there.
Broadcom's global load balancing and CONGA's path metric answer this by weighing the path's
quality, not the port's. The eBPF switches do it one switch ahead: for each bucket of a group
whose selection weighs the next switch (``flowlet_next``, ``packet_next``), the port the switch
behind it must take for every destination the group forwards; the datapath weighs the longer
of the two queues (the bucket's port, that port). Where the next switch has several ports for
those destinations it chooses among them itself, and nothing is weighed beyond it.

In a leaf-spine fabric this is the whole path (a spine has one port to each leaf); in a
fat-tree, an aggregation switch sees the core's link into the destination pod, and an edge
switch the aggregation switch's link down to a destination edge switch of its own pod.

The next switch's queue is read where it is kept: in the datapath's maps, which hold every
switch of one machine. A switch behind a link to another machine is not weighed (its ports'
queues are that machine's).
"""

from __future__ import annotations

from ipaddress import IPv4Network

from testbed.plan.notices import SwitchView, destination, forwarding

#: selection methods that weigh the next switch, and the datapath's selection for each
WEIGHS_NEXT = {"flowlet_next": "flowlet", "packet_next": "packet"}

#: per switch, per group id, per port of the group: (the next switch, the port it must take);
#: a port with nothing to weigh beyond it is left out
NextPorts = dict[str, dict[int, dict[int, tuple[str, int]]]]


def _routes(view: SwitchView) -> list[tuple[IPv4Network, tuple[str, int]]]:
    return [(d, hop) for f in view.flows
            if (d := destination(f)) is not None and (hop := forwarding(f)) is not None]


def _only_port(view: SwitchView, routes: list[tuple[IPv4Network, tuple[str, int]]],
               dsts: list[IPv4Network]) -> int | None:
    """The one port ``view``'s switch forwards every destination in ``dsts`` out of (its
    routes that overlap them, one of them covering each); None where it has several, or
    forwards one elsewhere (to the controller, nowhere)."""
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
            if len(ports) > 1:
                return None
    return next(iter(ports), None)


def next_ports(views: dict[str, SwitchView]) -> NextPorts:
    """For every group whose selection weighs the next switch, per port: (the switch behind
    it, the one port that switch forwards all the group's destinations out of); ports whose
    switch behind is not in ``views`` or has several ports for them are left out."""
    routes = {name: _routes(v) for name, v in views.items()}
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
                if peer in views and (
                        only := _only_port(views[peer], routes[peer], dsts[gid])) is not None:
                    ahead[port] = (peer, only)
            if ahead:
                out.setdefault(name, {})[gid] = ahead
    return out
