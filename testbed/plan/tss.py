"""A switch's OpenFlow flow table as tuple-space subtables (pure): what an eBPF switch looks up.

An eBPF switch cannot walk a flow table entry by entry at line rate. Tuple space search (as
Open vSwitch's megaflow classifier does) groups the flows by their *mask* (which fields they
match, and the prefix length of each IPv4 address); each group is one exact-match table keyed
by the packet's fields under that mask. A lookup tries the subtables in order of their highest
priority and stops as soon as the best match found so far outranks every subtable left, so a
packet costs a few hash lookups whatever the table's size. :func:`compile_table` builds the
subtables from flow entries; :func:`lookup` is the reference of what the datapath does with
them, step for step (a bounded number of subtables, the same early stop).

The match fields supported are what fabriclab's routing and common os-ken apps use; anything
else is refused with the error an OpenFlow switch sends (``OFPET_BAD_MATCH``), never ignored.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field

#: exact-match fields (and the two IPv4 addresses, matched by prefix)
EXACT_FIELDS = ("in_port", "eth_type", "eth_dst", "eth_src", "ip_dscp", "ip_proto",
                "tcp_src", "tcp_dst", "udp_src", "udp_dst")
PREFIX_FIELDS = ("ipv4_src", "ipv4_dst")
#: the most subtables one switch may have (the datapath's bounded loop)
MAX_SUBTABLES = 16
#: OpenFlow 1.5: error type and code a switch answers an unsupported match with
OFPET_BAD_MATCH, OFPBMC_BAD_FIELD, OFPBMC_BAD_WILDCARDS = 4, 6, 5


class UnsupportedMatch(ValueError):
    """A flow this datapath cannot match: the OpenFlow error (``type``, ``code``) to answer."""

    def __init__(self, message: str, code: int = OFPBMC_BAD_FIELD) -> None:
        super().__init__(message)
        self.type, self.code = OFPET_BAD_MATCH, code


@dataclass(frozen=True, order=True)
class Mask:
    """Which fields a subtable matches: exact fields by name, IPv4 addresses by prefix length
    (0: not matched)."""

    fields: tuple[str, ...]
    ipv4_src_len: int = 0
    ipv4_dst_len: int = 0


@dataclass(frozen=True)
class Entry:
    """One flow in a subtable: its priority and what it does (``actions`` as in the table)."""

    priority: int
    actions: tuple[tuple[str, object], ...]
    cookie: int = 0


@dataclass
class Subtable:
    """Every flow of one mask: the masked key -> its entry; ``max_priority`` orders lookups."""

    mask: Mask
    entries: dict[tuple, Entry] = field(default_factory=dict)
    max_priority: int = -1


def _prefix_len(mask: object) -> int:
    """The prefix length of an IPv4 mask (``255.255.255.0`` -> 24); only contiguous masks."""
    bits = int(ipaddress.IPv4Address(str(mask)))
    length = bin(bits).count("1")
    if bits != (0xFFFFFFFF << (32 - length)) & 0xFFFFFFFF:
        raise UnsupportedMatch(f"IPv4 mask {mask} is not a prefix", OFPBMC_BAD_WILDCARDS)
    return length


def _masked_ip(address: object, length: int) -> int:
    return int(ipaddress.IPv4Address(str(address))) & ((0xFFFFFFFF << (32 - length)) & 0xFFFFFFFF)


def split_match(match: Iterable[tuple[str, object]]) -> tuple[Mask, tuple]:
    """A flow's match as its mask and its key under that mask.

    Raises:
        UnsupportedMatch: a field this datapath does not match, or an IPv4 mask that is not a
            prefix.
    """
    exact: dict[str, object] = {}
    prefixes = {"ipv4_src": (0, 0), "ipv4_dst": (0, 0)}
    for name, value in match:
        if name in EXACT_FIELDS:
            if isinstance(value, tuple):  # (value, mask): this datapath matches them whole
                raise UnsupportedMatch(f"match field {name} with a mask is not supported by "
                                       "the eBPF datapath", OFPBMC_BAD_WILDCARDS)
            exact[name] = value
        elif name in PREFIX_FIELDS:
            address, mask = value if isinstance(value, tuple) else (value, "255.255.255.255")
            length = _prefix_len(mask)
            prefixes[name] = (length, _masked_ip(address, length) if length else 0)
        else:
            raise UnsupportedMatch(f"match field {name} is not supported by the eBPF datapath")
    names = tuple(sorted(exact))
    mask = Mask(names, prefixes["ipv4_src"][0], prefixes["ipv4_dst"][0])
    key = (tuple(exact[n] for n in names), prefixes["ipv4_src"][1], prefixes["ipv4_dst"][1])
    return mask, key


def packet_key(mask: Mask, packet: dict) -> tuple | None:
    """The packet's fields under ``mask`` (None when it lacks a field the mask matches)."""
    if any(n not in packet for n in mask.fields):
        return None
    src = _masked_ip(packet.get("ipv4_src", "0.0.0.0"), mask.ipv4_src_len) \
        if mask.ipv4_src_len else 0
    dst = _masked_ip(packet.get("ipv4_dst", "0.0.0.0"), mask.ipv4_dst_len) \
        if mask.ipv4_dst_len else 0
    return tuple(packet[n] for n in mask.fields), src, dst


def compile_table(flows: Iterable) -> list[Subtable]:
    """Flow entries (``priority``, ``match``, ``actions``, ``cookie``, as
    :class:`controllers.routing.tables.FlowEntry` has them) as subtables, highest priority
    first. Of two flows with the same match the higher priority's is kept (the other can never
    match).

    Raises:
        UnsupportedMatch: a flow this datapath cannot match, or more than
            :data:`MAX_SUBTABLES` masks (``OFPBMC_BAD_WILDCARDS``: one more distinct mask).
    """
    tables: dict[Mask, Subtable] = {}
    for flow in flows:
        mask, key = split_match(flow.match)
        table = tables.setdefault(mask, Subtable(mask))
        known = table.entries.get(key)
        if known is None or flow.priority > known.priority:
            table.entries[key] = Entry(flow.priority, tuple(flow.actions),
                                       getattr(flow, "cookie", 0))
        table.max_priority = max(table.max_priority, flow.priority)
    if len(tables) > MAX_SUBTABLES:
        raise UnsupportedMatch(f"{len(tables)} distinct masks; the eBPF datapath looks up at "
                               f"most {MAX_SUBTABLES}", OFPBMC_BAD_WILDCARDS)
    return sorted(tables.values(), key=lambda t: (-t.max_priority, t.mask))


def lookup(subtables: list[Subtable], packet: dict) -> tuple[Entry | None, int]:
    """The highest-priority entry matching ``packet`` (a dict of header fields, IPv4 addresses
    as strings) and how many subtables were looked up to find it."""
    best: Entry | None = None
    probes = 0
    for table in subtables[:MAX_SUBTABLES]:
        if best is not None and best.priority >= table.max_priority:
            break  # no entry left can outrank it
        probes += 1
        key = packet_key(table.mask, packet)
        entry = table.entries.get(key) if key is not None else None
        if entry is not None and (best is None or entry.priority > best.priority):
            best = entry
    return best, probes
