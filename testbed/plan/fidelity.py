"""Pure fabric arithmetic: max-min fair shares, the ECMP balls-in-bins expectation, and the
fidelity model that says whether an experiment's offered load fits the emulator's capacity.

Links are full duplex: every direction of every link is its own resource, named ``(from, to)``.
"""

from __future__ import annotations

import math

import itertools
import random
from collections.abc import Iterable
from dataclasses import dataclass, field

import networkx as nx

from testbed.model.topology import Topology

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
# The eBPF datapath (no process forwards; the hosts' stacks and the senders are most of the CPU),
# the same bench: 16 cross-pod TCP flows at 1000 Mbit/s each (5 hops) delivered 0.996 of ideal at
# MTU 9000 (79,000 Mbit-hop/s, 5 % idle) and at MTU 1500 (76,000, 11 % idle); at 500 Mbit/s,
# 43-45 % idle. Segmentation offload makes TCP's cost per bit almost independent of the MTU.
EBPF_SATURATION_MBIT_HOPS = {1500: 76000.0, 9000: 79000.0}


def saturation_table(datapath: str) -> dict[int, float]:
    """The measured saturation points of a datapath (``ovs``: its userspace datapath, the
    slowest it runs with; ``ebpf``)."""
    return EBPF_SATURATION_MBIT_HOPS if datapath == "ebpf" else SATURATION_MBIT_HOPS


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


MEASURED_CORES = 2  # the cores of the machine the table was measured on


def machine_budget_mbit_hops(mtu: int, cores: int,
                             table: dict[int, float] | None = None) -> float:
    """What a machine carries with headroom (Mbit-hop/s): the measured saturation point at
    ``mtu``, scaled by its cores against the measuring machine's (a cluster's partition weighs
    its machines by it)."""
    return HEADROOM * saturation_mbit_hops(mtu, table) * max(1, cores) / MEASURED_CORES


def mean_switch_hops(topo: Topology) -> float:
    """Mean switch hops over all ordered host pairs (uniform all-to-all traffic); pairs of
    GPUs in one server count none (their traffic stays in the scale-up domain), NICs of two
    planes are no pair."""
    graph = topo.graph
    switch = {n for n in graph if topo.nodes[n].is_switch}
    sub = nx.Graph()  # the switches alone, simple (a subgraph view filters every edge each step)
    sub.add_nodes_from(switch)
    sub.add_edges_from((u, v) for u, v in graph.edges() if u in switch and v in switch)
    hosts_at: dict[str, int] = {}
    for host in topo.hosts:
        access = topo.attachment(host.name).node
        hosts_at[access] = hosts_at.get(access, 0) + 1
    total = pairs = 0
    dists = _access_distances(sub, hosts_at)
    for a, na in hosts_at.items():
        for b, nb in hosts_at.items():
            if b not in dists[a]:  # another plane of a multi-plane fabric: no traffic
                continue
            n = na * nb - (na if a == b else 0)
            total += n * (dists[a][b] + 1)
            pairs += n
    for server in topo.servers:  # a server's own GPUs talk over its scale-up: no switch
        for nics in (server.gpus, *server.planes):  # (on no plane)
            ends = [topo.attachment(g).node for g in nics]
            total -= sum(dists[x][y] + 1 for i, x in enumerate(ends)
                         for j, y in enumerate(ends) if i != j)
    return total / pairs if pairs else 0.0


