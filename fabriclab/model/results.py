"""Pure results document: what ``fabriclab run`` writes to ``results.json`` as it goes, and the
figures derived from its rows (training iterations, the nccl-tests-like per-job summary).

Fields are documented in README ("Workloads and results"). The document is complete only when
``complete`` is true; a failed run keeps the rows it measured and gains ``error``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from fabriclab.model.document import (VERSION, CollectiveRow, FabricSummary, Iteration,
                                      RunDocument, Utilization, upgrade)
from testbed.model.records import Record, optional
from traffic.measure.results import CollectiveResult

__all__ = ["upgrade"]  # with the functions below: readers of older documents import it here


def new_document(experiment: str, source: str, started: str, fabric: dict) -> RunDocument:
    """An empty, incomplete results document."""
    return RunDocument(experiment, source, False, started, FabricSummary.from_json(fabric, "fabric"),
                       [], VERSION)


def new_rows(job_index: int, measured: list[CollectiveResult] | tuple,
             concurrent_jobs: int) -> list[CollectiveRow]:
    """One job's rows (one per collective run, repetitions numbered)."""
    return [CollectiveRow.from_json({"job": job_index, "repetition": i,
                                     "concurrent_jobs": concurrent_jobs,
                                     **{k: v for k, v in asdict(r).items() if k != "flows"}},
                                    f"collectives[{i}]")
            for i, r in enumerate(measured)]


def add_rows(doc: RunDocument, job_index: int, measured: list[CollectiveResult] | tuple,
             concurrent_jobs: int) -> list[CollectiveRow]:
    """Append one job's results (:func:`new_rows`); returns the rows added."""
    rows = new_rows(job_index, measured, concurrent_jobs)
    doc.collectives += rows
    return rows


def fail(doc: RunDocument, error: str) -> None:
    """Mark the document failed: it keeps what it measured and says why it stopped."""
    doc.complete = False
    doc.error = error


def finish(doc: RunDocument) -> None:
    """Mark the document complete, with its training iterations if any."""
    iterations = iteration_times(doc.collectives)
    if iterations:
        doc.iterations = iterations
    doc.complete = True


def congestion_controls(doc: RunDocument) -> list[str]:
    """The TCP congestion controls the run's sockets ran, as read back from them."""
    return sorted({cc for r in doc.collectives if r.transport and r.transport.transport == "tcp"
                   for cc in (r.transport.congestion_control or "").split("+") if cc})


def gbps_text(value: float) -> str:
    """A bandwidth in GB/s, four significant digits (emulated rates are hundredths)."""
    return f"{value:.4g}"


def us_text(value: float) -> str:
    """A time in us as NCCL-tests prints it (one decimal; none from 10,000 us)."""
    return f"{value:.1f}" if value < 1e4 else f"{value:.0f}"


def iteration_times(rows: list[CollectiveRow]) -> list[Iteration]:
    """Training: each job's iterations, from the barrier before the first phase to the last
    phase's end (``time_s``), with the compute on the way (each barrier segment's slowest
    rank's; an overlapped bucket's compute counts from the same barrier), the communication
    that did not hide behind it (``exposed_comm_s = time - compute``), all communication
    (``comm_s``: each phase from its last rank's start to its end) and the share of it
    hidden (``overlap_fraction``). Rows without timings of
    their own (runs made before) add their phases and gaps.

    Rows without an ``iteration`` (collectives, traces, background flows) count for none.
    """
    groups: dict[tuple, list[CollectiveRow]] = {}
    for row in rows:
        if row.iteration is not None:
            groups.setdefault((row.job, row.iteration), []).append(row)
    out = []
    for (job, it), group in sorted(groups.items()):
        comm = sum(r.time_us / 1e6 for r in group)
        if any(r.released_unix_s is None for r in group):
            out.append(Iteration(job, it, comm + sum(r.gap_s for r in group)))
            continue
        # communication: from the last rank's start (its compute done) to the end; the time
        # the others waited for a straggler is not the network's
        comm = sum(r.end_unix_s - (r.start_unix_s if r.ready_unix_s is None
                                   else r.ready_unix_s) for r in group)
        end = max(r.end_unix_s for r in group)
        total = end - group[0].released_unix_s
        compute, segment = 0.0, 0.0
        for r in group:
            if r.barrier:
                compute, segment = compute + segment, 0.0
            segment = max(segment, r.compute_s or 0.0)
        compute += segment
        exposed = max(0.0, total - compute)
        out.append(Iteration(job, it, round(total, 6), round(compute, 6), round(comm, 6),
                             round(exposed, 6),
                             round(min(1.0, max(0.0, 1 - exposed / comm)), 4) if comm else None))
    return out


