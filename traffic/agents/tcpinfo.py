"""A TCP connection's own counters from the kernel (``TCP_INFO``), so TCP collectives carry
the transport counters the UDP transports keep themselves: bytes sent, what was retransmitted
(packets and bytes), data segments received and how many of them arrived out of order,
reorderings the sender detected, and CE marks delivered.

The layout is ``struct tcp_info`` of ``linux/tcp.h``; the fields read here exist since Linux
5.4 (``tcpi_rcv_ooopack``). An older kernel's shorter answer leaves the missing ones out.
"""

from __future__ import annotations

import socket
import struct

#: counter -> (offset in struct tcp_info, struct format)
FIELDS = {
    "total_retrans": (100, "I"),
    "data_segs_in": (152, "I"),
    "delivered_ce": (196, "I"),
    "bytes_sent": (200, "Q"),
    "bytes_retrans": (208, "Q"),
    "reord_seen": (220, "I"),
    "rcv_ooopack": (224, "I"),
}
SIZE = 232
#: a socket's counters -> the transport counters of a collective's row (``results.json``)
#: (no packets sent: TCP counts segments as it hands them to the device, up to 64 KiB each
#: with TSO, where its retransmissions count MSS-sized packets)
AS_TRANSPORT = {"bytes_sent": "tx_bytes", "total_retrans": "tx_retransmitted",
                "bytes_retrans": "tx_retransmitted_bytes", "rcv_ooopack": "rx_out_of_order",
                "data_segs_in": "rx_data_segments", "reord_seen": "tx_reordering_seen",
                "delivered_ce": "tx_ce_delivered"}


def parse(raw: bytes) -> dict[str, int]:
    """The counters in one ``TCP_INFO`` answer (those it is long enough to hold)."""
    out = {}
    for name, (offset, fmt) in FIELDS.items():
        end = offset + struct.calcsize(fmt)
        if len(raw) >= end:
            (out[name],) = struct.unpack_from("=" + fmt, raw, offset)
    return out


def read(sock: socket.socket) -> dict[str, int]:
    """One socket's counters now (nothing from a closed socket)."""
    try:
        return parse(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, SIZE))
    except OSError:
        return {}


def congestion_control(sock: socket.socket) -> str:
    """The congestion control a socket runs (``TCP_CONGESTION``), as the kernel reports it."""
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16)
    except OSError:
        return "unknown"
    return raw.split(b"\0", 1)[0].decode() or "unknown"


def totals(socks) -> dict:
    """Every socket's counters summed, named as the transports' (``tx_bytes``, ...), with
    ``transport: tcp``."""
    out: dict = {"transport": "tcp"}
    for sock in socks:
        for name, value in read(sock).items():
            key = AS_TRANSPORT[name]
            out[key] = out.get(key, 0) + value
    return out
