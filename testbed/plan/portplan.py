"""Pure per-port plans of a fabric: the tc plan of every link end (classes, lossless leaves, RED
leaves), what the eBPF marker marks at a switch port, and how much the switches' queues hold.
:class:`testbed.fabric.fabric.Fabric` applies them.
"""

from __future__ import annotations

from testbed.model.congestion import PRIORITIES, EcnMode, EcnThresholds, frame_bytes
from testbed.model.spec import TestbedSpec
from testbed.plan.tcplan import Shaping, plan_shaping
from testbed.model.topology import Link

#: A host NIC's lossless queue: more than the socket buffers of its senders, which block
#: (back-pressure) instead of losing datagrams at their own NIC.
HOST_LOSSLESS_BYTES = 4 << 20
TRUESIZE_FACTOR = 2  # a queued frame's socket charge (skb truesize) over its length
SEND_BUFFER_MAX = 1 << 30


def link_plan(spec: TestbedSpec, link: Link, host_end: bool = False,
              red_marking: bool = False) -> Shaping:
    """The tc plan of a link's switch ends, or of its host NIC (``host_end``).

    Args:
        spec: the testbed.
        link: the link.
        host_end: plan the host NIC's end (no RED; a lossless queue larger than any socket
            buffer, so it back-pressures its senders and never drops; TCP's acknowledgements
            sent first; a switch's end sends them first with ``queue.acks_first`` and no RED).
        red_marking: the switch ports' lossy classes mark ECN with RED leaves.
    """
    fab = spec.fabric
    tier = fab.link(link.tier)
    lossless = {}
    if spec.pfc is not None:
        limit = max(spec.pfc.limit_bytes, HOST_LOSSLESS_BYTES) if host_end \
            else spec.pfc.limit_bytes
        lossless = {p: limit for p in spec.pfc.priorities}
    red = None
    if red_marking and not host_end:
        red = {p: (th.mode.value, th.k_bytes, th.kmin_bytes, th.kmax_bytes, th.pmax)
               for p, th in enumerate(spec.port_ecn(link.tier))}
    return plan_shaping(link.rate_mbps, fab.mtu, fab.queue_kb, fab.queue_packets,
                        fab.link_delay_us(link.tier), fab.priorities(), lossless, red,
                        fab.traffic_classes.strict,
                        acks_first=host_end or (fab.acks_first and red is None))


def red_priorities(plan: Shaping) -> list[int]:
    """The priorities whose ECN marking a link end's RED leaves do."""
    if plan.red is not None:
        return list(range(PRIORITIES))  # one class: every priority meets that leaf
    return [c.priority for c in plan.classes if c.red is not None]


def marker_thresholds(spec: TestbedSpec, link: Link, plan: Shaping) -> tuple[EcnThresholds, ...]:
    """What the eBPF marker marks at a switch port of ``link``: its tier's marking, except the
    priorities a RED leaf marks (there the marker only counts)."""
    marking = list(spec.port_ecn(link.tier))
    for prio in red_priorities(plan):
        marking[prio] = EcnThresholds(EcnMode.OFF)
    return tuple(marking)


def switch_queue_bytes(spec: TestbedSpec, red_marking: bool = False) -> int:
    """What every switch port's queues hold together when full."""
    total = 0
    for link in spec.topology.links:
        plan = link_plan(spec, link, red_marking=red_marking)
        if plan.classes:
            per_port = sum(c.limit_bytes for c in plan.classes)
        elif plan.queue_kind == "bfifo":
            per_port = plan.queue_limit
        else:  # a packet count
            per_port = plan.queue_limit * frame_bytes(spec.fabric.mtu)
        ends = sum(1 for e in (link.a, link.b) if spec.topology.nodes[e.node].is_switch)
        total += per_port * ends
    return total


def send_buffer_bytes(queue_bytes: int) -> int:
    """The socket send buffer a userspace-datapath vswitchd needs to hold its queues full."""
    return min(SEND_BUFFER_MAX, TRUESIZE_FACTOR * queue_bytes)


def scale_up_plan(spec: TestbedSpec, link: Link, gpu_end: bool = False) -> Shaping:
    """The tc plan of either end of a scale-up link: its rate, one class, and a queue as large
    as a host NIC's lossless one (NVLink is credit-based: it back-pressures and never drops);
    a GPU's end sends TCP's acknowledgements first, as a host NIC does (the switch's end too
    with ``queue.acks_first``)."""
    return plan_shaping(link.rate_mbps, spec.fabric.mtu, HOST_LOSSLESS_BYTES // 1024,
                        acks_first=gpu_end or spec.fabric.acks_first)


def scale_up_mac(ip: str, port: int) -> str:
    """A GPU's scale-up interface MAC: ``02:{port}:`` and its IPv4 address (its NIC's is
    ``02:00:`` and the address)."""
    return f"02:{port:02x}:" + ":".join(f"{int(b):02x}" for b in ip.split("."))



def applied(spec: TestbedSpec, red_marking: bool = False) -> dict[str, str]:
    """What tc holds at each kind of link end (the first link of each tier's), one line each:
    a run's provenance."""
    out: dict[str, str] = {}
    for link in spec.topology.links:
        if link.tier == "host" and "host NIC" not in out:
            out["host NIC"] = link_plan(spec, link, True, red_marking).describe()
        out.setdefault(f"{link.tier} link, switch port",
                       link_plan(spec, link, False, red_marking).describe())
    for link in spec.topology.scale_up[:1]:
        out["scale-up link"] = scale_up_plan(spec, link).describe()
    return out