@dataclass(frozen=True)
class JobSummary:
    """One row of the nccl-tests-like table: a job's collectives of one kind, averaged."""

    op: str
    algorithm: str
    ranks: int
    bytes: int
    repetitions: int
    mean_us: float  # NCCL-tests' units: us and GB/s
    algbw_GBps: float  # noqa: N815
    busbw_GBps: float  # noqa: N815
    efficiency: float
    agent_cpu_s: float
    job: int = 0
    label: str = ""
    predicted_us: float | None = None  # fabriclab predict's, averaged the same way
    hashed_us: float | None = None  # predicted on the paths as hashed, averaged the same way

    @property
    def of_predicted(self) -> float | None:
        """Measured over predicted time (1.0: as predicted; 1.3: 30 % slower)."""
        return self.mean_us / self.predicted_us if self.predicted_us else None

    @property
    def of_hashed(self) -> float | None:
        """Measured over the time predicted on the paths the connections took."""
        return self.mean_us / self.hashed_us if self.hashed_us else None

    @property
    def count(self) -> int:
        """float32 elements, as nccl-tests prints them."""
        return self.bytes // 4


def job_summaries(rows: list[CollectiveRow]) -> list[JobSummary]:
    """Rows grouped by (job, op, algorithm, bytes, communicator size), times averaged."""
    groups: dict[tuple, list[CollectiveRow]] = {}
    for row in rows:
        key = (row.job, row.op, row.algorithm, row.bytes, row.communicator_size)
        groups.setdefault(key, []).append(row)
    out = []
    for group in groups.values():
        r0 = group[0]
        mean_us = sum(r.time_us for r in group) / len(group)
        algbw = r0.bytes / mean_us / 1e3
        factor = r0.busbw_GBps / r0.algbw_GBps
        predicted = [r.predicted_s for r in group if r.predicted_s]
        hashed = [r.predicted_hashed_s for r in group if r.predicted_hashed_s]
        out.append(JobSummary(r0.op, r0.algorithm, r0.communicator_size, r0.bytes,
                              len(group), mean_us, algbw, algbw * factor,
                              sum(r.efficiency for r in group) / len(group),
                              sum(r.agent_cpu_s for r in group), r0.job, r0.label,
                              sum(predicted) / len(predicted) * 1e6
                              if len(predicted) == len(group) else None,
                              sum(hashed) / len(hashed) * 1e6
                              if len(hashed) == len(group) else None))
    return out


@dataclass
class VariantJob(Record):
    """One job of a variant's line: its mean busbw and efficiency, and the worst flow
    completion p50 and p99 over its repetitions (each transfer's own FCT; for runs before
    version 3 of results.json, when transfers ended from the collective's start)."""

    op: str
    label: str = ""
    ranks: int = 0
    busbw_GBps: float = 0.0  # noqa: N815
    efficiency: float = 0.0
    fct_p50_s: float = 0.0
    fct_p99_s: float = 0.0
    throughput_of_ideal: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.label or self.op


#: what a variant's transports did, summed over its collectives (the UDP transports' counters)
TRANSPORT_COUNTERS = ("tx_retransmitted", "tx_timeouts", "tx_trim_naks", "tx_credit_stalls",
                      "tx_grants", "rx_lost", "tx_naks", "tx_cnps", "tx_rate_cuts")


@dataclass
class TransportSummary(Record):
    """A variant's transport at a glance (:func:`transport_row`)."""

    label: str
    tx_retransmitted: int = 0
    tx_timeouts: int = 0
    tx_trim_naks: int = 0
    tx_credit_stalls: int = 0
    tx_grants: int = 0
    rx_lost: int = 0
    tx_naks: int = 0
    tx_cnps: int = 0
    tx_rate_cuts: int = 0
    trimmed: int | None = None
    corrupted: int | None = None
    llr_replays: int | None = None
    bad_fcs_drops: int | None = None
    bottleneck_queue_p99_bytes: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class VariantRow(Record):
    """One variant's line of the side-by-side comparison (``variants.json``, a sweep cell's
    ``row``)."""

    variant: str | None
    complete: bool = False
    bdp_packets: float | None = None
    error: str | None = None
    fidelity: str | None = None
    drops: int | None = None
    ecn_marked: int | None = None
    pfc_pause_events: int | None = None
    pfc_paused_s: float | None = None
    pfc_watchdog_events: int | None = None
    lossless_drops: int | None = None
    credit_stall_events: int | None = None
    credit_stalled_s: float | None = None
    queue_max_bytes: int | None = None
    queue_p99_bytes: int | None = None
    pfc_deadlocks: int = 0
    utilization: dict[str, Utilization] = field(default_factory=dict)
    transport: TransportSummary | None = None
    jobs: list[VariantJob] = field(default_factory=list)
    time_scale: float | None = optional()  # emulator.time_scale's N: real time = time / N
    bdp_bytes: float | None = optional()  # the fabric's bandwidth-delay product
    # the share of the data packets (TCP: segments) received that arrived out of order
    reordered: float | None = optional()
    extra: dict[str, Any] = field(default_factory=dict)

    def top_utilization(self) -> Utilization | None:
        """The links into the top tier's (agg->core, leaf->spine), if the fabric has one."""
        return next((self.utilization[t] for t in ("agg->core", "leaf->spine")
                     if t in self.utilization), None)


