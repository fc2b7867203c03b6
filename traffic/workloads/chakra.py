"""Chakra execution traces (pure): the MLCommons format ASTRA-sim reads, replayed as workload
entries.

A trace is one file per rank (``NAME.0.et``, ``NAME.1.et``, ...), each a sequence of
length-delimited protobuf messages (a varint length, then the message): a ``GlobalMetadata``,
then ``Node``s (``schema/protobuf/et_def.proto`` of mlcommons/chakra). Only the fields replay
needs are decoded here, from the wire format (no generated code): a node's ``id`` (1),
``name`` (2), ``type`` (3: 4 compute, 5 send, 6 receive, 7 collective), ``ctrl_deps`` (4) and
``data_deps`` (5), ``duration_micros`` (7), and its ``attr`` (10: ``name`` 1 with an integer,
boolean or string value), of which ``comm_type`` (the collective: 0 all-reduce, 2
all-gather, 5 broadcast, 6 all-to-all, 7 reduce-scatter), ``comm_size`` (bytes),
``comm_src`` and ``comm_dst``.

Replay follows the dependencies: every node becomes ready once the nodes it depends on are
done, compute nodes taking their ``duration_micros``, communication taking no time in this
walk; the communication nodes of rank 0's trace, in the order they become ready, are the
collectives, each after the compute on its critical path since the one before (its gap).
Point-to-point sends become ``send_recv`` entries between their two ranks.
"""

from __future__ import annotations

import heapq
import struct
from dataclasses import dataclass, field

from testbed.errors import ConfigError

COMP, SEND, RECV, COLL = 4, 5, 6, 7
COLLECTIVES = {0: "all_reduce", 1: "all_reduce", 2: "all_gather", 5: "broadcast",
               6: "all_to_all", 7: "reduce_scatter", 8: "reduce_scatter"}  # REDUCE as all-reduce
MAX_NODES = 1_000_000


@dataclass
class Node:
    """The decoded part of a Chakra node."""

    id: int
    name: str = ""
    type: int = 0
    deps: list[int] = field(default_factory=list)  # control and data dependencies
    duration_us: int = 0
    attrs: dict[str, object] = field(default_factory=dict)


# -- the protobuf wire format ---------------------------------------------------------------

