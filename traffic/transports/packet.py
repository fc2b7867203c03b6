"""The wire format shared by the UDP transports, and the scaling of their constants.

One header, big-endian, before a zero payload: kind, flags, queue pair (sender rank, channel),
packet sequence number, cumulative ACK, entropy, up to three more echoed entropies and which of
the echoed packets carried CE (an ACK that covers several packets echoes each one's entropy),
a 64-bit SACK bitmap (a credit request's or grant's running total; an unreliable DATA packet's
message end as a byte offset, with its end PSN in the ACK field), the sender's send time (echoed in ACKs, for delay) and the payload's
length as sent: a packet a switch trimmed (:mod:`testbed.plan.trim`) arrives shorter than it
says, and the receiver knows which packet it lost.

In-band network telemetry (HPCC's INT): a packet flagged ``INT`` begins its payload with
:data:`INT_SIZE` bytes for the switches to stamp: a hop count, then per hop (up to
:data:`INT_HOPS`) the egress port's time (ns, the kernel's monotonic clock, which the hosts'
``time.monotonic`` shares), its bytes sent so far (modulo 2^32), the queue the packet waits
behind (bytes) and its rate (kbit/s). The switches' eBPF egress program
(``testbed/linux/progs/ecn_marker.c``) writes them; an ACK echoes them back in its own
payload.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

HEADER = struct.Struct("!BBHHHIIH3HBQQI")
MAX_ECHO = 4  # entropies an ACK can echo (its own and three more)
NO_ENTROPY = 0xFFFF
VERSION = 4
INT_HOPS = 5
INT_HOP = struct.Struct("!QIII")  # time (ns), bytes sent (mod 2^32), queue (bytes), kbit/s
INT_HEAD = struct.Struct("!B3x")  # hops stamped
INT_SIZE = INT_HEAD.size + INT_HOPS * INT_HOP.size
ROCEV2_PORT = 4791  # the IANA port of RoCEv2
UET_PORT = 4793  # Ultra Ethernet's
SACK_BITS = 64


class Kind(IntEnum):
    DATA = 1
    ACK = 2
    NAK = 3  # RoCE: out of sequence, resend from ``ack`` (go back N); UET: ``psn`` is lost
    CNP = 4  # RoCE: congestion notification (a CE mark was seen)
    REQ = 5  # UET with receiver credits: ``sack`` is the bytes the sender has to send, in all
    GRANT = 6  # UET with receiver credits: ``sack`` is the credit granted so far, in all
    PING = 7  # the agents' probe of an unloaded round trip (``sent_ns``: when it left)
    PONG = 8  # its answer (``sent_ns`` echoed)


class Flag(IntEnum):
    CE = 1  # DATA arrived with CE / the ACK echoes it
    RETX = 2  # a retransmission
    LAST = 4  # the last packet of a message
    NACK = 8  # the ACK also names a missing PSN (``ack``): evidence of loss
    DUP = 16  # the ACK answers a duplicate: a retransmission was not needed
    TRIMMED = 32  # a NAK for a packet a switch trimmed (``psn``): resend it now
    INT = 64  # the payload begins with INT_SIZE bytes of in-band telemetry (see the module)


@dataclass(frozen=True, slots=True)
class Hop:
    """One switch port's INT record."""

    ts_ns: int
    tx_bytes: int  # modulo 2^32
    qlen_bytes: int
    rate_kbps: int

    @property
    def rate_bytes_s(self) -> float:
        return self.rate_kbps * 1000 / 8


def int_bytes(hops: tuple[Hop, ...] = ()) -> bytes:
    """An INT area holding ``hops`` (empty for a packet leaving its sender)."""
    out = bytearray(INT_SIZE)
    INT_HEAD.pack_into(out, 0, len(hops))
    for i, h in enumerate(hops[:INT_HOPS]):
        INT_HOP.pack_into(out, INT_HEAD.size + i * INT_HOP.size, h.ts_ns, h.tx_bytes,
                          h.qlen_bytes, h.rate_kbps)
    return bytes(out)