def _access_distances(sub: nx.Graph, access: Iterable[str]) -> dict[str, dict[str, int]]:
    """Switch hops from each access switch to every switch. Access switches with the same
    neighbours (one pod of a fat tree, every leaf of a leaf-spine) are the same distance from
    everything but each other (two hops apart), so one search serves them all: 32 searches
    instead of 512 on a k=32 fat tree."""
    by_neighbours: dict[frozenset, list[str]] = {}
    for a in access:
        by_neighbours.setdefault(frozenset(sub[a]), []).append(a)
    out = {}
    for neighbours, members in by_neighbours.items():
        first = nx.single_source_shortest_path_length(sub, members[0])
        for a in members:
            dist = dict(first)
            if a != members[0]:
                dist[a] = 0
                if neighbours:
                    dist[members[0]] = 2
                else:  # alone: it reaches nothing, not even the other lone ones
                    dist = {a: 0}
            out[a] = dist
    return out


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
                f"({self.saturation_mbit_hops:,.0f} Mbit-hop/s); "
                + (f"host rates up to {self.max_rate_mbps:.1f} Mbit/s fit with headroom"
                   if math.isfinite(self.max_rate_mbps) else "no traffic crosses a switch"))


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
                           HEADROOM * saturation / (len(hosts) * hops) if hops else math.inf)


# -- the run's own fidelity (Mininet-HiFi's rule of thumb: keep idle CPU, check achieved rates)

MIN_IDLE_PCT = 10.0  # median machine idle below this: the emulator competes for the CPU
VSWITCHD_BUSY_PCT = 95.0  # a vswitchd at this share of one core (median) is its own bottleneck
MIN_BACKLOGGED_RATE = 0.85  # a port with a queue at both ends of a sample sends this share


@dataclass(frozen=True)
class FidelitySample:
    """One reading of the run: the machine's idle share over the interval before it, each
    vswitchd's share of one core, and every switch port's bytes sent and backlog now."""

    time_s: float
    idle_pct: float | None
    vswitchd_pct: dict[str, float]
    ports: dict[str, tuple[int, int]]  # port -> (bytes sent, backlog bytes)
    paused_s: dict[str, float] = field(default_factory=dict)  # port -> PFC-paused seconds
    # port -> the least backlog of the queue samples taken since the previous reading (this
    # one's included); absent: none taken, the two readings' backlogs stand for the interval
    least_backlog: dict[str, int] = field(default_factory=dict)
    # port -> the share of its configured rate it has now, where a link was degraded
    rate_factor: dict[str, float] = field(default_factory=dict)


