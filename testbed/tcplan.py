"""Pure link-shaping plans: what HTB class and leaf queue each link end gets.

Every link end shapes its egress with ``htb 1: -> class 1:1 (rate = ceil) -> fifo 10:``, or
``netem 10:`` as the leaf when the link has a delay or a loss rate (each direction's packets meet
the delay once, at the end they leave by; netem's queue limit counts packets). With
TSO/GSO on, the queue holds super-packets of up to 64 KiB, so queues are sized in bytes (bfifo)
unless the experiment asks for a packet count, and the HTB burst must cover one super-packet.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.spec import DEFAULT_QUEUE_KB

GSO_MAX_BYTES = 65536
HTB_MAX_QUANTUM = 200000
BURST_TIME_S = 0.001  # tokens for 1 ms at line rate, at least one super-packet


@dataclass(frozen=True)
class Shaping:
    """The tc configuration of one link end."""

    rate_kbit: int
    burst_bytes: int
    quantum_bytes: int
    queue_kind: str  # bfifo (limit in bytes), pfifo or netem (limit in packets)
    queue_limit: int
    delay_us: float = 0.0
    loss_percent: float = 0.0

    @property
    def rate_mbps(self) -> float:
        return self.rate_kbit / 1000


def plan_shaping(rate_mbps: float, mtu: int, queue_kb: int | None = None,
                 queue_packets: int | None = None, delay_us: float = 0.0,
                 loss_percent: float = 0.0) -> Shaping:
    """Plan the shaping of one link end.

    Args:
        rate_mbps: line rate.
        mtu: link MTU in bytes.
        queue_kb: queue size in KiB (bfifo); used when ``queue_packets`` is None.
        queue_packets: queue size in packets (pfifo).
        delay_us: one-way delay of the link (netem leaf).
        loss_percent: random loss of the link (netem leaf).

    Returns:
        The plan.
    """
    rate_bytes_s = rate_mbps * 1e6 / 8
    burst = int(max(rate_bytes_s * BURST_TIME_S, GSO_MAX_BYTES + mtu))
    quantum = int(min(HTB_MAX_QUANTUM, max(mtu + 14, GSO_MAX_BYTES)))
    if queue_packets is not None:
        kind, limit = "pfifo", int(queue_packets)
    else:
        kind, limit = "bfifo", int((queue_kb if queue_kb is not None else DEFAULT_QUEUE_KB)
                                     * 1024)
    if delay_us or loss_percent:
        packets = limit if kind == "pfifo" else max(1, -(-limit // (mtu + 14)))
        # netem holds the packets in flight on the delay line too: add the bandwidth-delay product
        packets += int(rate_bytes_s * delay_us / 1e6 / (mtu + 14)) + 1
        return Shaping(round(rate_mbps * 1000), burst, quantum, "netem", packets,
                       float(delay_us), float(loss_percent))
    return Shaping(round(rate_mbps * 1000), burst, quantum, kind, limit)
