"""Pure fabric arithmetic: max-min fair shares, the ECMP balls-in-bins expectation, and the
fidelity model that says whether an experiment's offered load fits the emulator's capacity.

Links are full duplex: every direction of every link is its own resource, named ``(from, to)``.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import networkx as nx

from testbed.topology import Topology

Path = tuple[tuple[str, str], ...]


def _directed(nodes: list[str]) -> Path:
    return tuple(itertools.pairwise(nodes))


def _paths(topo: Topology, src: str, dst: str) -> tuple[Path, ...]:
    return tuple(_directed(p) for p in topo.equal_cost_paths(src, dst))


def switch_hops(topo: Topology, src: str, dst: str) -> int:
    """Switches a packet from host ``src`` to host ``dst`` crosses."""
    return len(topo.equal_cost_paths(src, dst)[0]) - 2


def capacities(topo: Topology) -> dict[tuple[str, str], float]:
    """Mbit/s of every link direction."""
    out = {}
    for link in topo.links:
        out[(link.a.node, link.b.node)] = link.rate_mbps
        out[(link.b.node, link.a.node)] = link.rate_mbps
    return out


def max_min_rates(paths: list[Path], capacity: dict[tuple[str, str], float]) -> list[float]:
    """Max-min fair rates of flows over fixed paths (progressive filling).

    Args:
        paths: one path (sequence of link directions) per flow.
        capacity: capacity of every link direction.

    Returns:
        The rate of each flow, in the unit of ``capacity``.
    """
    rates = [0.0] * len(paths)
    active = set(range(len(paths)))
    remaining = dict(capacity)
    while active:
        load: dict[tuple[str, str], int] = {}
        for f in active:
            for hop in paths[f]:
                load[hop] = load.get(hop, 0) + 1
        if not load:
            break
        share, bottleneck = min((remaining[h] / n, h) for h, n in load.items())
        for f in active:
            rates[f] += share
        for hop, n in load.items():
            remaining[hop] -= share * n
        frozen = {f for f in active if any(remaining[h] <= 1e-9 * capacity[h] for h in paths[f])}
        active -= frozen or {f for f in active if bottleneck in paths[f]}
    return rates


def ecmp_expectation(topo: Topology, pairs: list[tuple[str, str]], trials: int = 300,
                     seed: int = 1) -> float:
    """Expected delivered share of a pattern when every flow hashes onto a uniformly random
    shortest path (balls in bins), with max-min fair sharing; 1.0 means non-blocking.

    Args:
        topo: the fabric.
        pairs: (source, destination) host pairs, one flow each.
        trials: random path draws averaged.
        seed: random seed of the draws.

    Returns:
        Mean over draws of (sum of flow rates) / (sum of host-limited ideal rates).
    """
    cap = capacities(topo)
    options = [_paths(topo, s, d) for s, d in pairs]
    ideal = sum(min(cap[h] for h in opts[0]) for opts in options)
    rng = random.Random(seed)
    total = 0.0
    for _ in range(trials):
        chosen = [rng.choice(opts) for opts in options]
        total += sum(max_min_rates(chosen, cap))
    return total / trials / ideal


# -- the fidelity model -----------------------------------------------------------------------
#
# The emulator forwards every packet in software at every switch it crosses, so what it can carry
# is a budget of (bits x switch hops) per second. Measured with bench/capacity.py on a 2-core
# machine of the CI kind (userspace datapath, one vswitchd per switch, k=4, pinned cross-pod
# traffic of 16 TCP flows): at MTU 9000, 16 x 10 Mbit/s x 5 hops = 800 Mbit-hop/s kept 25 %
# of the CPU idle and 0.995 of ideal; 16 x 20 x 5 = 1600 still delivered 0.99 of ideal with the
# CPU exhausted. At MTU 1500, 800 Mbit-hop/s already exhausted the CPU and delivered 0.83.
# ``bench/capacity.py`` measures these figures again on the machine it runs on.

SATURATION_MBIT_HOPS = {1500: 700.0, 9000: 1600.0}
HEADROOM = 0.5  # full load under half the saturation point kept >= 25 % CPU idle (k=4, k=6)


def saturation_mbit_hops(mtu: int, table: dict[int, float] | None = None) -> float:
    """Saturation point (Mbit/s x switch hops) at ``mtu``, interpolated between measured MTUs."""
    points = sorted((table or SATURATION_MBIT_HOPS).items())
    if mtu <= points[0][0]:
        return points[0][1]
    for (m0, c0), (m1, c1) in itertools.pairwise(points):
        if mtu <= m1:
            return c0 + (c1 - c0) * (mtu - m0) / (m1 - m0)
    return points[-1][1]


def mean_switch_hops(topo: Topology) -> float:
    """Mean switch hops over all ordered host pairs (uniform all-to-all traffic)."""
    graph = topo.graph
    switches = [n for n in graph if topo.nodes[n].is_switch]
    sub = graph.subgraph(switches)
    hosts_at: dict[str, int] = {}
    for host in topo.hosts:
        access = topo.attachment(host.name).node
        hosts_at[access] = hosts_at.get(access, 0) + 1
    total = pairs = 0
    for a, na in hosts_at.items():
        dist = nx.single_source_shortest_path_length(sub, a)
        for b, nb in hosts_at.items():
            n = na * nb - (na if a == b else 0)
            total += n * (dist[b] + 1)
            pairs += n
    return total / pairs if pairs else 0.0


@dataclass(frozen=True)
class FidelityVerdict:
    """Whether a fabric's full offered load fits this machine's emulation budget."""

    hosts: int
    rate_mbps: float
    mean_hops: float
    offered_mbit_hops: float
    saturation_mbit_hops: float
    max_rate_mbps: float  # the highest host rate that fits with headroom

    @property
    def load(self) -> float:
        return self.offered_mbit_hops / self.saturation_mbit_hops

    @property
    def fits(self) -> bool:
        return self.load <= HEADROOM

    @property
    def overloaded(self) -> bool:
        return self.load > 1.0

    def explain(self) -> str:
        return (f"{self.hosts} hosts x {self.rate_mbps:g} Mbit/s x {self.mean_hops:.2f} switch "
                f"hops = {self.offered_mbit_hops:,.0f} Mbit-hop/s at full load, "
                f"{self.load:.0%} of this machine's measured saturation point "
                f"({self.saturation_mbit_hops:,.0f} Mbit-hop/s); host rates up to "
                f"{self.max_rate_mbps:.1f} Mbit/s fit with headroom")


def assess(topo: Topology, mtu: int, table: dict[int, float] | None = None) -> FidelityVerdict:
    """Predict whether every host sending at its line rate to uniformly spread destinations fits.

    Args:
        topo: the fabric.
        mtu: its MTU.
        table: saturation points by MTU (default: the figures measured for this project).

    Returns:
        The verdict, with the numbers behind it.
    """
    hosts = topo.hosts
    rate = max(topo.host_link(h.name).rate_mbps for h in hosts)
    hops = mean_switch_hops(topo)
    saturation = saturation_mbit_hops(mtu, table)
    offered = len(hosts) * rate * hops
    return FidelityVerdict(len(hosts), rate, hops, offered, saturation,
                           HEADROOM * saturation / (len(hosts) * hops))
