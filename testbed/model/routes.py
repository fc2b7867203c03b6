"""Where a fabric's routes go (pure): the shortest-path next hops towards an access switch over
the live links, and D-mod-k's choice among them. The controller's tables
(:mod:`controllers.routing.tables`) and the prediction (:mod:`traffic.predict.router`) both
route with these, so a predicted path is the path the switches are given.
"""

from __future__ import annotations

from collections import deque

from testbed.model.topology import ROLE_TIER, Link, Topology


def is_up(link: Link, link_up: dict[str, bool]) -> bool:
    """A link's state (links not in ``link_up`` count as up)."""
    return link_up.get(link.name, True)


def distances_to(topo: Topology, target: str, link_up: dict[str, bool]) -> dict[str, int]:
    """Hop distances from every switch to ``target`` over live fabric links (BFS)."""
    dist = {target: 0}
    queue = deque([target])
    while queue:
        node = queue.popleft()
        for link in topo.ports(node).values():
            if link.tier != "fabric" or not is_up(link, link_up):
                continue
            peer = link.other(node).node
            if peer not in dist:
                dist[peer] = dist[node] + 1
                queue.append(peer)
    return dist


def next_hops(topo: Topology, node: str, dist: dict[str, int],
              link_up: dict[str, bool]) -> list[int]:
    """The ports of ``node`` one hop closer to the target ``dist`` measures from."""
    if node not in dist:
        return []
    return [port for port, link in topo.ports(node).items()
            if link.tier == "fabric" and is_up(link, link_up)
            and dist.get(link.other(node).node) == dist[node] - 1]


def host_numbers(topo: Topology) -> dict[str, int]:
    """D-mod-k's host number ``d`` of every host (its place in the topology's host list)."""
    return {h.name: d for d, h in enumerate(topo.hosts)}


def dmodk_port(topo: Topology, switch: str, number: int, live: list[int], choices: int) -> int:
    """D-mod-k's up-port at ``switch`` towards host number ``number``: ``(d // c^t) mod c``
    for ``c`` up-port choices of the intact fabric at tier ``t``, among the ``live`` ports
    (sorted) when a failure left fewer."""
    d = number // choices ** ROLE_TIER[topo.nodes[switch].role]
    return live[(d % choices) % len(live)]
