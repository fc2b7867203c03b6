"""Pure fabric arithmetic: max-min fair shares, the ECMP balls-in-bins expectation, and the
fidelity model that says whether an experiment's offered load fits the emulator's capacity.

Links are full duplex: every direction of every link is its own resource, named ``(from, to)``.
"""

from __future__ import annotations

import random

from testbed.topology import Topology

ETH_HEADER_BYTES = 14  # what HTB counts on top of the IP packet (no preamble, no FCS)
TCP_IP_HEADER_BYTES = 52  # IPv4 20 + TCP 20 + timestamps 12


def goodput_fraction(mtu: int) -> float:
    """TCP payload bytes per byte on the wire (as HTB counts it) for full-size segments."""
    return (mtu - TCP_IP_HEADER_BYTES) / (mtu + ETH_HEADER_BYTES)


Path = tuple[tuple[str, str], ...]


def _directed(nodes: list[str]) -> Path:
    return tuple(zip(nodes, nodes[1:]))


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
