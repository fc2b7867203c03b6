"""Pure job description and results: the spec the agents read, and per-collective results
from their reports with NCCL-tests' metrics (:mod:`traffic.agents.runner` runs the agents)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from traffic.measure import metrics
from traffic.measure.flows import FlowResult, quantiles
from traffic.predict.ideal import FluidModel
from traffic.protocol import AgentReport, AgentSpec, CollectiveSpec, RankSpec
from traffic.measure.transport import goodput_fraction
from traffic.workloads.workload import Collective

AGENT_PORT = 17000
#: (source host, destination host, bytes) -> (ideal FCT, line-rate FCT) in seconds
IdealFct = Callable[[str, str, int], tuple[float, float]]


def row_label(row: dict) -> str:
    """What a results row (a collective, or a job's summary) is called: its label (``fwd tp
    all_reduce``), else its operation (``all_reduce``)."""
    return row.get("label") or row["op"]


@dataclass
class CollectiveResult:
    """What one collective measured (results.json fields)."""

    op: str
    algorithm: str
    ranks: list[str]
    bytes: int
    time_us: float  # NCCL-tests' figures in its units: time in us, bandwidths in GB/s
    algbw_GBps: float  # noqa: N815
    busbw_GBps: float  # noqa: N815
    ideal_s: float
    efficiency: float
    # when its transfers ended, in seconds from the collective's start (p50, p99, max)
    flow_end_s: dict[str, float] = field(default_factory=dict)
    label: str = ""
    agent_cpu_s: float = 0.0  # CPU seconds of all agents over the whole job (first row only)
    agent_user_cpu_s: float = 0.0  # of those, in user space (the rest: the kernel's)
    gap_s: float = 0.0  # compute time before it (training workloads)
    communicator_size: int = 0  # ranks per communicator (len(ranks) unless groups ran at once)
    iteration: int | None = None  # training workloads: the iteration it belongs to
    transport: dict | None = None  # the transport's counters summed over the ranks
    scale_out_bytes: int | None = None  # servers of GPUs: bytes moved between servers
    moved_bytes: int | None = None  # servers of GPUs: bytes moved in all (scale-up too)
    throughput_of_ideal: float | None = None  # op flows: Hedera's aggregate throughput measure
    start_unix_s: float = 0.0  # when its first rank started (Unix time): the report's marks
    start_skew_s: float = 0.0  # from its first rank's start to its last's (a barrier's spread)
    released_unix_s: float | None = None  # when the ranks left the barrier its gap counts from
    compute_s: float | None = None  # the slowest rank's compute from that barrier to its start
    ready_unix_s: float | None = None  # when the last rank started it (its compute done)
    barrier: bool = True  # False: an overlapped bucket (released, not after the previous one)
    fct_s: dict[str, float] = field(default_factory=dict)  # each from its own start to its end
    slowdown: dict[str, float] = field(default_factory=dict)  # FCT over ideal FCT
    # every transfer (flows.csv, not results.json)
    flows: list[FlowResult] = field(default_factory=list)


def job_spec(collectives: list[Collective], ips: dict[str, str], connections: int,
             start_at: float, port: int = AGENT_PORT,
             congestion_control: str | None = None, dscp: int = 0, transport: str = "tcp",
             spray: bool | None = None, scale: dict | None = None,
             dcqcn: str = "paper", planes: dict[str, tuple[str, ...]] | None = None,
             servers: dict[str, int] | None = None,
             options: dict | None = None, seed: str | None = None) -> AgentSpec:
    """The spec every agent reads. All collectives must use the same rank hosts (one job).
    ``planes``: a multi-plane fabric's other NIC addresses per host; ``servers``: each GPU's
    server; ``seed``: what the connections' source ports derive from (None: the kernel's
    choice)."""
    hosts = collectives[0].hosts
    if any(c.hosts != hosts for c in collectives):
        raise ValueError("one job, one rank list")
    planes, servers = planes or {}, servers or {}
    ranks = tuple(RankSpec(h, ips[h], tuple(planes.get(h, ())), servers.get(h, 0))
                  for h in hosts)
    return AgentSpec(port, connections, start_at, ranks,
                     tuple(CollectiveSpec(c.op, c.gap_s, tuple(c.schedule.transfers),
                                          c.gaps, c.barrier) for c in collectives), congestion_control=congestion_control,
                     dscp=dscp, transport=transport, spray=spray, scale=scale,
                     dcqcn=dcqcn, transport_options=options, seed=seed)


def transport_totals(per_rank: list[dict | None]) -> dict | None:
    """One collective's transport counters summed over its ranks (the UDP transports' own,
    TCP's from ``TCP_INFO``), with the share of sent payload that was new data (goodput /
    throughput)."""
    rows = [r for r in per_rank if r]
    if not rows:
        return None
    out: dict = {k: rows[0][k] for k in ("transport", "spray", "dcqcn", "constants",
                                         "delivery", "rccc", "nscc", "congestion_control",
                                         "entropy", "engine")
                 if k in rows[0]}
    for row in rows:
        _add(out, row)
    if "tx_packets" in out:  # the UDP transports: by packets
        sent, again = out["tx_packets"], out.get("tx_retransmitted", 0)
    else:  # TCP (TCP_INFO): by bytes
        sent, again = out.get("tx_bytes", 0), out.get("tx_retransmitted_bytes", 0)
    out["goodput_ratio"] = round(1 - again / sent, 4) if sent else None
    return out


#: counters that are a least value, not a count: the least of the ranks' (and, from one
#: collective to the next, the least so far); and a greatest value likewise
LEAST_KEYS = ("_min_us", "_min_ratio")
MOST_KEYS = ("_max_us",)


def _add(total: dict, row: dict) -> None:
    """``row``'s counters added to ``total``'s (histograms bucket by bucket; a least value,
    ``*_min_us``, ``*_min_ratio``, the least of both; ``*_max_us`` the greatest)."""
    for k, v in row.items():
        if isinstance(v, dict):
            _add(total.setdefault(k, {}), v)
        elif isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        elif k.endswith(LEAST_KEYS):
            total[k] = min(total.get(k, v), v)
        elif k.endswith(MOST_KEYS):
            total[k] = max(total.get(k, v), v)
        else:
            total[k] = total.get(k, 0) + v


def _compute(coll: Collective, per_rank: list) -> dict:
    """A collective's measured compute: from the barrier its gap counts from to each rank's
    start, the slowest rank's (the agents' own clocks; one machine, one clock)."""
    released = [c.released for c in per_rank if c.released is not None]
    if not released:
        return {}
    return {"released_unix_s": round(max(released), 6), "barrier": coll.barrier,
            "ready_unix_s": round(max(c.start for c in per_rank), 6),
            "compute_s": round(max(c.start - c.released for c in per_rank
                                   if c.released is not None), 6)}


def _flows(coll: Collective, per_rank: list, start: float,
           ideal_fct: IdealFct | None) -> list[FlowResult]:
    """Every transfer the ranks received, with its sender's start (sorted by hosts, step)."""
    sent = {(t.src, t.dst, t.step): t for c in per_rank for t in c.sends}
    out = []
    for c in per_rank:
        for f in c.flows:
            send = sent.get((f.src, f.dst, f.step))
            src, dst = coll.hosts[f.src], coll.hosts[f.dst]
            ideal, line = ideal_fct(src, dst, f.bytes) if ideal_fct else (None, None)
            out.append(FlowResult(
                src, dst, f.step, f.bytes,
                round((send.start if send else c.start) - start, 6), round(f.done - start, 6),
                ideal, send.retransmitted if send else None, line))
    return sorted(out, key=lambda f: (f.src, f.dst, f.step))