#: the congestion counters a variant's line carries
_VARIANT_COUNTERS = ("drops", "ecn_marked", "pfc_pause_events", "pfc_paused_s",
                     "pfc_watchdog_events", "lossless_drops", "credit_stall_events",
                     "credit_stalled_s", "queue_max_bytes", "queue_p99_bytes")


def variant_row(doc: RunDocument | None, variant: str | None = None,
                error: str | None = None) -> VariantRow:
    """One variant's line of the side-by-side comparison: its status, its switch queues,
    and per job the mean busbw and the worst flow completion p50 and p99 over its
    repetitions. ``doc`` None: the variant wrote no document (``error`` says why)."""
    if doc is None:
        return VariantRow(variant, error=error or "no results.json")
    congestion = doc.congestion
    row = VariantRow(
        doc.fabric.variant, doc.complete, doc.fabric.bdp_packets, doc.error,
        doc.fidelity_verdict,
        **{k: congestion.counter(k) if congestion else None for k in _VARIANT_COUNTERS},
        pfc_deadlocks=len(congestion.pfc.deadlocks) if congestion and congestion.pfc else 0,
        utilization=dict(congestion.utilization) if congestion else {},
        transport=transport_row(doc), time_scale=doc.time_scale.n if doc.time_scale else None,
        bdp_bytes=doc.fabric.bdp_bytes, reordered=reordered(doc))
    for s in job_summaries(doc.collectives):
        rows = [r for r in doc.collectives if (r.job, r.op, r.bytes) == (s.job, s.op, s.bytes)]
        fct = {q: max((getattr(r.fct_s if r.fct_s.p50 is not None else r.flow_end_s, q)
                       or 0.0 for r in rows), default=0.0) for q in ("p50", "p99")}
        tput = [r.throughput_of_ideal for r in rows if r.throughput_of_ideal]
        row.jobs.append(VariantJob(s.op, s.label, s.ranks, s.busbw_GBps, s.efficiency,
                                   fct["p50"], fct["p99"],
                                   sum(tput) / len(tput) if tput else None))
    return row


def reordered(doc: RunDocument) -> float | None:
    """The share of the data packets received over the run's collectives that arrived out of
    order (the UDP transports' own counts; TCP's segments from TCP_INFO); None when no
    collective says how many arrived."""
    rows = [r.transport for r in doc.collectives if r.transport is not None]
    got = sum(t.counter("rx_packets") or t.counter("rx_data_segments") for t in rows)
    return round(sum(t.counter("rx_out_of_order") for t in rows) / got, 6) if got else None


def transport_row(doc: RunDocument) -> TransportSummary | None:
    """A variant's transport at a glance: which (``uet RUD+RCCC``, ``rocev2 HPCC``), its
    counters summed over the collectives, the switches' trims, corrupted frames and LLR
    replays, and the busiest port's queue p99 (an incast's bottleneck). None: TCP only."""
    rows = [r.transport for r in doc.collectives
            if r.transport is not None and r.transport.transport in ("uet", "rocev2")]
    if not rows:
        return None
    congestion = doc.congestion
    ports = congestion.ports if congestion else {}
    return TransportSummary(
        rows[0].label, **{k: sum(r.counter(k) for r in rows) for k in TRANSPORT_COUNTERS},
        **{k: congestion.counter(k) if congestion else None
           for k in ("trimmed", "corrupted", "llr_replays", "bad_fcs_drops")},
        bottleneck_queue_p99_bytes=max((p.queue_p99_bytes for p in ports.values()),
                                       default=None))


def run_timings(marks: dict[str, float], end: float) -> dict[str, float]:
    """Bring-up, measurement (the workload, from the fabric up to the last result) and
    teardown (after ``--keep``'s wait, if any), in seconds; the phases a failed run reached."""
    out = {}
    if "up" in marks:
        out["bring_up"] = round(marks["up"] - marks["start"], 2)
    if "measured" in marks:
        out["measurement"] = round(marks["measured"] - marks["up"], 2)
        out["teardown"] = round(end - marks.get("kept", marks["measured"]), 2)
    out["total"] = round(end - marks["start"], 2)
    return out
