"""The run document, typed (pure): what ``fabriclab run`` writes to ``results.json`` and every
reader of results reads, versioned, with its JSON Schema (``docs/schema/results.schema.json``).

:class:`RunDocument` is the whole file; :class:`CollectiveRow` one measured collective (NCCL-
tests' units: us and GB/s). Sections a run writes only when it has them (``error``,
``iterations``, ``telemetry``, ``failures``, ``jobs``, ``cluster``, ``real_scale``,
``replay``) are None when absent. A key a record does not declare is kept in its ``extra``
and written back (documents of later versions read). :func:`read` takes any results.json
fabriclab has written: version 1 (no ``version``: every release before the typed document),
including rows in the units before NCCL-tests' (:func:`upgrade`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from testbed.model.records import DocumentError, Record, optional
from traffic.measure.rows import CollectiveRow, FlowCompletion, RealFigures, TransportCounters

#: the version this fabriclab writes; 1 is every results.json written before it had one; 3
#: renamed ``flow_completion_s`` (when transfers ended, from the collective's start) to
#: ``flow_end_s`` and added each transfer's own completion time (``fct_s``), ``slowdown`` and
#: the run's ``provenance``
VERSION = 3

__all__ = ["VERSION", "CollectiveRow", "DocumentError", "FlowCompletion", "Provenance",
           "RealFigures", "RunDocument", "TransportCounters", "read", "upgrade"]


@dataclass
class FabricSummary(Record):
    """What fabric ran: its topology and shape (the shape's keys, such as ``k`` or
    ``leaves``, are in ``extra``), rates, MTU, routing and bandwidth-delay product."""

    topology: str = ""
    variant: str | None = None
    host_rate_mbps: float | None = None
    fabric_rate_mbps: float | None = None
    mtu: int | None = None
    routing: str | None = None
    base_rtt_ms: float | None = None
    bdp_bytes: int | None = None
    bdp_packets: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class PredictedCollective(Record):
    """``fabriclab predict``'s figure for one collective of a job."""

    job: int
    index: int
    op: str
    predicted_s: float
    label: str = ""
    low_s: float | None = None
    high_s: float | None = None
    gap_s: float = 0.0
    draws: int | None = None
    busiest_link: str | None = None
    path_draws: int | None = None
    busbw_GBps: float | None = None  # noqa: N815
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class PredictedIteration(Record):
    """``fabriclab predict``'s figure for one training iteration."""

    job: int
    iteration: int
    predicted_s: float
    compute_s: float | None = None
    comm_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Prediction(Record):
    """The prediction beside the measurement: the routing it assumed, how, per collective."""

    routing: str
    collectives: list[PredictedCollective] = field(default_factory=list)
    draws: int | None = None
    share_cv: float | None = None
    model: str | None = None
    iterations: list[PredictedIteration] | None = optional()
    as_hashed_missing: str | None = optional()
    extra: dict[str, Any] = field(default_factory=dict)

    def job_seconds(self, job: int) -> float | None:
        """A job's predicted time: its iterations' where it trains, else its collectives'
        and the compute before each."""
        its = [i.predicted_s for i in self.iterations or () if i.job == job]
        if its:
            return sum(its)
        rows = [r for r in self.collectives if r.job == job]
        return sum(r.predicted_s + r.gap_s for r in rows) if rows else None


