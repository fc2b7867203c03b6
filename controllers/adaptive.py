"""Pure logic of adaptive (load-aware) routing, after Hedera (Al-Fares et al., NSDI'10).

The controller learns every flow at its source access switch (the first packet is punted, the
controller installs an exact-match entry and sends the packet on), polls the entries' byte
counters and every port's transmit counter at a fixed interval, and after each round:

* rates: per flow and per directed link, from the counters' deltas;
* elephants: flows above ``elephant_fraction`` of their host link's rate (Hedera's 10 %);
* demands: Hedera's max-min demand estimation, as a fraction of the host link's rate: the
  demand a flow would have if only the hosts' links limited it (senders share their NIC
  equally, receivers cut the flows they cannot take down to an equal share);
* placement: Global First Fit, the largest demand first, each elephant on the first
  equal-cost path whose links can still take its demand (its current path tried first, so a
  placed flow moves only when its path no longer fits); a flow that fits nowhere goes to the
  path with the most room left;
* mice: the SELECT groups' bucket weights follow each port's measured residual capacity
  (WCMP), in quarter steps so that noise does not rewrite the groups every round;
* expiry: a flow whose counter has not moved for ``idle_s`` is forgotten (its entries go).

Nothing here touches a socket: :class:`AdaptiveRouting` takes stats and a clock and answers
with placements; :mod:`controllers.policy` turns them into flow entries.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from testbed.topology import Topology

ELEPHANT_FRACTION = 0.1  # Hedera's threshold, of the host link's rate
DEFAULT_POLL_S = 1.0
WEIGHT_STEPS = 4  # bucket weights in quarters of a port's capacity
QUIET_BYTES = 16 * 1024  # a sampling interval with less than this is one the flow was quiet in


@dataclass(frozen=True, order=True)
class FlowKey:
    """A flow's 5-tuple (ports 0 for protocols without them)."""

    src: str
    dst: str
    proto: int
    sport: int = 0
    dport: int = 0

    def match(self) -> tuple[tuple[str, object], ...]:
        """The OpenFlow match of this flow."""
        host = "255.255.255.255"
        fields: list[tuple[str, object]] = [("eth_type", 0x0800), ("ip_proto", self.proto),
                                            ("ipv4_src", (self.src, host)),
                                            ("ipv4_dst", (self.dst, host))]
        name = {6: "tcp", 17: "udp"}.get(self.proto)
        if name:
            fields += [(f"{name}_src", self.sport), (f"{name}_dst", self.dport)]
        return tuple(fields)

    @staticmethod
    def from_match(match: dict) -> FlowKey | None:
        """The key of an OpenFlow match (a dict of its fields), or None if it is no flow."""
        try:
            proto = int(match["ip_proto"])
            name = {6: "tcp", 17: "udp"}.get(proto)
            src, dst = (v[0] if isinstance(v, tuple) else v
                        for v in (match["ipv4_src"], match["ipv4_dst"]))
            return FlowKey(str(src), str(dst), proto,
                           int(match.get(f"{name}_src", 0)) if name else 0,
                           int(match.get(f"{name}_dst", 0)) if name else 0)
        except (KeyError, ValueError, TypeError):
            return None


@dataclass
class Flow:
    """What the controller knows of one flow."""

    key: FlowKey
    src_host: str
    dst_host: str
    first_seen: float
    bytes: int = 0
    sampled_at: float | None = None
    moved_at: float | None = None  # when its counter last grew
    quiet_at: float = 0.0  # the last sample in which it had (almost) not sent: it grew after
    rate_bps: float = 0.0
    demand: float = 0.0  # Hedera's estimate, a fraction of the host link's rate
    path: tuple[str, ...] | None = None  # pinned path (None: the ECMP groups decide)
    placed_at: float | None = None


