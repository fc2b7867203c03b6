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
