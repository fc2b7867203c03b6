"""What a schedule's byte counts predict on a fabric (pure): the time it needs at line rate
when every link carries its share of the bytes, step by step.

A fluid model: in each step every transfer puts its bytes on the links it crosses, split
evenly over the equal-cost paths between its endpoints' access switches (the fabric's ECMP
or D-mod-k spread, on average); the step lasts as long as its busiest directed link needs
(bytes over rate, at the wire's payload share). A transfer between two GPUs of one server
crosses the server's scale-up links instead (:func:`testbed.model.servers.scale_up_routes`); on a
multi-plane fabric the other transfers split evenly over the planes (a job whose connections
per peer are a multiple of the planes spreads them so). Hash
collisions, queues and protocol overheads are not in it: the measured time over this one is
what they cost.
"""

from __future__ import annotations

from functools import lru_cache

from testbed.model.servers import scale_up_routes
from testbed.model.topology import Topology
from traffic.workloads.schedules import Schedule


class FluidModel:
    """Per-link shares of a fabric's transfers, cached per host pair."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self.routes = scale_up_routes(topo) if topo.servers else {}
        self.rate: dict[tuple[str, str], float] = {}
        for link in (*topo.links, *topo.scale_up):
            self.rate[(link.a.node, link.b.node)] = self.rate[(link.b.node, link.a.node)] = \
                link.rate_mbps
        self._between = lru_cache(maxsize=None)(self._switch_shares)

    def _switch_shares(self, src_switch: str, dst_switch: str) -> tuple:
        return tuple(self.topo.path_shares(src_switch, dst_switch).items())

    def shares(self, src: str, dst: str) -> list[tuple[tuple[str, str], float]]:
        """The directed links a transfer from host ``src`` to ``dst`` crosses, with the share
        of its bytes on each."""
        hop = self.routes.get(src, {}).get(dst)
        if hop is not None:  # inside a server
            server = self.topo.server_of(src)
            if server.switch is not None:
                return [((src, server.switch), 1.0), ((server.switch, dst), 1.0)]
            if hop.via is not None:
                return [((src, hop.via), 1.0), ((hop.via, dst), 1.0)]
            return [((src, dst), 1.0)]
        pairs = list(zip(self.topo.nics(src), self.topo.nics(dst)))  # one per plane
        out = []
        for s, d in pairs:  # a multi-plane fabric: the planes share the bytes evenly
            a, b = self.topo.attachment(s).node, self.topo.attachment(d).node
            out += [((s, a), 1 / len(pairs)),
                    *((hop, share / len(pairs)) for hop, share in self._between(a, b)),
                    ((b, d), 1 / len(pairs))]
        return out

    def ideal_s(self, sched: Schedule, hosts: tuple[str, ...], goodput: float = 1.0) -> float:
        """The schedule's time at line rate (see the module docstring); ``hosts[r]`` is rank
        ``r``'s host."""
        load: dict[int, dict[tuple[str, str], float]] = {}
        for t in sched.transfers:
            step = load.setdefault(t.step, {})
            for link, share in self.shares(hosts[t.src], hosts[t.dst]):
                step[link] = step.get(link, 0.0) + share * t.nbytes
        return sum(max(nbytes * 8 / (self.rate[link] * 1e6 * goodput)
                       for link, nbytes in step.items()) for step in load.values())
