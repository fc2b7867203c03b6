"""Packet trimming (pure): what a switch port does with a packet of a trimmable class when its
queue is full or over the trim threshold, as Ultra Ethernet 1.0 and the switches that ship it
(SAI's packet trim, Spectrum-4) do: instead of dropping the packet, forward its first bytes
only (its headers, with the transport's: enough for the receiver to know which packet it was)
with a rewritten DSCP, into a high-priority class, so that the receiver learns of the loss at
once and NACKs it, where a dropped packet costs a timeout or a reordering window.

:func:`decide` is the reference of the eBPF egress program's choice, step for step, against
the port's virtual queue (:mod:`testbed.fabric.ecn`); :func:`trimmed_length` the frame it
leaves. A port without trimming, a class that is not trimmable and a packet already as short
as the trimmed size are dropped as before when the queue is full.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from testbed.errors import ConfigError

ETH_IP_UDP_BYTES = 14 + 20 + 8
#: the transports' own header (traffic.transports.packet.HEADER): a trimmed packet keeps it whole
TRANSPORT_HEADER_BYTES = 45
DEFAULT_SIZE_B = 128
#: DSCP 46 (expedited forwarding): where switches put trimmed headers by default
DEFAULT_TRIM_DSCP = 46


class Action(Enum):
    FORWARD = "forward"
    TRIM = "trim"
    DROP = "drop"


@dataclass(frozen=True)
class TrimSpec:
    """A link class's ``trim`` setting.

    Attributes:
        threshold_kb: the queue's backlog above which a trimmable packet is trimmed (None:
            only when the queue is full, as a drop would be).
        size_b: the frame's length after trimming, Ethernet header included.
        dscp: the DSCP of a trimmed packet (its priority class through the DSCP table).
        priorities: the trimmable priorities (None: every priority).
    """

    threshold_kb: float | None = None
    size_b: int = DEFAULT_SIZE_B
    dscp: int = DEFAULT_TRIM_DSCP
    priorities: tuple[int, ...] | None = None

    def check(self, where: str, queue_bytes: int) -> None:
        """Raises ConfigError naming the field (``where``: ``fabric.host_link.trim``)."""
        if self.size_b < ETH_IP_UDP_BYTES + TRANSPORT_HEADER_BYTES:
            raise ConfigError(f"{where}.size_b", f"{self.size_b} B cannot hold the Ethernet, "
                              f"IP, UDP and transport headers ({ETH_IP_UDP_BYTES} + "
                              f"{TRANSPORT_HEADER_BYTES} B)")
        if not 0 <= self.dscp < 64:
            raise ConfigError(f"{where}.dscp", f"must be 0..63, not {self.dscp}")
        if self.threshold_kb is not None and not 0 < self.threshold_kb * 1024 < queue_bytes:
            raise ConfigError(f"{where}.threshold_kb", f"must be above 0 and below the queue "
                              f"({queue_bytes / 1024:g} KiB), not {self.threshold_kb:g}")

    def trims(self, priority: int) -> bool:
        return self.priorities is None or priority in self.priorities

    def threshold_bytes(self, queue_bytes: int) -> int:
        """The backlog above which packets are trimmed (the queue's size when unset)."""
        return queue_bytes if self.threshold_kb is None else int(self.threshold_kb * 1024)


def trimmed_length(length: int, size_b: int) -> int:
    """The frame a trimmed packet of ``length`` bytes becomes."""
    return min(length, size_b)


def decide(backlog: int, length: int, limit: int, threshold: int | None, size_b: int,
           trimmable: bool) -> tuple[Action, int]:
    """A port's choice for one packet joining a queue of ``backlog`` bytes.

    Args:
        backlog: bytes queued at the port when the packet arrives.
        length: the packet's frame length.
        limit: the queue's size (0: unbounded).
        threshold: the trim threshold in bytes (None: the port does not trim).
        size_b: the frame length a trimmed packet keeps.
        trimmable: the packet is of a trimmable class and transport (UDP, longer than
            ``size_b``).

    Returns:
        The action and the bytes the packet adds to the queue (0 when dropped).
    """
    full = bool(limit) and backlog + length > limit
    if threshold is None or not trimmable or length <= size_b:
        return (Action.DROP, 0) if full else (Action.FORWARD, length)
    if full or backlog > threshold:
        short = trimmed_length(length, size_b)
        if limit and backlog + short > limit:
            return Action.DROP, 0
        return Action.TRIM, short
    return Action.FORWARD, length
