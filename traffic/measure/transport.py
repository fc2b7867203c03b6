"""Transport facts: what share of a link's bits a transport delivers as payload.

The TCP figures below are what the results' ``ideal_s`` and ``efficiency`` and the capacity
benchmark's ideal goodput rest on; the RDMA-like transports of later issues add theirs here.
"""

from __future__ import annotations

ETH_HEADER_BYTES = 14  # what HTB counts on top of the IP packet (no preamble, no FCS)
TCP_IP_HEADER_BYTES = 52  # IPv4 20 + TCP 20 + timestamps 12


def goodput_fraction(mtu: int) -> float:
    """TCP payload bytes per byte on the wire (as HTB counts it) for full-size segments."""
    return (mtu - TCP_IP_HEADER_BYTES) / (mtu + ETH_HEADER_BYTES)


def transport_settings(transport: str, spray: bool, cfg) -> dict:
    """What a UDP engine runs, as its counters carry it: the transport, spraying, the
    constants, rocev2's congestion control (DCQCN's profile), uet's delivery, RCCC, NSCC and choice of entropy."""
    out: dict = {"transport": transport, "spray": spray, "constants": cfg.describe()}
    if transport == "rocev2":
        out["congestion_control"] = cfg.congestion_control
        if cfg.dcqcn:
            out["dcqcn"] = cfg.dcqcn.profile
    if transport == "uet":
        out.update(delivery=cfg.delivery, rccc=cfg.rccc, nscc=cfg.nscc, entropy=cfg.entropy)
    return out


def queue_pair_totals(senders: list, receivers: list) -> dict:
    """The senders' counters (``tx_``) and the receivers' (``rx_``), summed; a window is no
    counter."""
    return counter_totals([s.summary() for s in senders], [r.stats for r in receivers])


def counter_totals(senders: list[dict], receivers: list[dict]) -> dict:
    """:func:`queue_pair_totals` of the senders' summaries and the receivers' counters."""
    out: dict = {}
    for summary in senders:
        for k, v in summary.items():
            if isinstance(v, (int, float)) and k != "cwnd_bytes":
                out[f"tx_{k}"] = out.get(f"tx_{k}", 0) + v
    for stats in receivers:
        for k, v in stats.items():
            out[f"rx_{k}"] = out.get(f"rx_{k}", 0) + v
    return out


def retransmitted_to(senders: dict, peer: int) -> int:
    """Packets the senders (by (peer, channel)) to ``peer`` sent again so far (read from
    another thread than theirs: a count may be one packet behind)."""
    return sum(s.stats["retransmitted"] for (p, _ch), s in list(senders.items()) if p == peer)


def stalled_queue_pairs(transport: str, senders: dict, recv_waits: dict,
                        receivers: dict) -> list[str]:
    """The queue pairs with work left, and where each stands: senders (by (peer, channel))
    with data unacknowledged, receivers with bytes awaited (``recv_waits``: the byte counts
    each queue pair's waiters want)."""
    out = []
    for (peer, ch), s in senders.items():
        if s.una < len(s.lengths):
            out.append(f"{transport} to rank {peer} channel {ch}: {s.describe()}")
    for qp, waits in recv_waits.items():
        if waits:
            r = receivers[qp]
            out.append(f"{transport} from rank {qp[0]} channel {qp[1]}: "
                       f"{r.delivered}/{waits[-1][0]} bytes in order")
    return out