def parse_int(data: bytes, offset: int = 0) -> tuple[Hop, ...]:
    """The hops an INT area at ``offset`` holds (ValueError if it is cut short)."""
    if len(data) < offset + INT_SIZE:
        raise ValueError("INT area cut short")
    (n,) = INT_HEAD.unpack_from(data, offset)
    return tuple(Hop(*INT_HOP.unpack_from(data, offset + INT_HEAD.size + i * INT_HOP.size))
                 for i in range(min(n, INT_HOPS)))


@dataclass(slots=True)
class Packet:
    """One transport packet. ``qp`` is (sender rank, channel); ``length`` is the DATA payload."""

    kind: Kind
    qp: tuple[int, int]
    psn: int = 0
    ack: int = 0  # ACK/NAK: every PSN below is received (cumulative)
    length: int = 0
    entropy: int = 0
    sack: int = 0  # bit i: PSN ack + 1 + i received
    sent_ns: int = 0
    flags: int = 0
    echo: tuple[int, ...] = ()  # an ACK's further entropies (the packets before the latest)
    ce_mask: int = 0  # an ACK: bit i set if echoed packet i carried CE (0: ``entropy``)
    trimmed: bool = False  # DATA that arrived shorter than sent: a switch trimmed it
    hops: tuple[Hop, ...] = ()  # INT: the switches' stamps (flag INT; ``length`` covers them)

    @property
    def ce(self) -> bool:
        return bool(self.flags & Flag.CE)

    def echoed(self) -> list[tuple[int, bool]]:
        """An ACK's echoed entropies, each with whether its packet carried CE."""
        return [(e, bool(self.ce_mask >> i & 1))
                for i, e in enumerate((self.entropy, *self.echo))]

    def encode(self) -> bytes:
        """The header, and the INT area if flagged (the engine appends the rest of
        ``length``: :meth:`filler` bytes)."""
        echo = (*self.echo, NO_ENTROPY, NO_ENTROPY, NO_ENTROPY)[:MAX_ECHO - 1]
        head = HEADER.pack(self.kind, self.flags, VERSION, self.qp[0], self.qp[1], self.psn,
                           self.ack, self.entropy, *echo, self.ce_mask, self.sack, self.sent_ns,
                           self.length)
        return head + int_bytes(self.hops) if self.flags & Flag.INT else head

    @property
    def filler(self) -> int:
        """Payload bytes after what :meth:`encode` returns."""
        return self.length - (INT_SIZE if self.flags & Flag.INT else 0)

    @classmethod
    def decode(cls, data: bytes) -> Packet:
        """Raises ValueError for a short or foreign datagram."""
        if len(data) < HEADER.size:
            raise ValueError(f"datagram of {len(data)} bytes is shorter than the header")
        kind, flags, version, src, ch, psn, ack, entropy, e2, e3, e4, ce_mask, sack, sent, \
            length = HEADER.unpack_from(data)
        if version != VERSION or kind not in Kind.__members__.values():
            raise ValueError(f"not a transport packet (version {version}, kind {kind})")
        carried = len(data) - HEADER.size
        if carried > length:
            raise ValueError(f"a datagram of {carried} payload bytes says {length}")
        hops: tuple[Hop, ...] = ()
        if flags & Flag.INT and carried >= INT_SIZE:
            hops = parse_int(data, HEADER.size)
        return cls(Kind(kind), (src, ch), psn, ack, length, entropy, sack, sent, flags,
                   tuple(e for e in (e2, e3, e4) if e != NO_ENTROPY), ce_mask,
                   trimmed=carried < length, hops=hops)


FRAME_OVERHEAD = 14 + 20 + 8  # Ethernet, IPv4 and UDP headers around a transport packet
#: How far a paced sender's schedule may lag behind the clock and be caught up: its event loop
#: wakes in whole milliseconds (epoll) and late on a busy machine, so a pace that restarts from
#: the wake-up sends one packet per wake, under the rate once a frame takes less than a
#: millisecond (a uet queue pair at 100 Mbit/s reached 0.53 of it). Within this lag the packets
#: owed go out at once; beyond it the schedule restarts (no burst after an idle spell).
PACE_CATCH_UP_S = 0.003