@dataclass
class AdaptiveRouting:
    """Flows, link loads and the elephants' placement for one fabric.

    Args:
        topo: the intended topology.
        poll_s: the statistics interval (used for the default idle expiry).
        elephant_fraction: the elephant threshold, of the host link's rate.
        idle_s: forget a flow whose counter did not move for this long (default: 3 polls,
            at least 5 s).
    """

    topo: Topology
    poll_s: float = DEFAULT_POLL_S
    elephant_fraction: float = ELEPHANT_FRACTION
    idle_s: float | None = None
    flows: dict[FlowKey, Flow] = field(default_factory=dict)
    link_rate: dict[tuple[str, str], float] = field(default_factory=dict)  # directed, bit/s
    moves: int = 0
    placements: int = 0
    reactions: list[float] = field(default_factory=list)  # last quiet sample -> pinned, s

    def __post_init__(self) -> None:
        self.by_ip = {h.ip: h.name for h in self.topo.hosts}
        self._links = {}  # (node, node) -> link, both orders: the per-hop lookups of each round
        for link in self.topo.links:
            self._links.setdefault((link.a.node, link.b.node), link)
            self._links.setdefault((link.b.node, link.a.node), link)
        self._paths: dict[tuple[str, str], list[tuple[str, ...]]] = {}
        self._port_bytes: dict[tuple[str, int], tuple[int, float]] = {}
        if self.idle_s is None:
            self.idle_s = max(5.0, 3 * self.poll_s)

    # -- learning --------------------------------------------------------------------------
    def new_flow(self, key: FlowKey, now: float) -> Flow | None:
        """A flow's first packet reached the controller; None when its hosts are unknown."""
        if key in self.flows:
            return self.flows[key]
        src, dst = self.by_ip.get(key.src), self.by_ip.get(key.dst)
        if src is None or dst is None or src == dst:
            return None
        flow = Flow(key, src, dst, now, moved_at=now, quiet_at=now)
        self.flows[key] = flow
        return flow

    # -- statistics ------------------------------------------------------------------------
    def flow_stats(self, counters: dict[FlowKey, int], now: float,
                   switch: str | None = None) -> None:
        """Byte counters of the flows' entries at their source access switches (``switch``:
        the counters are that switch's, and only the flows it is the source of count; a
        pinned flow's entry at its destination switch is younger and would mix counters)."""
        for key, count in counters.items():
            flow = self.flows.get(key)
            if flow is None or (switch is not None
                                and self.topo.attachment(flow.src_host).node != switch):
                continue
            if flow.sampled_at is not None and now > flow.sampled_at and count >= flow.bytes:
                flow.rate_bps = (count - flow.bytes) * 8 / (now - flow.sampled_at)
                if count - flow.bytes < QUIET_BYTES:
                    flow.quiet_at = now
            if count != flow.bytes or flow.sampled_at is None:  # (lower: the entry was new)
                flow.moved_at = now
            flow.bytes, flow.sampled_at = count, now

    def port_stats(self, switch: str, tx_bytes: dict[int, int], now: float) -> None:
        """Transmit byte counters of one switch's ports: the load of each directed link."""
        for port, count in tx_bytes.items():
            link = self.topo.link_at(switch, port)
            if link is None:
                continue
            last = self._port_bytes.get((switch, port))
            self._port_bytes[(switch, port)] = (count, now)
            if last is not None and now > last[1] and count >= last[0]:
                peer = link.other(switch).node
                self.link_rate[(switch, peer)] = (count - last[0]) * 8 / (now - last[1])

    def expire(self, now: float) -> list[FlowKey]:
        """Forget the flows idle for ``idle_s``; returns their keys."""
        gone = [k for k, f in self.flows.items() if now - (f.moved_at or f.first_seen)
                >= self.idle_s]
        for key in gone:
            del self.flows[key]
        return gone

    # -- decisions -------------------------------------------------------------------------
    def elephants(self) -> list[Flow]:
        """Flows above the threshold; a pinned one stays an elephant down to half of it (a
        dip in one sample does not send it back to the groups and back again)."""
        out = []
        for flow in self.flows.values():
            rate = self.topo.host_link(flow.src_host).rate_mbps * 1e6
            floor = self.elephant_fraction * rate * (0.5 if flow.path is not None else 1.0)
            if flow.rate_bps >= floor:
                out.append(flow)
        return out

    def place(self, now: float, link_up: dict[str, bool]) -> bool:
        """Estimate the elephants' demands and place them by Global First Fit.

        Returns:
            True when a flow's path changed (the tables need an update).
        """
        elephants = self.elephants()
        estimate_demands(elephants)
        reserved: dict[tuple[str, str], float] = {}
        changed = False
        chosen = {id(f) for f in elephants}
        for flow in self.flows.values():  # mice and shrunk flows go back to the groups
            if id(flow) not in chosen and flow.path is not None:
                flow.path, changed = None, True
        for flow in sorted(elephants, key=lambda f: (-f.demand, f.key)):
            paths = [p for p in self.paths(flow.src_host, flow.dst_host)
                     if self._live(p, link_up)]
            if not paths:
                continue
            if flow.path in paths:
                paths.remove(flow.path)
                paths.insert(0, flow.path)
            demand_bps = flow.demand * self.topo.host_link(flow.src_host).rate_mbps * 1e6
            fit = next((p for p in paths if self._fits(p, demand_bps, reserved)), None)
            if fit is None:
                fit = max(paths, key=lambda p: self._room(p, reserved))
            for hop in zip(fit, fit[1:]):
                reserved[hop] = reserved.get(hop, 0.0) + demand_bps
            if fit != flow.path:
                if flow.path is not None:
                    self.moves += 1
                else:
                    self.placements += 1
                    if flow.placed_at is None:  # its first pinning: how long it took
                        # (an upper bound: it began sending after its last quiet sample)
                        self.reactions.append(now - flow.quiet_at)
                flow.path, flow.placed_at, changed = fit, now, True
        return changed

    def drop_dead_paths(self, link_up: dict[str, bool]) -> bool:
        """Unpin flows whose path crosses a dead link (the groups carry them until the next
        placement); True when any was."""
        changed = False
        for flow in self.flows.values():
            if flow.path is not None and not self._live(flow.path, link_up):
                flow.path, changed = None, True
        return changed

    def bucket_weights(self, switch: str, ports: tuple[int, ...]) -> tuple[int, ...]:
        """WCMP weights of a group's ports from their measured residual capacity, in quarters
        (empty: all alike)."""
        if len(ports) < 2:
            return ()
        shares = []
        for port in ports:
            link = self.topo.link_at(switch, port)
            cap = link.rate_mbps * 1e6
            used = self.link_rate.get((switch, link.other(switch).node), 0.0)
            shares.append(max(1, round(WEIGHT_STEPS * max(0.0, cap - used) / cap)))
        return () if len(set(shares)) == 1 else tuple(shares)

    def report(self) -> dict:
        """For the controller's status document."""
        return {"flows": len(self.flows), "elephants": sum(1 for f in self.flows.values()
                                                           if f.path is not None),
                "placements": self.placements, "moves": self.moves,
                "reaction_s": sorted(round(r, 3) for r in self.reactions)[-50:],  # the slowest
                "reaction": _quantiles(self.reactions)}

    # -- helpers ---------------------------------------------------------------------------
    def paths(self, src: str, dst: str) -> list[tuple[str, ...]]:
        """The equal-cost node paths between two hosts (of the intended topology, cached)."""
        if (src, dst) not in self._paths:
            self._paths[(src, dst)] = [tuple(p) for p in self.topo.equal_cost_paths(src, dst)]
        return list(self._paths[(src, dst)])

    def link(self, a: str, b: str):
        return self._links[(a, b)]

    def _live(self, path, link_up: dict[str, bool]) -> bool:
        return all(link_up.get(self._links[hop].name, True) for hop in zip(path, path[1:]))

    def _capacity(self, a: str, b: str) -> float:
        return self._links[(a, b)].rate_mbps * 1e6

    def _fits(self, path, demand_bps: float, reserved: dict) -> bool:
        return all(reserved.get(hop, 0.0) + demand_bps <= self._capacity(*hop) * 1.0001
                   for hop in zip(path, path[1:]))

    def _room(self, path, reserved: dict) -> float:
        return min(self._capacity(*hop) - reserved.get(hop, 0.0) for hop in zip(path, path[1:]))


