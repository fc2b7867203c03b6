"""Pure link-shaping plans: what HTB class and leaf queue each link end gets.

Every link end shapes its egress with ``htb 1: -> class 1:1 (rate = ceil) -> fifo 10:``. With
TSO/GSO on, the queue holds super-packets of up to 64 KiB, so queues are sized in bytes (bfifo)
unless the experiment asks for a packet count, and the HTB burst must cover one super-packet.
"""

from __future__ import annotations

from dataclasses import dataclass

GSO_MAX_BYTES = 65536
HTB_MAX_QUANTUM = 200000
BURST_TIME_S = 0.001  # tokens for 1 ms at line rate, at least one super-packet


@dataclass(frozen=True)
class Shaping:
    """The tc configuration of one link end."""

    rate_kbit: int
    burst_bytes: int
    quantum_bytes: int
    queue_kind: str  # bfifo (limit in bytes) or pfifo (limit in packets)
    queue_limit: int

    @property
    def rate_mbps(self) -> float:
        return self.rate_kbit / 1000


def plan_shaping(rate_mbps: float, mtu: int, queue_kb: int | None = None,
                 queue_packets: int | None = None) -> Shaping:
    """Plan the shaping of one link end.

    Args:
        rate_mbps: line rate.
        mtu: link MTU in bytes.
        queue_kb: queue size in KiB (bfifo); used when ``queue_packets`` is None.
        queue_packets: queue size in packets (pfifo).

    Returns:
        The plan.
    """
    rate_bytes_s = rate_mbps * 1e6 / 8
    burst = int(max(rate_bytes_s * BURST_TIME_S, GSO_MAX_BYTES + mtu))
    quantum = int(min(HTB_MAX_QUANTUM, max(mtu + 14, GSO_MAX_BYTES)))
    if queue_packets is not None:
        kind, limit = "pfifo", int(queue_packets)
    else:
        kind, limit = "bfifo", int((queue_kb if queue_kb is not None else 256) * 1024)
    return Shaping(round(rate_mbps * 1000), burst, quantum, kind, limit)
