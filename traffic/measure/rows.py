"""A measured collective as ``results.json`` holds it, typed (pure): its NCCL-tests figures,
its place in its job, its transport's counters and its prediction
(:class:`fabriclab.model.document.RunDocument` holds the rows; the exporters read them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from testbed.model.records import Record, optional


@dataclass
class FlowCompletion(Record):
    """One figure over a collective's transfers: p50, p99 and max (``flow_end_s``: when they
    ended, in seconds from the collective's start; ``fct_s``: each one's completion time, from
    its own start; ``slowdown``: FCT over its ideal on the idle fabric)."""

    p50: float | None = None
    p99: float | None = None
    max: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class TransportCounters(Record):
    """A collective's transport and its counters summed over the ranks (the UDP transports'
    counters; TCP's from TCP_INFO)."""

    TITLE: ClassVar[str] = "the transport of a collective and its counters over all ranks"
    transport: str = "tcp"
    goodput_ratio: float | None = None
    tx_retransmitted: int = 0
    tx_timeouts: int = 0
    tx_trim_naks: int = 0
    tx_credit_stalls: int = 0
    tx_grants: int = 0
    rx_lost: int = 0
    tx_naks: int = 0
    tx_cnps: int = 0
    tx_rate_cuts: int = 0
    delivery: str | None = optional()
    rccc: bool | None = optional()
    nscc: bool | None = optional()
    congestion_control: str | None = optional()
    dcqcn: str | None = optional()
    constants: str | None = optional()
    engine: str | None = optional()  # the agents' engine: native (compiled) or python
    rtt_min_us: float | None = optional()  # the least round trip a sender saw (any rank)
    # the least, over the senders' peers, of the round trip measured over its path's unloaded
    # one (a time-scaled fabric's agents know the latter)
    rtt_min_ratio: float | None = optional()
    # a time-scaled fabric's pings before the job: their round trips less the links' latency
    # (what the host stacks, the agents and their delay line add), the least and the most
    probe_excess_min_us: float | None = optional()
    probe_excess_max_us: float | None = optional()
    # how late the agents sent paced packets (tx) and released delayed ones (rx) against their
    # schedule: counts per bucket (traffic.transports.delayline)
    lateness_us: dict[str, dict[str, int]] | None = optional()
    extra: dict[str, Any] = field(default_factory=dict)

    def counter(self, name: str) -> int:
        """A counter by name (0 when this transport has none of it)."""
        value = getattr(self, name, None)
        if value is None:
            value = self.extra.get(name, 0)
        return value or 0

    @property
    def label(self) -> str:
        """``uet RUD+RCCC``, ``uet ROD, no NSCC``, ``rocev2 HPCC``, ``rocev2 DCQCN (connectx)``,
        ``tcp cubic``."""
        if self.transport == "uet":
            return (f"uet {str(self.delivery or 'rud').upper()}" + ("+RCCC" if self.rccc else "")
                    + ("" if self.nscc in (None, True) else ", no NSCC"))
        if self.transport == "tcp":  # the congestion control the sockets ran, read back
            return f"tcp {self.congestion_control}" if self.congestion_control else "tcp"
        cc = self.congestion_control or ("dcqcn" if self.dcqcn else "off")
        return f"rocev2 {cc.upper()}" + (f" ({self.dcqcn})" if cc == "dcqcn" and self.dcqcn
                                         else "")


@dataclass
class RealFigures(Record):
    """A collective's figures in the real fabric's units (``scale``)."""

    bytes: int
    time_us: float
    algbw_GBps: float  # noqa: N815
    busbw_GBps: float  # noqa: N815
    flow_end_s: FlowCompletion = field(default_factory=FlowCompletion)
    fct_s: FlowCompletion = field(default_factory=FlowCompletion)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class CollectiveRow(Record):
    """One collective as run: what it measured (NCCL-tests' units), where it sat in its job,
    and its prediction."""

    TITLE: ClassVar[str] = "one measured collective"
    op: str
    bytes: int
    time_us: float
    algbw_GBps: float  # noqa: N815
    busbw_GBps: float  # noqa: N815
    efficiency: float
    job: int = 0
    repetition: int = 0
    algorithm: str = ""
    ranks: list[str] = field(default_factory=list)
    ideal_s: float = 0.0
    concurrent_jobs: int = 1
    flow_end_s: FlowCompletion = field(default_factory=FlowCompletion)
    fct_s: FlowCompletion = field(default_factory=FlowCompletion)
    slowdown: FlowCompletion = field(default_factory=FlowCompletion)
    label: str = ""
    agent_cpu_s: float = 0.0
    agent_user_cpu_s: float = 0.0  # of agent_cpu_s, in user space
    gap_s: float = 0.0
    communicator_size: int = 0
    iteration: int | None = None
    transport: TransportCounters | None = None
    scale_out_bytes: int | None = None
    moved_bytes: int | None = None
    throughput_of_ideal: float | None = None
    start_unix_s: float = 0.0
    start_skew_s: float = 0.0
    released_unix_s: float | None = None
    compute_s: float | None = None
    ready_unix_s: float | None = None
    barrier: bool = True
    predicted_s: float | None = optional()
    predicted_hashed_s: float | None = optional()
    job_name: str | None = optional()
    real: RealFigures | None = optional()
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """Its label (``fwd tp all_reduce``), else its operation (``all_reduce``)."""
        return self.label or self.op

    @property
    def end_unix_s(self) -> float:
        return self.start_unix_s + self.time_us / 1e6