def _varint(data: bytes, i: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        if i >= len(data) or shift > 63:
            raise ValueError("truncated or overlong varint")
        b = data[i]
        out |= (b & 0x7F) << shift
        i += 1
        if not b & 0x80:
            return out, i
        shift += 7


def _fields(data: bytes):
    """(field number, wire type, value) of a message: ints for varints and fixed, bytes for
    length-delimited."""
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 1:
            value, i = struct.unpack_from("<Q", data, i)[0], i + 8
        elif wire == 2:
            size, i = _varint(data, i)
            if i + size > len(data):
                raise ValueError("a field runs past its message")
            value, i = data[i:i + size], i + size
        elif wire == 5:
            value, i = struct.unpack_from("<I", data, i)[0], i + 4
        else:
            raise ValueError(f"wire type {wire} is not protobuf 3's")
        yield number, wire, value


def _attr(data: bytes) -> tuple[str, object]:
    name, value = "", None
    for number, wire, v in _fields(data):
        if number == 1:
            name = v.decode("utf-8", "replace")
        elif number in (7, 9, 11, 13) and wire == 0:  # int32, int64, uint32, uint64
            value = v - (1 << 64) if number in (7, 9) and v >= 1 << 63 else v
        elif number == 27:
            value = bool(v)
        elif number == 29:
            value = v.decode("utf-8", "replace")
    return name, value


def _node(data: bytes) -> Node:
    node = Node(0)
    for number, wire, v in _fields(data):
        if number == 1:
            node.id = v
        elif number == 2:
            node.name = v.decode("utf-8", "replace")
        elif number == 3:
            node.type = v
        elif number in (4, 5):  # repeated uint64: packed (wire 2) or one by one
            if wire == 2:
                j = 0
                while j < len(v):
                    dep, j = _varint(v, j)
                    node.deps.append(dep)
            else:
                node.deps.append(v)
        elif number == 7:
            node.duration_us = v
        elif number == 10:
            key, value = _attr(v)
            node.attrs[key] = value
    return node


def read_trace(data: bytes, where: str) -> list[Node]:
    """A rank's nodes (the first message, the global metadata, skipped).

    Raises:
        ConfigError: at ``where`` for a file that is not a Chakra trace.
    """
    nodes, i, first = [], 0, True
    try:
        while i < len(data):
            size, i = _varint(data, i)
            if i + size > len(data):
                raise ValueError("a message runs past the end of the file")
            message, i = data[i:i + size], i + size
            if first:
                first = False
                continue
            nodes.append(_node(message))
            if len(nodes) > MAX_NODES:
                raise ValueError(f"more than {MAX_NODES:,} nodes")
    except (ValueError, struct.error) as err:
        raise ConfigError(where, f"not a Chakra execution trace: {err}") from None
    return nodes


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        out.append(b | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _key(number: int, wire: int) -> bytes:
    return _encode_varint(number << 3 | wire)


def _delimited(number: int, payload: bytes) -> bytes:
    return _key(number, 2) + _encode_varint(len(payload)) + payload


def encode_trace(nodes: list[Node], version: str = "0.0.4") -> bytes:
    """A rank's trace as Chakra writes it (the fields :func:`read_trace` reads): the
    generated samples of the tests, and a way to hand-make one."""
    out = bytearray()
    meta = _delimited(1, version.encode())
    out += _encode_varint(len(meta)) + meta
    for n in nodes:
        msg = _key(1, 0) + _encode_varint(n.id) + _delimited(2, n.name.encode())
        msg += _key(3, 0) + _encode_varint(n.type)
        if n.deps:
            msg += _delimited(5, b"".join(_encode_varint(d) for d in n.deps))
        msg += _key(7, 0) + _encode_varint(n.duration_us)
        for name, value in n.attrs.items():
            attr = _delimited(1, name.encode())
            if isinstance(value, bool):
                attr += _key(27, 0) + _encode_varint(int(value))
            elif isinstance(value, int):
                attr += _key(9, 0) + _encode_varint(value & (1 << 64) - 1)
            else:
                attr += _delimited(29, str(value).encode())
            msg += _delimited(10, attr)
        out += _encode_varint(len(msg)) + msg
    return bytes(out)


# -- replay ---------------------------------------------------------------------------------

def _ready_order(nodes: list[Node], where: str) -> list[tuple[float, Node]]:
    """The communication nodes with the time their dependencies are done (compute nodes
    taking their duration, communication none), in that order.

    Raises:
        ConfigError: a dependency on no node, or a cycle.
    """
    by_id = {n.id: n for n in nodes}
    waiting = {n.id: len(set(n.deps)) for n in nodes}
    children: dict[int, list[int]] = {}
    for n in nodes:
        for dep in set(n.deps):
            if dep not in by_id:
                raise ConfigError(where, f"node {n.id} depends on node {dep}, which the trace "
                                         "does not have")
            children.setdefault(dep, []).append(n.id)
    ready = {n.id: 0.0 for n in nodes}
    heap = [(0.0, n.id) for n in nodes if not waiting[n.id]]
    heapq.heapify(heap)
    out, done = [], 0
    while heap:
        at, nid = heapq.heappop(heap)
        node, done = by_id[nid], done + 1
        end = at + (node.duration_us / 1e6 if node.type == COMP else 0.0)
        if node.type in (SEND, RECV, COLL):
            out.append((at, node))
        for child in children.get(nid, []):
            ready[child] = max(ready[child], end)
            waiting[child] -= 1
            if not waiting[child]:
                heapq.heappush(heap, (ready[child], child))
    if done != len(nodes):
        raise ConfigError(where, "the trace's dependencies form a cycle")
    return out


def entries(traces: list[list[Node]], source: str) -> list[tuple[dict, str]]:
    """Workload entries of a trace set (``traces[r]``: rank r's nodes): rank 0's collectives
    and every rank's sends, in the order their dependencies are done, each with the compute
    gap before it; a collective on every rank, a send as ``send_recv`` from its rank to
    ``comm_dst`` (the receive is the same message).

    Raises:
        ConfigError: naming the file and node of a collective fabriclab has no schedule for,
            or ranks whose traces disagree on their collectives.
    """
    ranks = len(traces)
    counts = {sum(1 for n in t if n.type == COLL) for t in traces}
    if len(counts) > 1:
        raise ConfigError(source, f"the ranks' traces hold different numbers of collectives "
                                  f"({', '.join(map(str, sorted(counts)))})")
    timeline = [(at, 0, node) for at, node in _ready_order(traces[0], f"{source}.0.et")
                if node.type == COLL]
    for rank, nodes in enumerate(traces):  # every rank's sends, where its own walk has them
        timeline += [(at, rank, node) for at, node in _ready_order(nodes, f"{source}.{rank}.et")
                     if node.type == SEND]
    out, last = [], 0.0
    for at, rank, node in sorted(timeline, key=lambda t: (t[0], t[1], t[2].id)):
        where = f"{source}.{rank}.et node {node.id}"
        gap, last = max(0.0, at - last), max(last, at)
        size = int(node.attrs.get("comm_size") or 0)
        if size <= 0:
            continue  # an empty message moves nothing
        if node.type == SEND:
            dst = int(node.attrs.get("comm_dst", -1))
            if not 0 <= dst < ranks or dst == rank:
                raise ConfigError(where, f"a send from rank {rank} to rank {dst} of {ranks}")
            out.append(({"op": "send_recv", "size": size, "rank_ids": [rank, dst],
                         "gap_s": gap, "label": f"chakra {node.name}"[:80]}, where))
            continue
        op = COLLECTIVES.get(int(node.attrs.get("comm_type", -1)))
        if op is None:
            raise ConfigError(where, f"collective type {node.attrs.get('comm_type')} has no "
                                     f"schedule here (known: {sorted(COLLECTIVES)})")
        out.append(({"op": op, "size": size, "ranks": ranks, "gap_s": gap,
                     "label": f"chakra {node.name}"[:80]}, where))
    if not out:
        raise ConfigError(source, "the trace has no communication")
    return out