def judge_fidelity(samples: list[FidelitySample], port_rate_bps: dict[str, float],
                   frame_bytes: int) -> dict:
    """``ok`` or ``degraded`` (with the reasons) from a run's samples.

    Degraded when the machine's median idle share fell under :data:`MIN_IDLE_PCT`, when a
    vswitchd's median load reached :data:`VSWITCHD_BUSY_PCT` of a core, or when ports that
    had at least two frames queued at both ends of a sample interval (so had data to send
    throughout, short of a drain between the readings) sent a median share of their
    rate under :data:`MIN_BACKLOGGED_RATE` (the configured one, times a degraded link's
    ``rate_factor``; an interval in which that changed is left out). Where the queues were sampled between
    the readings too (``least_backlog``), every sample must hold the two frames: at 100 Mbit/s a
    256 KiB queue drains in 21 ms, so a queue seen at both ends of a second need not have
    stood in between. A port PFC paused during the interval was told to stop: its interval
    says nothing about the emulator.
    """
    idle = sorted(s.idle_pct for s in samples if s.idle_pct is not None)
    vsw: dict[str, list[float]] = {}
    for s in samples:
        for name, pct in s.vswitchd_pct.items():
            vsw.setdefault(name, []).append(pct)
    shares = []
    for a, b in itertools.pairwise(samples):
        dt = b.time_s - a.time_s
        if dt <= 0:
            continue
        for port, (sent_b, backlog_b) in b.ports.items():
            if port not in a.ports or port not in port_rate_bps:
                continue
            sent_a, backlog_a = a.ports[port]
            paused = b.paused_s.get(port, 0.0) > a.paused_s.get(port, 0.0)
            least = min(backlog_a, backlog_b, b.least_backlog.get(port, backlog_b))
            if a.rate_factor.get(port) != b.rate_factor.get(port):
                continue  # degraded or restored in the interval: no one rate to compare with
            rate = port_rate_bps[port] * b.rate_factor.get(port, 1.0)
            if least >= 2 * frame_bytes and sent_b >= sent_a and not paused:
                shares.append((sent_b - sent_a) * 8 / dt / rate)
    shares.sort()
    reasons = []
    out = {"samples": len(samples)}
    if idle:
        out["idle_pct"] = {"median": round(_median(idle), 1), "min": round(idle[0], 1)}
        if _median(idle) < MIN_IDLE_PCT:
            reasons.append(f"the machine was {_median(idle):.0f} % idle (median), under "
                           f"{MIN_IDLE_PCT:.0f} %: the emulation competed for the CPU")
    if vsw:
        out["vswitchd_pct"] = {n: round(_median(sorted(v)), 1) for n, v in sorted(vsw.items())}
        for name, values in sorted(vsw.items()):
            if _median(sorted(values)) >= VSWITCHD_BUSY_PCT:
                reasons.append(f"{name} used {_median(sorted(values)):.0f} % of a core "
                               "(median): the switch, not the links, set the pace")
    if shares:
        out["backlogged_rate"] = {"median": round(_median(shares), 3),
                                  "p10": round(shares[len(shares) // 10], 3),
                                  "intervals": len(shares)}
        if _median(shares) < MIN_BACKLOGGED_RATE:
            reasons.append(f"ports with a standing queue sent {_median(shares):.2f} of their "
                           f"rate (median of {len(shares)} port-intervals), under "
                           f"{MIN_BACKLOGGED_RATE:g}")
    out["verdict"] = "degraded" if reasons else "ok"
    out["reasons"] = reasons
    return out


def _median(ordered: list[float]) -> float:
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


# -- a run over several machines (testbed.cluster.coordinator): one verdict, one timeline

def merge_fidelity(reports: dict[str, dict]) -> dict:
    """One verdict for a cluster run: ``degraded`` when a machine's is (its reasons prefixed
    with the machine), every machine's under ``machines``."""
    reports = {m: r for m, r in reports.items() if r}
    if not reports:
        return {}
    degraded = [m for m, r in reports.items() if r.get("verdict") != "ok"]
    idle = [r["idle_pct"] for r in reports.values() if r.get("idle_pct")]
    return {"samples": min(r.get("samples", 0) for r in reports.values()),
            **({"idle_pct": {"median": min(i["median"] for i in idle),
                             "min": min(i["min"] for i in idle)}} if idle else {}),
            "verdict": "degraded" if degraded else "ok",
            "reasons": [f"{m}: {reason}" for m in degraded
                        for reason in reports[m].get("reasons", [])],
            "machines": reports}


def merge_timelines(timelines: dict[str, dict]) -> dict:
    """The machines' timelines as one: ports from all, the i-th samples of every machine
    together (each machine samples every interval from the same start, within a tick), the
    idle share the least of the machines', vswitchds named ``machine/instance``."""
    timelines = {m: t for m, t in timelines.items() if t}
    if not timelines:
        return {}
    first = next(iter(timelines.values()))
    count = min(len(t["samples"]) for t in timelines.values())
    samples = []
    for i in range(count):
        rows = {m: t["samples"][i] for m, t in timelines.items()}
        idle = [r["idle_pct"] for r in rows.values() if r["idle_pct"] is not None]
        samples.append({
            "t_s": rows[next(iter(rows))]["t_s"],
            "idle_pct": min(idle) if idle else None,
            "vswitchd_pct": {f"{m}/{k}": v for m, r in rows.items()
                             for k, v in r["vswitchd_pct"].items()},
            "ports": {p: c for r in rows.values() for p, c in r["ports"].items()}})
    return {"interval_s": first["interval_s"], "fields": first["fields"],
            "ports": {p: info for t in timelines.values() for p, info in t["ports"].items()},
            "samples": samples}