def estimate_demands(flows: list[Flow]) -> None:
    """Hedera's demand estimation: each flow's max-min fair demand (a fraction of the host
    links' rate) if only the senders' and receivers' links limited it. Sets ``flow.demand``."""
    converged = {id(f): False for f in flows}
    for f in flows:
        f.demand = 0.0
    by_src: dict[str, list[Flow]] = {}
    by_dst: dict[str, list[Flow]] = {}
    for f in flows:
        by_src.setdefault(f.src_host, []).append(f)
        by_dst.setdefault(f.dst_host, []).append(f)
    for _ in range(100):
        before = [f.demand for f in flows]
        for group in by_src.values():  # senders share their NIC among unconverged flows
            fixed = sum(f.demand for f in group if converged[id(f)])
            loose = [f for f in group if not converged[id(f)]]
            for f in loose:
                f.demand = (1.0 - fixed) / len(loose)
        for group in by_dst.values():  # receivers cut what they cannot take
            if sum(f.demand for f in group) <= 1.0 + 1e-9:
                continue
            limited = list(group)
            share = 1.0 / len(limited)
            while True:
                small = [f for f in limited if f.demand < share]
                if not small:
                    break
                limited = [f for f in limited if f.demand >= share]
                taken = sum(f.demand for f in group if f not in limited)
                share = (1.0 - taken) / len(limited) if limited else 0.0
            for f in limited:
                f.demand = share
                converged[id(f)] = True
        if all(abs(a - f.demand) < 1e-9 for a, f in zip(before, flows)):
            break


def _quantiles(values: list[float]) -> dict:
    """Count, median, 90th percentile and max of every reaction (seconds)."""
    if not values:
        return {"count": 0}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"count": len(ordered), "median_s": round(pick(0.5), 3),
            "p90_s": round(pick(0.9), 3), "max_s": round(ordered[-1], 3)}