def next_send(now: float, scheduled: float, gap_s: float) -> float:
    """When a paced sender may send next, having just sent a packet that takes ``gap_s`` at its
    rate: on its schedule, caught up within :data:`PACE_CATCH_UP_S`."""
    return max(now - PACE_CATCH_UP_S, scheduled) + gap_s


def wire_bytes(payload: int) -> int:
    """The frame a transport packet of ``payload`` bytes occupies on a link (as HTB counts
    it): Ethernet, IPv4, UDP and the transport's header around the payload."""
    return payload + HEADER.size + FRAME_OVERHEAD


def packetize(lengths: list[int], last_of_message: set[int], nbytes: int, mss: int) -> int:
    """Append a message of ``nbytes`` to a queue pair's packets (payload length per PSN; an
    empty message is one empty packet) and mark its last; returns the PSN it ends before."""
    for offset in range(0, max(nbytes, 1), mss):
        lengths.append(min(mss, nbytes - offset) if nbytes else 0)
    last_of_message.add(len(lengths) - 1)
    return len(lengths)


#: how far ahead of the wire an agent's engine may send: this many frames, and at least this
#: long ahead (the loop wakes late on a busy machine; two frames left the NIC idle half the
#: time)
NIC_BURST_FRAMES = 2
NIC_AHEAD_S = 0.003


def ahead_of_the_wire_bytes(rate_mbps: float, mss: int) -> float:
    """How far an agent's engine may run ahead of its NIC's line rate, in bytes on the wire
    (:data:`NIC_BURST_FRAMES`, :data:`NIC_AHEAD_S`)."""
    return max(NIC_BURST_FRAMES * wire_bytes(mss), NIC_AHEAD_S * rate_mbps * 1e6 / 8)


def mss_for(mtu: int) -> int:
    """Payload bytes of a transport packet in one frame: the MTU less IPv4, UDP and the
    transport's header."""
    return mtu - 20 - 8 - HEADER.size


@dataclass(frozen=True)
class Scale:
    """Constants of data-center transports, which assume microsecond RTTs and 10-400 Gbit/s,
    brought to the emulated fabric: times scale with its base RTT, byte counts with its
    bandwidth-delay product, rates with its link rate.

    Args:
        rate_bps: the hosts' link rate.
        base_rtt_s: the unloaded RTT of the longest path.
        mss: payload bytes per packet.
    """

    rate_bps: float
    base_rtt_s: float
    mss: int

    REF_RTT_S = 10e-6  # a data-center RTT the published constants were tuned for
    REF_RATE_BPS = 40e9  # DCQCN's evaluation rate

    @property
    def time(self) -> float:
        """Multiply a published time by this."""
        return self.base_rtt_s / self.REF_RTT_S

    @property
    def rto_s(self) -> float:
        """A retransmission timeout: 10 base RTTs, at least 200 ms. At 10 Mbit/s one full
        256 KiB queue alone is 210 ms of delay, so a few microsecond-scale RTTs would fire on
        queueing, not loss."""
        return max(0.2, 10 * self.base_rtt_s)

    @property
    def bdp_bytes(self) -> int:
        return max(self.mss, int(self.rate_bps / 8 * self.base_rtt_s))

    def bytes_(self, published: float, ref_rate_bps: float = REF_RATE_BPS) -> int:
        """A published byte count (set for ``ref_rate_bps``), as the same number of reference
        bandwidth-delay products."""
        ref_bdp = ref_rate_bps / 8 * self.REF_RTT_S
        return max(self.mss, int(published / ref_bdp * self.bdp_bytes))

    def rate(self, published_bps: float) -> float:
        """A published rate, as the same share of the link."""
        return published_bps / self.REF_RATE_BPS * self.rate_bps
