"""Pure, typed description of a testbed: the fabric, its controller and how this machine emulates
it. Every default lives here, once; the experiment layer (:mod:`fabriclab.model.experiment`) fills these
from an experiment file and :class:`testbed.fabric.fabric.Fabric` builds from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property

import networkx as nx

from testbed.errors import ConfigError
from testbed.model.builders import fat_tree, leaf_spine, ring
from testbed.model.custom import custom
from testbed.model.congestion import (
    EcnSpec,
    EcnThresholds,
    PfcSpec,
    PfcThresholds,
    TrafficClasses,
    base_rtt_s,
    resolve_ecn,
    resolve_pfc,
)
from testbed.plan.trim import TrimSpec
from testbed.model.servers import ServerSpec, place_servers, rail_optimized
from testbed.model.topology import Topology, feeds

DEFAULT_RATE_MBPS = 10.0
DEFAULT_QUEUE_KB = 256
DEFAULT_MTU = 9000
DEFAULT_READY_TIMEOUT_S = 60.0


class Routing(StrEnum):
    """How the controller forwards between access switches (see :mod:`controllers.routing.policy`)."""

    ECMP = "ecmp"  # per-flow hash over the equal-cost paths
    DMODK = "dmodk"  # destination-based static up-port choice (InfiniBand's D-mod-k)
    SPRAY = "spray"  # the switch side of packet spraying: weighted groups hashing the entropy
    ADAPTIVE = "adaptive"  # load-aware: elephants placed by Global First Fit (Hedera), WCMP
    # the switches choose ports by load, per flowlet or packet (eBPF: testbed.plan.localroute)
    LOCAL_ADAPTIVE = "local_adaptive"


class Granularity(StrEnum):
    """What a switch-local choice moves: a flowlet (packets after an idle gap) or a packet."""

    FLOWLET = "flowlet"
    PACKET = "packet"


class Load(StrEnum):
    """What a switch-local choice weighs: its ports' queues, or also the next switches' path
    qualities (global load balancing: :mod:`testbed.plan.lookahead`)."""
    LOCAL = "local"
    NEXT_SWITCH = "next_switch"


class SprayWeights(StrEnum):
    """Bucket weights of the spray mode's groups."""

    CAPACITY = "capacity"  # each port's share of the capacity towards the destination
    EQUAL = "equal"  # every live port alike (blind spraying)


class EcmpSeed(StrEnum):
    """The ECMP hash basis: one per switch, or the same everywhere (hash polarization)."""

    PER_SWITCH = "per_switch"
    SHARED = "shared"


class EcmpSelection(StrEnum):
    """How a switch picks an ECMP bucket (both hash the 5-tuple with the switch's basis)."""

    HASH = "hash"  # Open vSwitch's selection_method=hash: in the slow path, once per 5-tuple
    DP_HASH = "dp_hash"  # the datapath's hash and a recirculation: no upcall per new 5-tuple


class Fidelity(StrEnum):
    """What to do with a fabric whose full load exceeds this machine's forwarding budget."""

    STRICT = "strict"
    WARN = "warn"
    OFF = "off"


class Backend(StrEnum):
    """Where a fabric runs: this machine's kernel, a full-kernel guest, or whichever suffices."""

    AUTO = "auto"
    HOST = "host"
    VM = "vm"


#: The shape parameters of each topology kind (the experiment file's ``fabric`` keys).
SHAPE_KEYS = {"fat_tree": ("k",), "leaf_spine": ("leaves", "spines", "hosts_per_leaf"),
              "ring": ("leaves", "hosts_per_leaf"), "rail_optimized": ("spines",),
              "custom": ("nodes", "links")}
#: optional shape keys, by topology
OPTIONAL_SHAPE_KEYS = {"rail_optimized": ("servers_per_leaf", "planes")}


class Datapath(StrEnum):
    """What forwards at the switches: Open vSwitch (its kernel datapath where the module is
    loaded, else private userspace vswitchds), or fabriclab's eBPF switch (a tc program on the
    switch's ports and its maps, programmed over OpenFlow by its agent)."""

    OVS = "ovs"
    EBPF = "ebpf"
    AUTO = "auto"  # the fastest this machine has that does what the experiment asks


class EcnMarker(StrEnum):
    """What marks ECN at the switch ports: the kernel's RED qdisc (where it has one: the vm
    guest), the eBPF marker's virtual queue (anywhere), or whichever is more faithful (RED,
    which sees the real backlog)."""

    AUTO = "auto"
    EBPF = "ebpf"
    RED = "red"


