"""Pure, typed description of a testbed: the fabric, its controller and how this machine emulates
it. Every default lives here, once; the experiment layer (:mod:`fabriclab.experiment`) fills these
from an experiment file and :class:`testbed.fabric.Fabric` builds from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property

from testbed.errors import ConfigError
from testbed.topology import Topology, fat_tree, leaf_spine

DEFAULT_RATE_MBPS = 10.0
DEFAULT_QUEUE_KB = 256
DEFAULT_MTU = 9000
DEFAULT_READY_TIMEOUT_S = 60.0


class Routing(StrEnum):
    """How the controller forwards between access switches (see :mod:`controllers.policy`)."""

    ECMP = "ecmp"  # per-flow hash over the equal-cost paths
    DMODK = "dmodk"  # destination-based static up-port choice (InfiniBand's D-mod-k)


class EcmpSeed(StrEnum):
    """The ECMP hash basis: one per switch, or the same everywhere (hash polarization)."""

    PER_SWITCH = "per_switch"
    SHARED = "shared"


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
SHAPE_KEYS = {"fat_tree": ("k",), "leaf_spine": ("leaves", "spines", "hosts_per_leaf")}


@dataclass(frozen=True)
class LinkSpec:
    """One link class (host links or fabric links)."""

    rate_mbps: float = DEFAULT_RATE_MBPS
    delay_us: float = 0.0
    loss_percent: float = 0.0

    def describe(self) -> str:
        """``10 Mbit/s 100 us 1 % loss``."""
        text = f"{self.rate_mbps:g} Mbit/s"
        if self.delay_us:
            text += f" {self.delay_us:g} us"
        if self.loss_percent:
            text += f" {self.loss_percent:g} % loss"
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

    def link(self, tier: str) -> LinkSpec:
        """The settings of a link tier (``host`` or ``fabric``)."""
        return self.host_link if tier == "host" else self.fabric_link

    def queue_text(self) -> str:
        return f"{self.queue_packets} packets" if self.queue_packets else f"{self.queue_kb} KiB"


@dataclass(frozen=True)
class ControllerSpec:
    """How the controller routes."""

    routing: Routing = Routing.ECMP
    ecmp_seed: EcmpSeed = EcmpSeed.PER_SWITCH
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S


@dataclass(frozen=True)
class EmulatorSpec:
    """How the machine emulates the fabric (not what the fabric is)."""

    vswitchd_instances: int | str = "auto"  # private Open vSwitch instances (userspace datapath)
    fidelity: Fidelity = Fidelity.STRICT
    backend: Backend = Backend.AUTO
    ovs_other_config: dict = field(default_factory=dict)  # extra Open_vSwitch other_config


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

    def required_qdiscs(self) -> list[tuple[str, str]]:
        """(field path, qdisc kind) for every setting that needs a particular qdisc."""
        needs = [("fabric", "htb"),
                 ("fabric.queue", "pfifo" if self.fabric.queue_packets else "bfifo")]
        for tier in ("host", "fabric"):
            link = self.fabric.link(tier)
            if link.delay_us:
                needs.append((f"fabric.{tier}_link.delay_us", "netem"))
            if link.loss_percent:
                needs.append((f"fabric.{tier}_link.loss_percent", "netem"))
        return needs


def build_topology(spec: FabricSpec) -> Topology:
    """Build the topology model of a fabric spec; model errors come back under ``fabric.``."""
    try:
        if spec.topology == "fat_tree":
            return fat_tree(spec.shape["k"], spec.host_link.rate_mbps, spec.fabric_link.rate_mbps)
        return leaf_spine(spec.shape["leaves"], spec.shape["spines"], spec.shape["hosts_per_leaf"],
                          spec.host_link.rate_mbps, spec.fabric_link.rate_mbps)
    except ConfigError as err:
        raise err.under("fabric") from None