@dataclass
class PortCongestion(Record):
    """One switch port's counters over the workload."""

    packets: int = 0
    drops: int = 0
    queue_max_bytes: int = 0
    queue_p99_bytes: int = 0
    priorities: dict[str, dict[str, Any]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Utilization(Record):
    """A tier's links' busiest and mean utilization (0-1)."""

    max: float
    mean: float
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class PfcDeadlock(Record):
    """A cycle of paused ports the PFC agent found."""

    priority: int
    ports: list[str]
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class PfcReport(Record):
    """The PFC agent's own figures."""

    deadlocks: list[PfcDeadlock] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Congestion(Record):
    """The switches' queues, drops, marks, pauses and credits over the workload."""

    TITLE: ClassVar[str] = "the switch ports' counters over the workload"
    drops: int = 0
    ect: int = 0
    ecn_marked: int = 0
    pfc_pause_events: int = 0
    pfc_paused_s: float = 0.0
    pfc_watchdog_events: int = 0
    lossless_drops: int = 0
    link_loss_drops: int = 0
    trimmed: int = 0
    corrupted: int = 0
    llr_replays: int = 0
    bad_fcs_drops: int = 0
    credit_stall_events: int = 0
    credit_stalled_s: float = 0.0
    queue_max_bytes: int = 0
    queue_p99_bytes: int = 0
    samples: int = 0
    virtual_queue_drift_bytes: dict[str, float] | None = None
    ports: dict[str, PortCongestion] = field(default_factory=dict)
    utilization: dict[str, Utilization] = field(default_factory=dict)
    marker: str | None = None
    pfc: PfcReport | None = optional()
    extra: dict[str, Any] = field(default_factory=dict)

    def counter(self, name: str) -> int | float | None:
        """A fabric-wide counter by name."""
        return getattr(self, name, None) if name in self.__dataclass_fields__ \
            else self.extra.get(name)


@dataclass
class ControllerEvent(Record):
    """One event of the controller's life during a run (died, taken over, restart failed)."""

    event: str
    t: float | None = None
    cause: str | None = optional()
    pid: int | None = optional()
    outage_s: float | None = optional()
    switches_read: int | None = optional()
    flows_read: int | None = optional()
    groups_read: int | None = optional()
    changes: dict[str, int] | None = optional()
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ControllerSummary(Record):
    """The controller at the end of the workload: its routing, CPU, links down, events."""

    routing: str | None = None
    cpu_s: float | None = None
    links_down: list[str] = field(default_factory=list)
    adaptive: dict[str, Any] | None = None
    events: list[ControllerEvent] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class IdlePct(Record):
    """The machine's idle CPU over the run, in per cent."""

    median: float | None = None
    min: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Fidelity(Record):
    """Whether the emulator kept up: the verdict (``ok``, ``degraded``) and why."""

    verdict: str
    samples: int = 0
    idle_pct: IdlePct = field(default_factory=IdlePct)
    reasons: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Iteration(Record):
    """One training iteration as measured (:func:`fabriclab.model.results.iteration_times`)."""

    job: int
    iteration: int
    time_s: float
    compute_s: float | None = optional()
    comm_s: float | None = optional()
    exposed_comm_s: float | None = optional()
    overlap_fraction: float | None = optional()
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class JobResult(Record):
    """A named job among several: its time together and alone, its slowdown, the
    prediction's, and the links it shared."""

    name: str
    hosts: list[str] = field(default_factory=list)
    time_s: float | None = None
    alone_s: float | None = None
    slowdown: float | None = None
    predicted_s: float | None = None
    predicted_alone_s: float | None = None
    predicted_slowdown: float | None = None
    shared_links: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class FailureApplied(Record):
    """A link failure, repair or degradation as applied, with the throughput around it and,
    for a failure or degradation, how long the traffic offered to its ports took to fit
    (``move_off``: ``rates_mbps``, ``ms`` (None where it never did), ``window_ms``, the
    resolution, ``averaged_ms`` (over ``averaged_window_ms``) and ``packet_bytes`` per switch
    port), and what the eBPF switches' fault
    notices did in its first 2 s (``notices``: ``ms`` after it, ``switch``, ``group``,
    ``ports_out``; an empty list: the group whole again)."""

    action: str
    target: str | list[str]
    at_s: float | None = None
    applied_s: float | None = None
    took_s: float | None = None
    links: int | None = None
    errors: list[str] = field(default_factory=list)
    throughput: dict[str, Any] | None = None
    cut_drops: int | None = optional()
    rate_factor: float | None = optional()
    move_off: dict[str, Any] | None = optional()
    notices: list[dict[str, Any]] | None = optional()
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def link(self) -> str:
        """The target as a link's name (``leaf1-spine1``) or a switch's."""
        return "-".join(self.target) if isinstance(self.target, list) else str(self.target)


@dataclass
class TelemetrySummary(Record):
    """Where the exporters and the run's Prometheus data are."""

    targets: Any = None
    fabric_scrape_s: float | None = None
    prometheus: str | None = optional()
    data: str | None = optional()
    scrape_interval_s: float | None = optional()
    errors: list[str] | None = optional()
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class RealScale(Record):
    """The real fabric the emulated one stands for (``scale``), and the ratios between them."""

    real_rate_gbps: float
    real_rtt_us: float
    rate_ratio: float
    time_ratio: float
    size_ratio: float
    emulated_rate_mbps: float | None = None
    emulated_rtt_ms: float | None = None
    scales: str = ""
    does_not_scale: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class TimeScaleSummary(Record):
    """The time scale a run was built with (``emulator.time_scale``): N, whether ``auto`` chose
    it and the bounds it weighed, the real fabric's host rate, base RTT and BDP and the
    emulated ones (:meth:`fabriclab.model.timescale.TimeScale.to_json`)."""

    n: float
    auto: bool = False
    bounds: list[dict[str, Any]] = field(default_factory=list)
    real: dict[str, Any] = field(default_factory=dict)
    emulated: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class RankRun(Record):
    """One rank of a program: its host, exit code (None: ended before it exited), when it
    ended and how (``exited``, ``timed out``, ``ended``: by another rank's failure or an
    interrupt)."""

    rank: int
    host: str
    exit_code: int | None = None
    end_unix_s: float | None = None
    time_s: float | None = None
    ended: str = "exited"
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ProgramRun(Record):
    """The user's program as it ran (``workload.program``): what, where, for how long."""

    argv: list[str]
    world_size: int
    per_host: int
    hosts: list[str]
    started_unix_s: float
    time_s: float
    ranks: list[RankRun] = field(default_factory=list)
    error: str | None = optional()
    #: lines of rank 0's that started ``#fabriclab`` but could not be read, and why
    unread: list[str] | None = optional()
    #: bytes each switch port sent during the program, as ``node->peer``
    links: dict[str, int] | None = optional()
    #: the iterations it reported (``#fabriclab iteration=N time_s=S``): N -> seconds
    iterations: dict[str, float] | None = optional()
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Provenance(Record):
    """What a run ran on, to reproduce it: the run seed, the datapath and why it was chosen,
    the TCP congestion controls the sockets ran (read back from them), the hosts' sysctls
    and what tc holds at each kind of link end as applied, and the software's versions."""

    seed: int = 1
    datapath: str = ""
    datapath_why: str = ""
    tcp_congestion_control: list[str] = field(default_factory=list)
    host_sysctls: dict[str, str] = field(default_factory=dict)
    qdiscs: dict[str, str] = field(default_factory=dict)
    software: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunDocument(Record):
    """A run's ``results.json``: complete, or failed with what it measured and why."""

    TITLE: ClassVar[str] = "fabriclab's results.json: one run of an experiment"
    experiment: str = ""
    source: str = ""
    complete: bool = False
    started: str = ""
    fabric: FabricSummary = field(default_factory=FabricSummary)
    collectives: list[CollectiveRow] = field(default_factory=list)
    version: int = 1
    prediction: Prediction | None = optional()
    experiment_sha256: str | None = optional()
    fabric_reused: bool | None = optional()
    congestion: Congestion | None = optional()
    controller: ControllerSummary | None = optional()
    fidelity: Fidelity | None = optional()
    timings_s: dict[str, float] | None = optional()
    error: str | None = optional()
    iterations: list[Iteration] | None = optional()
    telemetry: TelemetrySummary | None = optional()
    cluster: dict[str, Any] | None = optional()
    failures: list[FailureApplied] | None = optional()
    jobs: list[JobResult] | None = optional()
    real_scale: RealScale | None = optional()
    time_scale: TimeScaleSummary | None = optional()
    replay: dict[str, Any] | None = optional()
    machine: str | None = optional()  # a sweep cell run on a cluster's machine: which
    program: ProgramRun | None = optional()
    provenance: Provenance | None = optional()
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def fidelity_verdict(self) -> str | None:
        return self.fidelity.verdict if self.fidelity else None

    def job_rows(self, job: int) -> list[CollectiveRow]:
        return [r for r in self.collectives if r.job == job]


#: where the schema is published, in the fabriclab package (``python -m
#: tests.unit.test_document`` writes it anew; a unit test checks it is current)
SCHEMA_FILE = "schema/results.schema.json"


def json_schema() -> dict:
    """results.json's JSON Schema, as generated from :class:`RunDocument`'s types (the file
    ``fabriclab/schema/results.schema.json`` is this, kept current by a unit test)."""
    schema = RunDocument.json_schema()
    return {"$schema": schema.pop("$schema"),
            "$id": f"https://fabriclab.dev/schema/results-v{VERSION}.json",
            "title": f"fabriclab results.json, version {VERSION}",
            **schema}


def read(data: Any) -> RunDocument:
    """A results document as JSON gave it, typed; any version fabriclab wrote.

    Raises:
        DocumentError: not a results document (the field that is wrong named).
    """
    if not isinstance(data, dict):
        raise DocumentError("", "a results document is a JSON object")
    version = data.get("version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise DocumentError("version", f"expected a positive integer, got {version!r}")
    return RunDocument.from_json(upgrade(data))


#: results.json before one set of units (NCCL-tests': us and GB/s): old field -> new, factor
_OLD_UNITS = {"duration_s": ("time_us", 1e6), "algbw_gbps": ("algbw_GBps", 1 / 8),
              "busbw_gbps": ("busbw_GBps", 1 / 8), "busbw_mbps": ("busbw_GBps", 1 / 8000)}


def upgrade(doc):
    """A results, variants or sweep document written before the units were NCCL-tests' (rows
    with ``duration_s``, ``*_gbps``, ``busbw_mbps``) or before version 3 (``flow_completion_s``,
    now ``flow_end_s``), in today's fields: runs made before still report, compare and resume.
    Anything else is returned as it is."""
    if isinstance(doc, dict):
        if isinstance(doc.get("flow_completion_s"), dict) and "flow_end_s" not in doc:
            doc["flow_end_s"] = doc.pop("flow_completion_s")  # before version 3
        for old, (new, factor) in _OLD_UNITS.items():
            if isinstance(doc.get(old), (int, float)) and new not in doc and (
                    old != "duration_s" or "bytes" in doc):  # a collective's, not a VM run's
                doc[new] = doc.pop(old) * factor
        for value in doc.values():
            upgrade(value)
    elif isinstance(doc, list):
        for item in doc:
            upgrade(item)
    return doc

