"""The paths a fabric's connections take under a routing mode (pure): D-mod-k's exact up-ports,
ECMP's hash draws (seeded, or as an eBPF switch hashes a given 5-tuple), packet spraying's even
split, adaptive routing's candidates and switch-local adaptive routing's choices (by flowlet:
each switch puts a connection on the next hop it has placed the fewest of the step's
connections on, blind to the links beyond -- or, weighing the next switch, the more of those
and the next hop's own least count beyond it; by packet: an even split, as spraying), as
(link index, share of the bytes) over the fabric's directed links, each link's capacity at the
wire's payload share."""

from __future__ import annotations

import random
from functools import lru_cache

import numpy as np

from testbed.model.routes import distances_to, dmodk_port, host_numbers, next_hops
from testbed.model.topology import Topology
from testbed.plan.groups import flow_hash, hash_basis, select_bucket
from traffic.predict.flowsim import maxmin_rates
from traffic.predict.ideal import FluidModel
from traffic.workloads.workload import Job

Link = tuple[str, str]  # a directed link: (from node, to node)
#: switch-local adaptive routing's modes (``controller.routing: local_adaptive``), by its
#: granularity; by flowlet weighing the next switch (``load: next_switch``)
LOCAL_FLOWLET, LOCAL_PACKET = "local_flowlet", "local_packet"
LOCAL_FLOWLET_NEXT = "local_flowlet_next"
#: flowlets with reactive rebalancing (``rebalance``), weighing their own ports or the path
LOCAL_FLOWLET_REBALANCE = "local_flowlet_rebalance"
LOCAL_FLOWLET_NEXT_REBALANCE = "local_flowlet_next_rebalance"
REBALANCED = (LOCAL_FLOWLET_REBALANCE, LOCAL_FLOWLET_NEXT_REBALANCE)
WEIGHS_NEXT = (LOCAL_FLOWLET_NEXT, LOCAL_FLOWLET_NEXT_REBALANCE)
FLOWLETS = (LOCAL_FLOWLET, LOCAL_FLOWLET_NEXT) + REBALANCED
#: rounds of rebalancing moves over a step's connections at most (a local optimum comes first)
REBALANCE_ROUNDS = 8
#: rebalancing's quality delta as a share of the line (``rebalance: true``'s 25 %)
REBALANCE_DELTA = 0.25
#: rebalancing's walks (testbed/plan/localroute.py): a connection is held back below this
#: share of its line on a path whose busiest link it weighs is busier than FULL; walks after
#: a local optimum at most, and moves in one walk at most
HELD, FULL, WALKS, WALK_STEPS = 0.6, 0.8, 16, 16


