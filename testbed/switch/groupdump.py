"""``fabriclab ofctl SWITCH dump-groups`` for an eBPF switch: its groups read over its management
socket (OpenFlow 1.5, ``OFPMP_GROUP_DESC``) and printed as ``ovs-ofctl`` prints them.
``ovs-ofctl`` itself refuses a group whose selection method is not one of Open vSwitch's own
(``hash``, ``dp_hash``), so the switch-local methods (``flowlet``, ``packet``) would not show.
"""

from __future__ import annotations

import socket
import struct
from pathlib import Path

from os_ken.ofproto import ofproto_v1_5 as ofp

from testbed.linux.files import unix_address
from testbed.model.openflow import GroupEntry
from testbed.openflow.groups import BadGroup, describe, read_desc

HEADER = struct.Struct("!BBHI")
XID = 0x66AB


def request() -> bytes:
    """A HELLO and a group description request for every group, OpenFlow 1.5."""
    hello = HEADER.pack(ofp.OFP_VERSION, ofp.OFPT_HELLO, HEADER.size, 1)
    body = struct.pack("!HH4xI4x", ofp.OFPMP_GROUP_DESC, 0, ofp.OFPG_ALL)
    return hello + HEADER.pack(ofp.OFP_VERSION, ofp.OFPT_MULTIPART_REQUEST,
                               HEADER.size + len(body), XID) + body


def read_replies(data: bytes) -> tuple[list[GroupEntry], bool, int]:
    """The groups in the complete messages of ``data``: (groups, whether the last reply came,
    bytes used).

    Raises:
        BadGroup: an error message from the switch, or a group it cannot describe.
    """
    groups, done, offset = [], False, 0
    while offset + HEADER.size <= len(data):
        version, kind, length, xid = HEADER.unpack_from(data, offset)
        if length < HEADER.size:
            raise BadGroup(f"an OpenFlow message of length {length}")
        if offset + length > len(data):
            break
        if kind == ofp.OFPT_ERROR:
            etype, code = struct.unpack_from("!HH", data, offset + HEADER.size)
            raise BadGroup(f"the switch refused the request: error type {etype} code {code}")
        if kind == ofp.OFPT_MULTIPART_REPLY and xid == XID:
            mp_type, flags = struct.unpack_from("!HH", data, offset + HEADER.size)
            at, end = offset + HEADER.size + 8, offset + length
            while mp_type == ofp.OFPMP_GROUP_DESC and at < end:
                group, used = read_desc(data[:end], at)
                groups.append(group)
                at += used
            done = not flags & ofp.OFPMPF_REPLY_MORE
        offset += length
    return groups, done, offset


def read_groups(path: Path, timeout_s: float = 5.0) -> list[GroupEntry]:
    """A switch's groups, from its management socket at ``path`` (which may be longer than a
    Unix address holds: connected through its folder's descriptor, as it was bound).

    Raises:
        OSError: no switch listening there, or no complete answer within ``timeout_s``.
        BadGroup: as :func:`read_replies`.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        with unix_address(path) as address:
            sock.connect(address)
        sock.sendall(request())
        buf, groups = b"", []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                raise OSError(f"{path}: the switch closed the connection before answering")
            buf += chunk
            found, done, used = read_replies(buf)
            groups += found
            buf = buf[used:]
            if done:
                return groups


def dump_lines(path: Path, group_id: int | None = None) -> list[str]:
    """The switch's groups as ``ovs-ofctl dump-groups`` prints them, a line each (``group_id``'s
    alone where given).

    Raises:
        OSError, BadGroup: as :func:`read_groups`.
    """
    return [f" {describe(g)}" for g in read_groups(path)
            if group_id is None or g.group_id == group_id]
