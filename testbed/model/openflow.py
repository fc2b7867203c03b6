"""A switch's flow and group entries as OpenFlow holds them (pure): what the controller computes
for each switch (:mod:`controllers.routing.tables`) and what an eBPF switch keeps after the
controller set it (:mod:`testbed.openflow.session`)."""

from __future__ import annotations

from dataclasses import dataclass

CONTROLLER_PORT = "controller"  # an output to the controller
SHARED_HASH_BASIS = 0
#: Open vSwitch's group property selection_method (an ONF/NTR experimenter property)
NTR_EXPERIMENTER, NTRT_SELECTION_METHOD = 0x0000154D, 1
#: fabriclab's own group property: a flowlet group's reactive rebalancing (eBPF switches)
FABRICLAB_EXPERIMENTER, FLT_REBALANCE = 0x00FAB1AB, 1


@dataclass(frozen=True)
class FlowEntry:
    """One flow: ``match`` and ``actions`` are tuples of (name, value)."""

    priority: int
    match: tuple[tuple[str, object], ...]
    actions: tuple[tuple[str, object], ...]
    cookie: int = 0

    @property
    def key(self) -> tuple:
        return (self.priority, self.match)


@dataclass(frozen=True)
class GroupEntry:
    """An OpenFlow SELECT group; each bucket outputs to (and watches) one port. The switch picks
    a bucket by hashing the 5-tuple with ``hash_basis``, in the slow path (``hash``) or in the
    datapath (``dp_hash``), or by its ports' load, switch-local (the eBPF datapath's
    ``flowlet``: a flow's packets keep their port until a gap of ``gap_us``; ``packet``: every
    packet to the least-loaded port; :mod:`testbed.plan.localroute`)."""

    group_id: int
    ports: tuple[int, ...]
    hash_basis: int = SHARED_HASH_BASIS
    selection: str = "hash"
    weights: tuple[int, ...] = ()  # one per port (SELECT bucket weights); empty: all alike
    kind: str = "select"  # or "ff": fast failover, the first live port in order
    gap_us: int = 0  # flowlet: the idle gap after which a flow may take another port
    # flowlet: reactive rebalancing's (quality delta, chance per packet), percent; (0, 0): off
    rebalance: tuple[int, int] = (0, 0)