class Router:
    """The paths of a fabric's connections under one routing mode."""

    def __init__(self, topo: Topology, routing: str = "ecmp", ecmp_seed: str = "per_switch",
                 goodput: float = 1.0) -> None:
        self.topo = topo
        self.routing = routing
        self.shared_hash = ecmp_seed == "shared"
        self.ecmp_seed = ecmp_seed
        self.fluid = FluidModel(topo)
        self.number = host_numbers(topo)
        self.index: dict[Link, int] = {}
        self.capacity: list[float] = []
        for link, mbps in self.fluid.rate.items():
            self.index[link] = len(self.capacity)
            self.capacity.append(mbps * 1e6 / 8 * goodput)
        self.names = {i: f"{a}->{b}" for (a, b), i in self.index.items()}
        switches = {sw.name for sw in topo.switches}
        #: the links between switches, by index: each its source switch's choice
        self.fabric = {i: a for (a, b), i in self.index.items()
                       if a in switches and b in switches}
        self.hops = lru_cache(maxsize=None)(self._next)  # (node, target) -> next switches
        self.distances = lru_cache(maxsize=None)(  # target -> every switch's hops to it
            lambda target: distances_to(self.topo, target, {}))
        self.split = lru_cache(maxsize=None)(self._split)  # (a, b) -> spraying's shares

    def _next(self, node: str, target: str) -> tuple[str, ...]:
        """The next switches from ``node`` towards access switch ``target`` (port order)."""
        ports = sorted(next_hops(self.topo, node, self.distances(target), {}))
        return tuple(self.topo.ports(node)[p].other(node).node for p in ports)

    def ends(self, src: str, dst: str, channel: int) -> tuple[str, str, str, str]:
        """A connection's NICs (channel ``c`` on plane ``c % planes``) and the access
        switches they hang off: (source NIC, destination NIC, their switches)."""
        nics_s, nics_d = self.topo.nics(src), self.topo.nics(dst)
        plane = channel % len(nics_s)
        s, d = nics_s[plane], nics_d[plane]
        return s, d, self.topo.attachment(s).node, self.topo.attachment(d).node

    def random_paths(self, spray: bool) -> bool:
        """Whether paths depend on hash draws (ECMP, not sprayed)."""
        return not spray and self.routing == "ecmp"

    def path(self, src: str, dst: str, channel: int, rng: random.Random,
             spray: bool = False,
             placed: dict[int, int] | None = None) -> tuple[tuple[int, float], ...]:
        """The links (index, share of the bytes) of one connection from host ``src`` to
        ``dst``; switch-local flowlets with ``placed`` (link index -> connections on it so
        far, updated): at each switch the next hop it placed the fewest on (ties: ``rng``);
        weighing the next switch, the least of the more of that link's and the next hop's own
        least count beyond it."""
        if self.fluid.routes.get(src, {}).get(dst) is not None:  # inside a server
            return tuple((self.index[link], w) for link, w in self.fluid.shares(src, dst))
        s, d, a, b = self.ends(src, dst, channel)
        hops: dict[Link, float] = {(s, a): 1.0, (b, d): 1.0}
        if spray or self.routing in ("spray", LOCAL_PACKET):
            hops |= self.split(a, b)  # (read, never changed)
        elif a != b:
            draw = rng.getrandbits(32)
            node = a
            while node != b:
                nxt = self.hops(node, b)
                if self.routing == "dmodk":
                    pick = nxt[dmodk_port(self.topo, node, self.number[d], list(range(len(nxt))),
                                          len(nxt))]
                elif self.routing in FLOWLETS and placed is not None:
                    count = {n: self._placed(placed, node, n, b) for n in nxt}
                    fewest = min(count.values())
                    pick = rng.choice([n for n in nxt if count[n] == fewest])
                    link = self.index[(node, pick)]
                    placed[link] = placed.get(link, 0) + 1
                elif self.shared_hash:
                    pick = nxt[draw % len(nxt)]
                else:
                    pick = nxt[rng.randrange(len(nxt))]
                hops[(node, pick)] = 1.0
                node = pick
        return tuple(sorted((self.index[link], w) for link, w in hops.items()))

    def _placed(self, placed: dict[int, int], node: str, nxt: str, target: str) -> int:
        """The connections a switch-local flowlet choice at ``node`` counts on next hop
        ``nxt``: on the link to it, or (weighing the next switch) the more of that and the
        path quality of ``nxt`` towards ``target``: the fewest it counts on any of its own next
        hops, recursively (:mod:`testbed.plan.lookahead`)."""
        here = placed.get(self.index[(node, nxt)], 0)
        if self.routing not in WEIGHS_NEXT or nxt == target:
            return here
        return max(here, min(self._placed(placed, nxt, m, target)
                             for m in self.hops(nxt, target)))

    def hashed_path(self, src: str, dst: str, channel: int,
                    five_tuple: tuple[str, str, int, int, int]) -> tuple[tuple[int, float], ...]:
        """The links of one connection as an eBPF switch hashes it: at every switch with a
        choice, the bucket :func:`~testbed.plan.groups.flow_hash` of ``five_tuple`` (source and
        destination address, protocol, ports) with the switch's own basis picks among the
        next hops in port order, as the ECMP groups list them (ECMP routing only)."""
        if self.routing != "ecmp":
            raise ValueError(f"paths as hashed need ecmp routing, not {self.routing}")
        if self.fluid.routes.get(src, {}).get(dst) is not None:  # inside a server
            return self.path(src, dst, channel, random.Random(0))
        s, d, a, b = self.ends(src, dst, channel)
        hops: dict[Link, float] = {(s, a): 1.0, (b, d): 1.0}
        node = a
        while node != b:
            nxt = self.hops(node, b)
            basis = hash_basis(self.topo.nodes[node], self.ecmp_seed)
            pick = nxt[select_bucket([1] * len(nxt), flow_hash(basis, *five_tuple))]
            hops[(node, pick)] = 1.0
            node = pick
        return tuple(sorted((self.index[link], w) for link, w in hops.items()))

    def _split(self, a: str, b: str) -> dict[Link, float]:
        """An even split at every switch from ``a`` to ``b`` (packet spraying's shares)."""
        weight = {a: 1.0}
        out: dict[Link, float] = {}
        dist = self.distances(b)
        frontier = [a] if a != b else []
        while frontier:
            node = max(frontier, key=lambda n: dist[n])  # all its weight is in
            frontier.remove(node)
            nxt = self.hops(node, b)
            for peer in nxt:
                share = weight[node] / len(nxt)
                out[(node, peer)] = out.get((node, peer), 0.0) + share
                if peer != b:
                    if peer not in weight:
                        frontier.append(peer)
                    weight[peer] = weight.get(peer, 0.0) + share
        return out

    def candidates(self, src: str, dst: str, channel: int) -> list[tuple[tuple[int, float], ...]]:
        """Every single path a connection may take (adaptive routing's choices)."""
        if self.fluid.routes.get(src, {}).get(dst) is not None:
            return [self.path(src, dst, channel, random.Random(0))]
        s, d, a, b = self.ends(src, dst, channel)
        walks = [[a]]
        done = []
        while walks:
            walk = walks.pop()
            if walk[-1] == b:
                done.append(walk)
                continue
            walks += [walk + [n] for n in self.hops(walk[-1], b)]
        ends = [(s, a), (b, d)]
        return [tuple(sorted((self.index[link], 1.0) for link in
                             ends + list(zip(walk, walk[1:])))) for walk in done]

    def rebalance(self, conns: dict[tuple, tuple[str, str, int]], paths: dict,
                  rng: random.Random, others: tuple = (),
                  placed: dict[int, int] | None = None) -> None:
        """Reactive rebalancing's moves after a step's placement (``conns``: key -> (source,
        destination, channel) of the connections that may move; ``paths``: their links,
        updated; ``others``: the links of the step's connections that do not move;
        ``placed``: link -> connections on it, updated as they move): at the max-min fair
        rates of the paths as they are, one connection at a time, in a random order, moves to
        the path whose busiest link (its share of the line), carrying it, would be lighter
        than its own path's busiest by :data:`REBALANCE_DELTA` -- over its links between
        switches weighing the next switch, else over its source switch's own link (what that
        switch sees) -- the rates worked out again after each move, until none moves (a local
        optimum: a swap of two connections is no single move). Then up to :data:`WALKS`
        walks (:meth:`_walk`), each from a connection held back (under :data:`HELD` of its
        line, its path busier than :data:`FULL`), each followed by single moves again, while
        no more than half the connections are held back."""
        ways_of = {k: self.candidates(*conns[k]) for k in conns}
        keys = [k for k in conns if len(ways_of[k]) > 1]
        rows = (list(conns), others)  # those with one way load their links too
        state = self._rates(*rows, paths)
        for walk in range(WALKS + 1):
            for _round in range(REBALANCE_ROUNDS):
                rng.shuffle(keys)
                moved = False
                for key in keys:
                    way = self._lighter(key, conns[key], ways_of[key], paths, state, rng)
                    if way is not None:
                        self._move(key, way, paths, placed)
                        state, moved = self._rates(*rows, paths), True
                if not moved:
                    break
            rate, load = state
            held = [k for k in keys if rate[k] < HELD * self._line(conns[k])
                    and self._busiest(conns[k], paths[k], load) >= FULL]
            if walk == WALKS or not held or len(held) * 2 > len(keys):
                return  # (most held back: a fabric no placement relieves, all links full)
            state = self._walk(rng.choice(held), conns, ways_of, paths, rng, rows, placed)

    def _line(self, conn: tuple[str, str, int]) -> float:
        """A connection's line: its source NIC's link's capacity."""
        s, _d, a, _b = self.ends(*conn)
        return self.capacity[self.index[(s, a)]]

    def _busiest(self, conn: tuple[str, str, int], way, load, carry: float = 0.0,
                 mine: set[int] | frozenset = frozenset()) -> float:
        """The busiest link of ``way`` that the connection's choice weighs, as a share of its
        capacity, ``carry`` (the connection's rate) added on the links not in ``mine`` (its
        own path's)."""
        links = {link for link, _w in way}
        return max(((load[link] + carry * (link not in mine)) / self.capacity[link]
                    for link in self._seen(links, self.ends(*conn)[2])), default=0.0)

    def _on(self, links: set[int], rate: float) -> np.ndarray:
        """A load of ``rate`` on ``links``, nothing elsewhere."""
        out = np.zeros(len(self.capacity))
        out[list(links)] = rate
        return out

    def _lighter(self, key: tuple, conn: tuple[str, str, int], ways: list, paths: dict,
                 state: tuple[dict, np.ndarray], rng: random.Random):
        """The way a connection moves to by a single move (lighter, carrying it, by the
        delta), one of the lightest drawn by ``rng``; None: it stays."""
        rate, load = state
        mine = {link for link, _w in paths[key]}
        best, found = self._busiest(conn, paths[key], load) - REBALANCE_DELTA, []
        for way in ways:
            other = self._busiest(conn, way, load, rate[key], mine)
            if other < best - 1e-9:
                best, found = other, [way]
            elif abs(other - best) <= 1e-9 and found:
                found.append(way)
        return rng.choice(found) if found else None

    def _move(self, key: tuple, way, paths: dict, placed: dict[int, int] | None) -> None:
        """Connection ``key`` onto ``way``, counted on its links between switches."""
        for link, sign in [(l, -1) for l, _w in paths[key]] + [(l, 1) for l, _w in way]:
            if placed is not None and link in self.fabric:
                placed[link] = placed.get(link, 0) + sign
        paths[key] = way

    def _walk(self, key: tuple, conns: dict, ways_of: dict, paths: dict, rng: random.Random,
              rows: tuple, placed: dict[int, int] | None) -> tuple[dict, np.ndarray]:
        """A walk of a collision along its chain of connections, from held-back ``key``, as
        the datapath's rebalancing makes it: the connection moves to the way busiest least
        without it when that is no busier than its own by the delta, though another
        connection is on it; a move onto a way busier than half its line pushes a
        connection there (drawn by ``rng``), which moves the same way, until a move lands
        on a way less busy (the collision mended) or none is allowed, at most
        :data:`WALK_STEPS` moves. The rates after it."""
        state = self._rates(*rows, paths)
        for _step in range(WALK_STEPS):
            rate, load = state
            conn, mine = conns[key], {link for link, _w in paths[key]}
            cur = self._busiest(conn, paths[key], load)
            options = [(self._busiest(conn, way, load - self._on(mine, rate[key])), way)
                       for way in ways_of[key] if {l for l, _w in way} != mine]
            if not options:
                break
            best = min(b for b, _way in options)
            if best > cur + REBALANCE_DELTA + 1e-9:
                break
            way = rng.choice([w for b, w in options if abs(b - best) <= 1e-9])
            self._move(key, way, paths, placed)
            state = self._rates(*rows, paths)
            shared = {link for link, _w in way if link in self.fabric}
            pushed = [k for k in ways_of if k != key and len(ways_of[k]) > 1
                      and any(link in shared for link, _w in paths[k])]
            if best < 0.5 or not pushed:
                break
            key = rng.choice(pushed)
        return state

    def _rates(self, keys: list, others: tuple, paths: dict) -> tuple[dict, np.ndarray]:
        """The connections' max-min fair rates on their paths, and each link's load."""
        rows = [paths[k] for k in keys] + list(others)
        weights = np.zeros((len(rows), len(self.capacity)))
        for i, row in enumerate(rows):
            for link, w in row:
                weights[i, link] = w
        rates = maxmin_rates(weights, np.ones(len(rows)), np.asarray(self.capacity))
        return dict(zip(keys, rates)), (weights * rates[:, None]).sum(axis=0)

    def _seen(self, links: set[int], source: str) -> list[int]:
        """The links of a path a rebalancing choice weighs: its links between switches
        (weighing the next switch), or the source switch's own."""
        return [link for link in links if link in self.fabric
                and (self.routing in WEIGHS_NEXT or self.fabric[link] == source)]


def sprayed(job: Job) -> bool:
    """Whether a job's transport sprays its packets over paths (uet does unless told not)."""
    return (job.transport == "uet") if job.spray is None else bool(job.spray)
