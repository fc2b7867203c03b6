"""Import the collectives a real job issued from NCCL's ``NCCL_DEBUG=INFO`` log lines.

NCCL (``NCCL_DEBUG_SUBSYS=COLL``) prints one line per rank per collective::

    host:pid:tid [local rank] NCCL INFO AllReduce: opCount 1a sendbuff 0x.. recvbuff 0x..
        count 64 datatype 7 op 0 root 0 comm 0x7f0c741162f0 [nranks=2] stream 0x..

Every rank of a communicator prints its own line for the same opCount, with its own ``comm``
pointer, so lines are grouped into collectives by (opCount, op, nranks, count, datatype). Other
lines are skipped, as are launcher prefixes before the ``host:pid:tid`` field. Sizes come from
NCCL's ``ncclDataType_t`` enum.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from testbed.errors import ConfigError

# ncclDataType_t: int8, uint8, int32, uint32, int64, uint64, float16, float32, float64,
# bfloat16, then (NCCL 2.19+) fp8 e4m3 and e5m2
DATATYPE_BYTES = {0: 1, 1: 1, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 4, 8: 8, 9: 2, 10: 1, 11: 1}

# NCCL's names -> fabriclab's ops; the NCCL-tests size of each op from count x datatype size
OP_NAMES = {"AllReduce": "all_reduce", "ReduceScatter": "reduce_scatter",
            "AllGather": "all_gather", "Broadcast": "broadcast", "Reduce": "reduce",
            "Send": "send", "Recv": "recv", "AllToAll": "all_to_all"}

MARK = " NCCL INFO "
# who printed the line: the end of the text before MARK (a launcher may prefix more, such as
# mpirun's "[1,0]<stdout>:"), searched in a bounded window
_WHO = re.compile(r"(?P<host>[\w.-]+):(?P<pid>\d+):(?P<tid>\d+)\s+\[(?P<local>\d+)\]\s*$")
WHO_WINDOW = 256
# the call: from MARK on, anchored
_CALL = re.compile(
    r"\s*NCCL INFO\s+(?P<op>[A-Za-z]+):\s+opCount\s+(?P<opcount>[0-9a-fA-F]+)\s+sendbuff\s+\S+\s+"
    r"recvbuff\s+\S+\s+count\s+(?P<count>\d{1,20})\s+datatype\s+(?P<dtype>\d{1,4})\s+op\s+"
    r"(?P<redop>\d{1,4})\s+root\s+(?P<root>-?\d{1,10})\s+comm\s+(?P<comm>\S+)"
    r"(?:\s+\[nranks=(?P<nranks>\d{1,10})\])?")
MAX_LINE = 4096  # no NCCL collective line is near this long (real ones: under 200 characters)


@dataclass(frozen=True)
class NcclCall:
    """One rank's log line."""

    line_no: int
    host: str
    pid: int
    local_rank: int
    op: str  # NCCL's name, e.g. AllReduce
    op_count: int
    count: int
    datatype: int
    root: int
    comm: str
    nranks: int


@dataclass(frozen=True)
class ImportedCollective:
    """A collective as the ranks reported it."""

    op: str  # fabriclab's name (all_reduce, send, recv, ...)
    op_count: int
    nranks: int
    count: int
    datatype: int
    size_bytes: int  # NCCL-tests size: all-gather and reduce-scatter count all ranks' chunks
    reporters: int  # how many rank lines were seen
    first_line: int


def parse_line(line: str, line_no: int) -> NcclCall | None:
    """One log line, or None when it is not an NCCL collective line.

    Raises:
        ConfigError: for a collective line with an unknown datatype.
    """
    if len(line) > MAX_LINE:
        return None
    mark = line.find(MARK)
    if mark < 0:
        return None
    who = _WHO.search(line, max(0, mark - WHO_WINDOW), mark + 1)
    call = _CALL.match(line, mark)
    if who is None or call is None:
        return None
    match = {**who.groupdict(), **call.groupdict()}
    dtype = int(match["dtype"])
    if dtype not in DATATYPE_BYTES:
        raise ConfigError(f"line {line_no}", f"unknown NCCL datatype {dtype}")
    return NcclCall(line_no, match["host"], int(match["pid"]), int(match["local"]), match["op"],
                    int(match["opcount"], 16), int(match["count"]), dtype, int(match["root"]),
                    match["comm"], int(match["nranks"] or 0))


def import_log(text: str) -> list[ImportedCollective]:
    """Group the collective lines of a log into collectives, in order of first appearance.

    Raises:
        ConfigError: when no line is an NCCL collective line, naming the problem.
    """
    groups: dict[tuple, list[NcclCall]] = {}
    for no, line in enumerate(text.splitlines(), start=1):
        call = parse_line(line, no)
        if call is not None:
            key = (call.op_count, call.op, call.nranks, call.count, call.datatype, call.comm
                   if call.op in ("Send", "Recv") else None)
            groups.setdefault(key, []).append(call)
    if not groups:
        raise ConfigError("log", "no NCCL collective lines (NCCL_DEBUG=INFO "
                                 "NCCL_DEBUG_SUBSYS=COLL prints them)")
    out = []
    for (op_count, op, nranks, count, dtype, _), calls in groups.items():
        nbytes = count * DATATYPE_BYTES[dtype]
        ranks = nranks or len(calls)
        size = nbytes * ranks if op in ("AllGather", "ReduceScatter") else nbytes
        out.append(ImportedCollective(OP_NAMES.get(op, op.lower()), op_count, ranks, count,
                                      dtype, size, len(calls), calls[0].line_no))
    return out