class TcpCongestion(StrEnum):
    """TCP congestion control a workload's senders use (per socket, ``TCP_CONGESTION``)."""

    CUBIC = "cubic"
    RENO = "reno"
    BBR = "bbr"
    DCTCP = "dctcp"


@dataclass(frozen=True)
class Requirement:
    """Something of the machine's kernel a setting needs: a qdisc, or a TCP congestion control."""

    field: str  # the experiment field that needs it
    kind: str  # "qdisc" or "tcp_cc"
    name: str


PROB_PPM = 1_000_000  # the eBPF program's probability scale


@dataclass(frozen=True)
class ImpairSpec:
    """Bit errors on a link (``fabric.*_link.impair``): each frame of L bytes is corrupted with
    probability ``ber`` x 8L, at each end of the link, and dropped on arrival (a bad FCS);
    with ``llr`` the sending port replays it (link-level retry: nothing lost end to end)."""

    ber: float
    llr: bool = False

    def check(self, path: str) -> ImpairSpec:
        if not 0 < self.ber <= 1e-3:
            raise ConfigError(f"{path}.ber", f"{self.ber:g}: a bit-error rate is over 0 and at "
                                             "most 1e-3 (beyond, most frames are corrupted)")
        return self

    def frame_error(self, frame_bytes: int) -> float:
        """The chance a frame of ``frame_bytes`` is corrupted (as the eBPF program draws it)."""
        return min(1.0, self.ber * 8 * frame_bytes)

    @property
    def ber_fe(self) -> int:
        """The rate as the eBPF program holds it: x 1e15, at least 1."""
        return max(1, int(round(self.ber * 1e15)))

    def outcome(self, frame_bytes: int, draw: int) -> str:
        """What the eBPF program does with a frame, given its random ``draw`` (0..999,999, the
        program's ``bpf_get_prandom_u32() % 1,000,000``): ``clean``; ``corrupted`` (sent
        marked, dropped on arrival); ``replayed`` (LLR: its corrupted copy first, then it)."""
        ppm = min(PROB_PPM, self.ber_fe * 8 * frame_bytes // 1_000_000_000)
        if draw >= ppm:
            return "clean"
        return "replayed" if self.llr else "corrupted"


@dataclass(frozen=True)
class LinkSpec:
    """One link class (host links or fabric links); ``ecn`` marks at the switch ports' egress."""

    rate_mbps: float = DEFAULT_RATE_MBPS
    delay_us: float = 0.0
    loss_percent: float = 0.0
    ecn: tuple[EcnSpec, ...] = ()
    trim: TrimSpec | None = None  # packet trimming at the switch ports' egress
    impair: ImpairSpec | None = None  # bit errors (and link-level retry)

    def describe(self) -> str:
        """``10 Mbit/s 100 us 1 % loss``."""
        text = f"{self.rate_mbps:g} Mbit/s"
        if self.delay_us:
            text += f" {self.delay_us:g} us"
        if self.loss_percent:
            text += f" {self.loss_percent:g} % loss"
        if self.impair:
            text += f" BER {self.impair.ber:g}" + (" with LLR" if self.impair.llr else "")
        return text


@dataclass(frozen=True)
class FabricSpec:
    """What the fabric is: its shape, links and queues."""

    topology: str
    shape: dict
    host_link: LinkSpec = field(default_factory=LinkSpec)
    fabric_link: LinkSpec = field(default_factory=LinkSpec)
    queue_kb: int | None = DEFAULT_QUEUE_KB
    queue_packets: int | None = None
    mtu: int = DEFAULT_MTU
    traffic_classes: TrafficClasses = field(default_factory=TrafficClasses)
    host_ecn: bool = False  # hosts' TCP asks for ECN (net.ipv4.tcp_ecn = 1 in each namespace)
    host_rmem_max_kb: int | None = None  # hosts' TCP receive buffer limit (net.ipv4.tcp_rmem[2])
    host_offload_segments: int | None = None  # hosts' NICs' gso_max_segs (None: the kernel's)
    acks_first: bool = False  # switch ports serve TCP's pure acknowledgements first, too
    pfc: PfcSpec = field(default_factory=PfcSpec)
    servers: ServerSpec | None = None  # servers of GPUs (the hosts are their GPUs)
    int_telemetry: bool = False  # the ports stamp INT on packets that ask (a job uses HPCC)
    # where the links' delay is added: "link" (a netem leaf on every link), "agents" (the
    # UDP transports' agents hold each packet they receive for its path's one-way delay) or
    # "hosts" (a relay holds every IPv4 packet a host receives so: testbed.plan.hostdelay)
    delay_line: str = "link"

    def link_delay_us(self, tier: str) -> float:
        """The delay a link of ``tier`` adds itself (none when the agents add it)."""
        return self.link(tier).delay_us if self.delay_line == "link" else 0.0

    def host_sysctls(self, machine_tcp_rmem: str) -> dict[str, str]:
        """The transport settings every host's namespace gets; ``machine_tcp_rmem``: the
        machine's ``net.ipv4.tcp_rmem`` (min, default, max), whose first two values a receive
        buffer limit keeps (the default lowered to the limit where it is above)."""
        out = {"net.ipv4.tcp_ecn": "1"} if self.host_ecn else {}
        if self.host_rmem_max_kb is not None:
            low, default, _max = (int(v) for v in machine_tcp_rmem.split())
            limit = self.host_rmem_max_kb * 1024
            out["net.ipv4.tcp_rmem"] = f"{min(low, limit)} {min(default, limit)} {limit}"
        return out

    def priorities(self) -> tuple[int, ...]:
        """The traffic classes in use: 0 (unlisted DSCP), the mapped ones and the lossless
        ones. More than one gives every link end one HTB class per priority."""
        return tuple(sorted({0, *self.traffic_classes.dscp_to_priority.values(),
                             *self.pfc.priorities}))

    @property
    def needs_marker(self) -> bool:
        """Whether the eBPF program runs at the ports: to mark ECN, to steer packets into
        per-priority classes (and count them for PFC), to drop a link's random loss, to trim
        or to stamp INT."""
        return (self.marks_ecn or len(self.priorities()) > 1 or self.int_telemetry
                or any(self.link(t).loss_percent or self.link(t).trim or self.link(t).impair
                       for t in ("host", "fabric")))

    @property
    def marks_ecn(self) -> bool:
        """Whether any switch port marks ECN (the marker is attached to every switch port)."""
        return any(e.mode != "off" for tier in ("host", "fabric") for e in self.link(tier).ecn)

    def link(self, tier: str) -> LinkSpec:
        """The settings of a link tier (``host`` or ``fabric``)."""
        return self.host_link if tier == "host" else self.fabric_link

    def queue_text(self) -> str:
        return f"{self.queue_packets} packets" if self.queue_packets else f"{self.queue_kb} KiB"


@dataclass(frozen=True)
class ControllerSpec:
    """How the controller routes: fabriclab's own (``routing`` and the rest), a user's os-ken
    app run in the controller process instead (``app``: a Python file), or a controller the
    user runs (``remote``: ``host:port``, nothing started)."""

    routing: Routing = Routing.ECMP
    ecmp_seed: EcmpSeed = EcmpSeed.PER_SWITCH
    ecmp_selection: EcmpSelection = EcmpSelection.HASH
    spray_weights: SprayWeights = SprayWeights.CAPACITY
    poll_interval_s: float = 1.0  # adaptive: the statistics interval
    granularity: Granularity = Granularity.FLOWLET  # local_adaptive: flowlet or packet
    flowlet_gap_us: float = 0.0  # local_adaptive flowlets' gap (0: the fabric's base RTT)
    load: Load = Load.LOCAL  # local_adaptive: what a switch weighs (its ports, the next switch)
    rebalance: tuple[int, int] = (0, 0)  # flowlets' (quality delta, chance) %; (0, 0): off
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S
    restart: bool = False  # a dead controller is replaced (warm) instead of failing the run
    #: OpenFlow over TLS with the run's own certificates; None: wherever the datapath can
    #: (else a unix socket of the run's); False: plain TCP on the listen address
    tls: bool | None = None
    app: str = ""  # a user's os-ken app (the path of a Python file) instead of the routing
    remote: str = ""  # host:port of a controller the user runs
    settle_s: float = 2.0  # app or remote: every flow table unchanged this long is "ready"

    @property
    def own(self) -> bool:
        """Whether fabriclab's own routing controls the switches (not an app or remote)."""
        return not (self.app or self.remote)

    @property
    def remote_address(self) -> tuple[str, int] | None:
        """``remote`` as (host, port), or None."""
        if not self.remote:
            return None
        host, _, port = self.remote.rpartition(":")
        return host.strip("[]"), int(port)

    @property
    def kind(self) -> str:
        """What controls the switches, for people: ``fabriclab (ecmp)``, ``app shortest_path.py``
        or ``remote 10.0.0.5:6653``."""
        if self.app:
            return f"app {self.app.rsplit('/', 1)[-1]}"
        if self.remote:
            return f"remote {self.remote}"
        if self.routing == Routing.LOCAL_ADAPTIVE:
            return f"fabriclab ({self.routing}, {self.granularity}" + (
                ", next switch)" if self.load == Load.NEXT_SWITCH else ")")
        return f"fabriclab ({self.routing})"


@dataclass(frozen=True)
class EmulatorSpec:
    """How the machine emulates the fabric (not what the fabric is)."""

    vswitchd_instances: int | str = "auto"  # private Open vSwitch instances (userspace datapath)
    fidelity: Fidelity = Fidelity.STRICT
    backend: Backend = Backend.AUTO
    ovs_other_config: dict = field(default_factory=dict)  # extra Open_vSwitch other_config
    queue_sample_ms: float = 50.0  # switch queues sampled during a workload (0: not at all)
    ecn_marker: EcnMarker = EcnMarker.AUTO
    datapath: Datapath = Datapath.AUTO  # resolved when the fabric is built
    #: the eBPF switches tell each other the destinations they stranded
    #: (:mod:`testbed.plan.notices`); Open vSwitch has no such notices
    fault_notices: bool = True


@dataclass(frozen=True)
class ClusterSpec:
    """The Ray cluster a fabric is partitioned over (the experiment's ``cluster`` section, or
    ``--cluster``): its head's ``host:port``, and how many machines it must have (None: as
    many as it has)."""

    address: str
    machines: int | None = None


@dataclass(frozen=True, kw_only=True)
class TestbedSpec:
    """Everything needed to build a fabric on a machine."""

    __test__ = False  # not a pytest test class

    fabric: FabricSpec
    controller: ControllerSpec = field(default_factory=ControllerSpec)
    emulator: EmulatorSpec = field(default_factory=EmulatorSpec)

    @cached_property
    def topology(self) -> Topology:
        """The topology model (model errors come back under ``fabric.``)."""
        return build_topology(self.fabric)

    def plans_failures(self) -> bool:
        """Whether links or switches fail while it runs (an experiment's ``failures``)."""
        return False

    def requirements(self) -> list[Requirement]:
        """What every setting needs of the machine's kernel (an experiment adds its workload's)."""
        q = lambda path, kind: Requirement(path, "qdisc", kind)  # noqa: E731
        needs = [q("fabric", "htb"), q("fabric.queue", "pfifo" if self.fabric.queue_packets
                                       else "bfifo")]
        for tier in ("host", "fabric"):
            link = self.fabric.link(tier)
            if self.fabric.link_delay_us(tier):
                needs.append(q(f"fabric.{tier}_link.delay_us", "netem"))
            if link.loss_percent:  # dropped by the eBPF program at the link's ends
                needs.append(q(f"fabric.{tier}_link.loss_percent", "clsact"))
            if link.impair:  # corrupted and dropped by it too
                needs.append(q(f"fabric.{tier}_link.impair", "clsact"))
            if any(e.mode != "off" for e in link.ecn):
                needs.append(q(f"fabric.{tier}_link.ecn", "clsact"))
        if self.emulator.ecn_marker == EcnMarker.RED and self.fabric.marks_ecn:
            needs.append(q("emulator.ecn_marker", "red"))
        if len(self.fabric.priorities()) > 1:
            needs.append(q("fabric.traffic_classes", "clsact"))
        if self.fabric.pfc.priorities:
            needs.append(q("fabric.pfc", "tbf"))
        if self.fabric.delay_line == "hosts":  # the NICs' ingress turned to the relay
            needs.append(q("emulator.delay_line", "clsact"))
        return needs

    @cached_property
    def pfc(self) -> PfcThresholds | None:
        """The PFC thresholds (None without lossless priorities); the headroom is checked
        against each switch port's fan-in."""
        fab = self.fabric
        if not fab.pfc.priorities:
            return None
        for tier in ("host", "fabric"):
            if fab.link_delay_us(tier):
                raise ConfigError("fabric.pfc", f"a lossless class cannot share the "
                                  f"{tier} links' netem delay (their leaf is netem)")
        if fab.queue_packets:
            raise ConfigError("fabric.pfc", "lossless classes need a queue sized in bytes "
                                            "(fabric.queue.size_kb), not size_packets")
        topo = self.topology
        fan_in = {}
        for node in topo.switches:
            links = list(topo.ports(node.name).values())
            for link in links:
                fan_in[link.end(node.name).ifname] = [
                    (other.rate_mbps, fab.link(other.tier).delay_us)
                    for other in links if feeds(topo, node.name, other, link)]
        return resolve_pfc(fab.pfc, fan_in, int((fab.queue_kb or 0) * 1024), fab.mtu)

    @cached_property
    def base_rtt_s(self) -> float:
        """The unloaded round trip of the fabric's longest host-to-host path (the scale of the
        ECN defaults)."""
        topo = self.topology
        first = topo.hosts[0].name
        simple = nx.Graph()  # (converting the multigraph copied every edge's attributes)
        simple.add_edges_from(topo.graph.edges())
        paths = nx.single_source_shortest_path(simple, first)
        far = max((p for n, p in paths.items() if not topo.nodes[n].is_switch),
                  key=len)
        links = [topo.find_link(a, b) for a, b in zip(far, far[1:])]
        return base_rtt_s([l.rate_mbps for l in links],
                          [self.fabric.link(l.tier).delay_us for l in links], self.fabric.mtu)

    def path_timing_s(self, hosts: list[str]) -> tuple[list[list[float]], list[list[float]]]:
        """From each of ``hosts`` to each, over a shortest path between them: the one-way
        delay (every link's delay: what the agents' delay line holds a packet for) and the
        unloaded round trip (:func:`base_rtt_s` of the path: what a sender should measure)."""
        topo = self.topology
        by_access: dict[tuple[str, str, bool], tuple[float, float]] = {}
        delays, rtts = [], []
        for src in hosts:
            drow, rrow = [], []
            for dst in hosts:
                if src == dst:
                    drow.append(0.0)
                    rrow.append(0.0)
                    continue
                server = topo.server_of(src)
                key = (topo.attachment(src).node, topo.attachment(dst).node,
                       server is not None and server == topo.server_of(dst))
                if key not in by_access:
                    path = topo.equal_cost_paths(src, dst)[0]
                    links = [topo.find_link(a, b) for a, b in zip(path, path[1:])]
                    us = [self.fabric.link(link.tier).delay_us for link in links]
                    by_access[key] = (sum(us) / 1e6, base_rtt_s([link.rate_mbps for link in links],
                                                                us, self.fabric.mtu))
                drow.append(by_access[key][0])
                rrow.append(by_access[key][1])
            delays.append(drow)
            rtts.append(rrow)
        return delays, rtts

    def port_trim(self, tier: str) -> TrimSpec | None:
        """The trimming at the switch ports of a link tier, checked against their queue."""
        trim = self.fabric.link(tier).trim
        if trim is not None:
            fab = self.fabric
            if fab.queue_packets:
                raise ConfigError(f"fabric.{tier}_link.trim", "trimming decides on the queue's "
                                  "bytes: give fabric.queue.size_kb, not size_packets")
            trim.check(f"fabric.{tier}_link.trim", int(fab.queue_kb * 1024))
        return trim

    def port_ecn(self, tier: str) -> list[EcnThresholds]:
        """The marking of each priority at the switch ports of a link tier."""
        link = self.fabric.link(tier)
        return resolve_ecn(link.ecn, link.rate_mbps, self.base_rtt_s, self.fabric.mtu,
                           f"fabric.{tier}_link.ecn")


def build_topology(spec: FabricSpec) -> Topology:
    """Build the topology model of a fabric spec; model errors come back under ``fabric.``."""
    try:
        rates = (spec.host_link.rate_mbps, spec.fabric_link.rate_mbps)
        if spec.topology == "rail_optimized":
            if spec.servers is None:
                raise ConfigError("servers", "required for topology rail_optimized")
            return rail_optimized(spec.servers, spec.shape["spines"],
                                  spec.shape.get("servers_per_leaf"), *rates,
                                  planes=spec.shape.get("planes", 1))
        if spec.topology == "fat_tree":
            topo = fat_tree(spec.shape["k"], *rates)
        elif spec.topology == "ring":
            topo = ring(spec.shape["leaves"], spec.shape["hosts_per_leaf"], *rates)
        elif spec.topology == "custom":
            topo = custom(spec.shape["nodes"], spec.shape["links"], *rates)
        else:
            topo = leaf_spine(spec.shape["leaves"], spec.shape["spines"],
                              spec.shape["hosts_per_leaf"], *rates)
        return topo if spec.servers is None else place_servers(topo, spec.servers)
    except ConfigError as err:
        raise err.under("fabric") from None
