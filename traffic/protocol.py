"""Pure, typed contract between the runner and its agents, as JSON files and lines.

The runner writes an :class:`AgentSpec` (``SPEC.json``) that every agent of a job reads; each
agent prints one :class:`AgentReport` on stdout. Both sides use these classes, so a field is
named once and a malformed document fails with the field it lacks.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from traffic.workloads.schedules import Transfer


@dataclass(frozen=True)
class RankSpec:
    """Rank ``i`` of a job is ``ranks[i]``: its host and that host's address; on a multi-plane
    fabric also its NICs' addresses on planes 2, 3, ... and its server (1-based; 0: none)."""

    host: str
    ip: str
    planes: tuple[str, ...] = ()
    server: int = 0

    def same_server(self, other: RankSpec) -> bool:
        """Whether ``other`` is a GPU of this GPU's server (its scale-up domain joins them)."""
        return bool(self.server) and self.server == other.server

    def address_for(self, sender: RankSpec, channel: int) -> str:
        """Where ``sender``'s connection (or queue pair) ``channel`` to this rank goes: the
        planes in turn (channel ``c`` on plane ``c % planes + 1``: NCCL spreads its channels
        over a NIC's ports), except from a GPU of the same server (its scale-up domain
        carries that, to the plane-1 address)."""
        if not self.planes or self.same_server(sender):
            return self.ip
        addresses = (self.ip, *self.planes)
        return addresses[channel % len(addresses)]


@dataclass(frozen=True)
class CollectiveSpec:
    """One collective as an agent runs it: the compute gap before it, then its transfers.
    ``gaps``: each rank's own gap (stragglers, jitter; None: ``gap_s`` for all); ``barrier``
    False: no barrier first, and the gap counts from the last barrier (an overlapped
    gradient bucket's release), not from the previous collective's end."""

    op: str
    gap_s: float
    transfers: tuple[Transfer, ...]
    gaps: tuple[float, ...] | None = None
    barrier: bool = True

    def gap_for(self, rank: int) -> float:
        return self.gaps[rank] if self.gaps is not None else self.gap_s


@dataclass(frozen=True)
class AgentSpec:
    """One job: what every agent of it reads.

    ``port`` is where every agent listens (on its own address), ``connections`` the sockets per
    peer (NCCL channels), ``start_at`` a wall-clock time shared by all agents (one machine, one
    clock), ``barrier`` whether each collective waits for every rank first,
    ``congestion_control`` the TCP congestion control of the data sockets (None: the kernel's,
    and cubic inside a server's scale-up domain: :data:`traffic.agents.agent.SCALE_UP_CONGESTION`),
    ``dscp`` the DSCP they mark their packets with.
    """

    port: int
    connections: int
    start_at: float
    ranks: tuple[RankSpec, ...]
    collectives: tuple[CollectiveSpec, ...]
    barrier: bool = True
    congestion_control: str | None = None
    dscp: int = 0
    transport: str = "tcp"  # tcp, rocev2 or uet (traffic.transports)
    spray: bool | None = None  # UDP transports: spread packets over entropies (None: default)
    scale: dict | None = None  # UDP transports: rate_bps, base_rtt_s, mss of the fabric
    dcqcn: str = "paper"  # rocev2: DCQCN's profile
    transport_options: dict | None = None  # traffic.transports.options.TransportOptions
    seed: str | None = None  # the data connections' source ports derive from it (None: the
    # kernel's choice)

    def rank_of(self, host: str) -> int:
        for i, rank in enumerate(self.ranks):
            if rank.host == host:
                return i
        raise ValueError(f"{host} is not a rank of this job")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> AgentSpec:
        d = json.loads(text)
        return cls(d["port"], d["connections"], d["start_at"],
                   tuple(RankSpec(**{**r, "planes": tuple(r.get("planes", ()))})
                         for r in d["ranks"]),
                   tuple(CollectiveSpec(c["op"], c["gap_s"],
                                        tuple(Transfer(**t) for t in c["transfers"]),
                                        tuple(c["gaps"]) if c.get("gaps") is not None
                                        else None, c.get("barrier", True))
                         for c in d["collectives"]),
                   d.get("barrier", True), d.get("congestion_control"), d.get("dscp", 0),
                   d.get("transport", "tcp"), d.get("spray"), d.get("scale"),
                   d.get("dcqcn", "paper"), d.get("transport_options"), d.get("seed"))


@dataclass(frozen=True)
class FlowTiming:
    """A transfer an agent received, and when its last byte arrived (wall clock)."""

    src: int
    dst: int
    step: int
    bytes: int
    done: float


@dataclass(frozen=True)
class SendTiming:
    """A transfer an agent sent: when it handed the first byte to its connections (wall
    clock), and the retransmissions on them from then to the next transfer to the same peer
    (or to the next collective's start; TCP: ``TCP_INFO``, the UDP transports' own)."""

    src: int
    dst: int
    step: int
    bytes: int
    start: float
    retransmitted: int | None = None


@dataclass(frozen=True)
class CollectiveTiming:
    """One rank's view of one collective: when it started and ended, its receives and its
    sends."""

    index: int
    start: float
    end: float
    flows: tuple[FlowTiming, ...]
    transport: dict | None = None  # this rank's transport counters in it (TCP: TCP_INFO)
    released: float | None = None  # when the rank left the barrier its gap counts from
    sends: tuple[SendTiming, ...] = ()


@dataclass(frozen=True)
class Connection:
    """One connection a rank sent on, as its data packets' headers name it: the 5-tuple an
    ECMP switch hashes (a TCP connection, or a UDP transport's queue pair that does not
    spray)."""

    src: int  # the sending rank
    dst: int
    channel: int
    src_ip: str
    sport: int
    dst_ip: str
    dport: int
    protocol: int = 6  # TCP; 17: a UDP transport's queue pair that keeps one source port

    @property
    def five_tuple(self) -> tuple[str, str, int, int, int]:
        """(source, destination, protocol, source port, destination port)."""
        return (self.src_ip, self.dst_ip, self.protocol, self.sport, self.dport)


@dataclass(frozen=True)
class AgentReport:
    """What an agent prints when its job is done."""

    rank: int
    host: str
    collectives: tuple[CollectiveTiming, ...]
    cpu_s: float = 0.0
    connections: tuple[Connection, ...] = ()  # the TCP connections it sent on
    user_cpu_s: float = 0.0  # of cpu_s, in user space (the rest in the kernel: its system
    # calls and the fabric's forwarding of what it sent, which runs in them)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> AgentReport:
        d = json.loads(text)
        return cls(d["rank"], d["host"],
                   tuple(CollectiveTiming(c["index"], c["start"], c["end"],
                                          tuple(FlowTiming(**f) for f in c["flows"]),
                                          c.get("transport"), c.get("released"),
                                          tuple(SendTiming(**t) for t in c.get("sends", ())))
                         for c in d["collectives"]),
                   d.get("cpu_s", 0.0),
                   tuple(Connection(**c) for c in d.get("connections", ())),
                   d.get("user_cpu_s", 0.0))
