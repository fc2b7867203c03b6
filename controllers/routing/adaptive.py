"""Pure logic of adaptive (load-aware) routing, after Hedera (Al-Fares et al., NSDI'10).

The controller learns every flow at its source access switch (the first packet is punted, the
controller installs an exact-match entry and sends the packet on), polls the entries' byte
counters and every port's transmit counter at a fixed interval, and after each round:

* rates: per flow and per directed link, from the counters' deltas;
* early rounds: a flow's entry counts from the flow's first packet, so its first sample
  already gives a rate; ``early_s`` after a new flow's first packet a round asks its source
  switch (:meth:`AdaptiveRouting.next_round`), so a flow that starts sending with its
  connection is placed a fraction of a poll later rather than after two polls;
* elephants: flows above ``elephant_fraction`` of their host link's rate (Hedera's 10 %);
* demands: Hedera's max-min demand estimation, as a fraction of the host link's rate: the
  demand a flow would have if only the hosts' links limited it (senders share their NIC
  equally, receivers cut the flows they cannot take down to an equal share);
* placement: Global First Fit, the largest demand first, each elephant on the first
  equal-cost path whose links can still take its demand (its current path tried first, so a
  placed flow moves only when its path no longer fits); a flow that fits nowhere goes to the
  path with the most room left. When first fit leaves an elephant without room, a bounded
  depth-first search looks for a plan in which every one fits (a fat-tree carries any
  permutation of full-rate flows; greedy first fit often misses how);
* mice: the SELECT groups' bucket weights follow each port's measured residual capacity
  (WCMP), in quarter steps so that noise does not rewrite the groups every round;
* expiry: a flow whose counter has not moved for ``idle_s`` is forgotten (its entries go).

Nothing here touches a socket: :class:`AdaptiveRouting` takes stats and a clock and answers
with placements; :mod:`controllers.routing.policy` turns them into flow entries.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from testbed.model.topology import Topology

ELEPHANT_FRACTION = 0.1  # Hedera's threshold, of the host link's rate
DEFAULT_POLL_S = 1.0
WEIGHT_STEPS = 4  # bucket weights in quarters of a port's capacity
EARLY_S = 0.25  # a new flow's first sample, after its first packet (see next_round)
SEARCH_LIMIT = 600  # placement search steps before Global First Fit alone decides
SEARCH_FLOWS = 64  # more elephants than this: Global First Fit alone
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
    early_s: float = EARLY_S
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
        self._hopeless: tuple | None = None  # the last search that found no plan
        # for controllers.routing.policy: the tables that change only with the links, and each flow's
        # counting entry (a flow forgotten by expire() leaves its entry behind: expire drops it)
        self.table_cache: dict = {}
        self.entry_cache: dict = {}
        self.searches_solved = self.searches_failed = 0
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
            # the entry counts from its installation, when the flow was learned: the first
            # sample already gives a rate
            since = flow.sampled_at if flow.sampled_at is not None else flow.first_seen
            before = flow.bytes if flow.sampled_at is not None else 0
            if now > since and count >= before:
                flow.rate_bps = (count - before) * 8 / (now - since)
                if flow.sampled_at is not None and count - before < QUIET_BYTES:
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

    def next_round(self, last_poll: float, last_round: float) -> tuple[float, set[str]]:
        """When the next statistics round is due, and which access switches it asks (empty:
        a full poll, every switch's ports and every access switch's flows).

        A full poll comes a poll interval after the last one. A flow's first sample gives
        its rate (its entry counts from its first packet), so ``early_s`` after a new flow's
        first packet an early round asks only the source switches of the flows that no round
        has sampled yet: elephants are placed a fraction of a poll after they start instead
        of up to two polls later, for the cost of a few flow-stats replies.
        """
        due = last_poll + self.poll_s
        fresh = [f for f in self.flows.values()
                 if f.sampled_at is None and f.first_seen + self.early_s > last_round]
        if fresh:
            early = min(f.first_seen for f in fresh) + self.early_s
            if early < due:
                return early, {self.topo.attachment(f.src_host).node for f in fresh}
        return due, set()

    def expire(self, now: float) -> list[FlowKey]:
        """Forget the flows idle for ``idle_s``; returns their keys."""
        gone = [k for k, f in self.flows.items() if now - (f.moved_at or f.first_seen)
                >= self.idle_s]
        for key in gone:
            del self.flows[key]
            self.entry_cache.pop(key, None)
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
        changed = False
        chosen = {id(f) for f in elephants}
        for flow in self.flows.values():  # mice and shrunk flows go back to the groups
            if id(flow) not in chosen and flow.path is not None:
                flow.path, changed = None, True
        order = sorted(elephants, key=lambda f: (-f.demand, f.key))
        options: dict[int, list[tuple[str, ...]]] = {}
        demand: dict[int, float] = {}
        for flow in order:
            paths = [p for p in self.paths(flow.src_host, flow.dst_host)
                     if self._live(p, link_up)]
            if flow.path in paths:  # its current path first: a flow that fits stays
                paths.remove(flow.path)
                paths.insert(0, flow.path)
            options[id(flow)] = paths
            demand[id(flow)] = flow.demand * self.topo.host_link(flow.src_host).rate_mbps * 1e6
        plan, complete = self._first_fit(order, options, demand)
        if not complete:
            plan = self._search(order, options, demand, link_up) or plan
        for flow in order:
            fit = plan.get(id(flow))
            if fit is None:
                continue
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

    def _first_fit(self, order: list[Flow], options: dict, demand: dict) -> tuple[dict, bool]:
        """Global First Fit: each elephant, largest demand first, on the first path with room
        for it, else on the path with the most room. Returns the plan and whether every
        elephant fitted."""
        reserved: dict[tuple[str, str], float] = {}
        plan, complete = {}, True
        for flow in order:
            paths = options[id(flow)]
            if not paths:
                continue
            fit = next((p for p in paths if self._fits(p, demand[id(flow)], reserved)), None)
            if fit is None:
                complete = False
                fit = max(paths, key=lambda p: self._room(p, reserved))
            for hop in zip(fit, fit[1:]):
                reserved[hop] = reserved.get(hop, 0.0) + demand[id(flow)]
            plan[id(flow)] = fit
        return plan, complete

    def _search(self, order: list[Flow], options: dict, demand: dict,
                link_up: dict[str, bool]) -> dict | None:
        """Where first fit leaves an elephant without room: a depth-first search for a plan in
        which every elephant fits, always extending the flow with the fewest paths that still
        fit (each flow's current path tried first, so few move). A fat-tree carries any
        permutation of full-rate flows without overload (a Clos network is rearrangeably
        non-blocking), but greedy first fit misses the arrangement in 159 of 200 random
        permutations at k=4; this search finds it in all, in at most a few hundred steps.
        Gives up after ``SEARCH_LIMIT`` steps (at k=6 it mostly does) or beyond
        ``SEARCH_FLOWS`` elephants, and does not search again for the same elephants and
        failed links."""
        flows = [f for f in order if options[id(f)]]
        signature = (frozenset((f.key, round(demand[id(f)])) for f in flows),
                     frozenset(k for k, v in link_up.items() if not v))
        if signature == self._hopeless or len(flows) > SEARCH_FLOWS:
            return None
        load: dict[tuple[str, str], float] = {}
        plan: dict[int, tuple[str, ...]] = {}
        left = {id(f): f for f in flows}
        steps = 0

        def add(path, amount: float) -> None:
            for hop in zip(path, path[1:]):
                load[hop] = load.get(hop, 0.0) + amount

        def extend() -> bool:
            nonlocal steps
            if not left:
                return True
            pick, fitting = None, None
            for fid, flow in sorted(left.items(), key=lambda item: item[1].key):
                steps += 1
                fit = [p for p in options[fid] if self._fits(p, demand[fid], load)]
                if not fit:
                    return False  # a flow with no room left: undo
                if fitting is None or len(fit) < len(fitting):
                    pick, fitting = fid, fit
                    if len(fit) == 1:
                        break
            flow = left.pop(pick)
            for path in fitting:
                if steps > SEARCH_LIMIT:
                    break
                add(path, demand[pick])
                plan[pick] = path
                if extend():
                    return True
                add(path, -demand[pick])
                del plan[pick]
            left[pick] = flow
            return False

        if extend():
            self.searches_solved += 1
            return plan
        self._hopeless = signature
        self.searches_failed += 1
        return None

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
                "searches": {"solved": self.searches_solved, "failed": self.searches_failed},
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