def summarize(collectives: list[Collective], reports: list[AgentReport], rate_mbps: float,
              mtu: int, fluid: FluidModel | None = None,
              ideal_fct: IdealFct | None = None) -> list[CollectiveResult]:
    """Per-collective results from the agents' reports (pure). With ``fluid`` (servers of
    GPUs: their collectives cross two domains at two rates) the ideal time is what the
    schedule's byte counts predict on the fabric, link by link (:mod:`traffic.predict.ideal`).
    ``ideal_fct(src, dst, bytes)``: a transfer's times alone on the idle fabric, as emulated
    and at line rate (each transfer's slowdown; :mod:`traffic.measure.flows`)."""
    out = []
    for index, coll in enumerate(collectives):
        per_rank = [r.collectives[index] for r in reports]
        start = min(c.start for c in per_rank)
        end = max(c.end for c in per_rank)
        duration = max(end - start, 1e-9)
        flows = _flows(coll, per_rank, start, ideal_fct)
        fcts = [f.end_s for f in flows]  # from the collective's start: its flows' ends
        sched = coll.schedule
        n = sched.communicator_size
        if fluid is not None and coll.servers is not None:
            ideal = fluid.ideal_s(sched, coll.hosts, goodput_fraction(mtu))
        else:
            ideal = metrics.ideal_time_s(coll.op, n, sched.size_bytes, rate_mbps,
                                         goodput_fraction(mtu))
        out.append(CollectiveResult(
            coll.op, sched.algorithm, list(coll.hosts), sched.size_bytes, duration * 1e6,
            metrics.algbw_GBps(sched.size_bytes, duration),
            metrics.busbw_GBps(coll.op, n, sched.size_bytes, duration), ideal,
            metrics.efficiency(coll.op, n, sched.size_bytes, duration, rate_mbps),
            quantiles(fcts), coll.label, gap_s=coll.gap_s,
            fct_s=quantiles([f.fct_s for f in flows]),
            slowdown=quantiles([f.slowdown for f in flows if f.slowdown is not None]),
            communicator_size=n, iteration=coll.iteration,
            transport=transport_totals([c.transport for c in per_rank]),
            throughput_of_ideal=metrics.throughput_of_ideal(
                [(f.bytes, f.end_s) for f in flows], rate_mbps,
                goodput_fraction(mtu)) if coll.op == "flows" and fcts else None,
            scale_out_bytes=coll.scale_out_bytes(),
            moved_bytes=coll.moved_bytes() if coll.servers is not None else None,
            flows=flows,
            start_unix_s=round(start, 6),
            start_skew_s=round(max(c.start for c in per_rank) - start, 6),
            **_compute(coll, per_rank)))
    if out:
        out[0].agent_cpu_s = sum(r.cpu_s for r in reports)
        out[0].agent_user_cpu_s = round(sum(r.user_cpu_s for r in reports), 3)
    return out
