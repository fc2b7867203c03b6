"""OpenFlow groups as an eBPF switch applies them (pure): SELECT groups pick a bucket by a hash
of the packet's 5-tuple with the switch's own basis, in proportion to the buckets' weights
(ECMP, WCMP, spraying: a sender that varies its UDP source port per packet lands each packet
on its own bucket); fast-failover groups take their first bucket whose port is live.

:func:`flow_hash` is defined byte for byte so that the datapath's C computes the same value:
32-bit FNV-1a over the basis and the 5-tuple in network byte order, then MurmurHash3's 32-bit
finalizer (FNV-1a's low bits alone are the parity of the bytes' low bits: a modulo 2 would
ignore the basis and polarize every tier).
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Callable, Sequence

from testbed.model.openflow import SHARED_HASH_BASIS
from testbed.model.spec import EcmpSeed
from testbed.plan import tss

FNV_OFFSET, FNV_PRIME = 2166136261, 16777619
_TUPLE = struct.Struct("!IIIBHH")  # basis, source, destination, protocol, ports


def flow_hash(basis: int, src: str, dst: str, proto: int, sport: int = 0, dport: int = 0) -> int:
    """FNV-1a (32 bits) over ``basis`` and the 5-tuple, each in network byte order, mixed by
    MurmurHash3's finalizer."""
    data = _TUPLE.pack(basis & 0xFFFFFFFF, int(ipaddress.IPv4Address(src)),
                       int(ipaddress.IPv4Address(dst)), proto, sport, dport)
    h = FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * FNV_PRIME) & 0xFFFFFFFF
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


def hash_basis(switch, seed: str) -> int:
    """The 32-bit ECMP hash basis of ``switch`` (a topology node): derived from its datapath
    id (reproducible from run to run) for ``per_switch``, the same everywhere for ``shared``."""
    if seed == EcmpSeed.SHARED:
        return SHARED_HASH_BASIS
    x = (switch.dpid or 0) * 0x9E3779B97F4A7C15 & 0xFFFFFFFFFFFFFFFF
    return (x ^ (x >> 29)) & 0xFFFFFFFF or 1


def select_bucket(weights: Sequence[int], h: int) -> int | None:
    """The bucket a hash lands on: buckets own consecutive ranges of ``sum(weights)`` in
    order, and ``h`` modulo the sum falls in one. Zero-weight buckets get nothing; None when
    every weight is zero."""
    total = sum(weights)
    if total <= 0:
        return None
    point = h % total
    for i, weight in enumerate(weights):
        if point < weight:
            return i
        point -= weight
    raise AssertionError("unreachable: point < total")


def fast_failover(ports: Sequence[int], live: Callable[[int], bool]) -> int | None:
    """The first port of a fast-failover group that is live (None: none is)."""
    return next((p for p in ports if live(p)), None)


def apply_group(kind: str, ports: Sequence[int], weights: Sequence[int], basis: int,
                packet: dict, live: Callable[[int], bool]) -> int | None:
    """The output port of a group (``select`` or ``ff``) for ``packet`` (a dict of header
    fields, as :func:`testbed.plan.tss.lookup` takes), None when the group drops it. A SELECT
    group's buckets whose port is down get no traffic (each bucket watches its port)."""
    if kind == "ff":
        return fast_failover(ports, live)
    proto = int(packet.get("ip_proto", 0))
    name = {6: "tcp", 17: "udp"}.get(proto)
    h = flow_hash(basis, packet.get("ipv4_src", "0.0.0.0"), packet.get("ipv4_dst", "0.0.0.0"),
                  proto, int(packet.get(f"{name}_src", 0)) if name else 0,
                  int(packet.get(f"{name}_dst", 0)) if name else 0)
    weights = list(weights) or [1] * len(ports)
    live_weights = [w if live(p) else 0 for p, w in zip(ports, weights)]
    i = select_bucket(live_weights, h)
    return None if i is None else ports[i]


def forward(flows, groups: dict, live: Callable[[int], bool], packet: dict) -> int | None:
    """The port a switch sends ``packet`` (header fields and its ``in_port``) out of, as the
    eBPF datapath decides it: the best entry of its flow table (``flows``: the
    :class:`~testbed.model.openflow.FlowEntry` values), then that entry's first output, or its
    group (``groups``: id -> :class:`~testbed.model.openflow.GroupEntry`) applied with the
    ports' liveness; None when it drops the packet or only sends it to the controller."""
    entry, _probes = tss.lookup(tss.compile_table(flows), packet)
    if entry is None:
        return None
    for name, value in entry.actions:
        if name == "output" and value != "controller":
            return int(value)
        if name == "group" and value in groups:
            g = groups[value]
            return apply_group(g.kind, g.ports, g.weights, g.hash_basis, packet, live)
    return None
