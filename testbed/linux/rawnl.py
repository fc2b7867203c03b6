"""Raw netlink where pyroute2 is too slow or lacks a message: entering a host's network namespace,
prebuilt qdisc requests (RED, and the PFC agent's TBF pause and resume on their own socket),
and one-message dumps of links and qdiscs (the monitor's and the exporters' reads, parsed with
struct)."""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from pyroute2.netns import setns

from testbed.errors import TestbedError
from testbed.plan.tcplan import TbfSetting, class_id, leaf_handle

CLONE_NEWNET = 0x40000000


@contextmanager
def in_netns(path: str | None = None) -> Iterator[None]:
    """Run the body with the calling thread in another network namespace.

    ``path`` names a namespace file (``/proc/PID/ns/net``); None enters a new anonymous one,
    which lives as long as a socket opened in the body. Sockets opened in the body stay bound
    to that namespace. (pyroute2's own ``IPRoute(netns=...)`` forks a helper process instead,
    which deadlocks when the caller already runs threads.)
    """
    saved = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        if path is None:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.unshare(CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise TestbedError(f"unshare(CLONE_NEWNET) failed: {os.strerror(err)}")
        else:
            fd = os.open(path, os.O_RDONLY)
            try:
                setns(fd)
            finally:
                os.close(fd)
        yield
    finally:
        setns(saved)
        os.close(saved)


_NLMSG_HDR = struct.Struct("=IHHII")
_TCMSG_HDR = struct.Struct("=BxxxiIII")
RTM_NEWQDISC = 36
NLM_F_REQUEST_ACK = 0x5
NLM_F_CREATE_EXCL = 0x600


def nlattr(kind: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + bytes((4 - length % 4) % 4)


def qdisc_request(kind: str, ifindex: int, handle: int, parent: int, options: bytes,
                  flags: int = NLM_F_REQUEST_ACK) -> bytes:
    """An RTM_NEWQDISC request: ``flags`` as is changes in place; with ``NLM_F_CREATE_EXCL``
    added, it creates."""
    body = (_TCMSG_HDR.pack(0, ifindex, handle, parent, 0)
            + nlattr(1, kind.encode() + b"\0") + nlattr(2, options))  # TCA_KIND, TCA_OPTIONS
    return _NLMSG_HDR.pack(_NLMSG_HDR.size + len(body), RTM_NEWQDISC, flags, 0, 0) + body


RTM_NEWTFILTER = 44
TCA_BPF_CLASSID, TCA_BPF_OPS_LEN, TCA_BPF_OPS = 3, 4, 5
ETH_P_ALL = 0x0003


def cbpf_filter_request(ifindex: int, parent: int, prio: int, classid: int,
                        program: tuple[tuple[int, int, int, int], ...]) -> bytes:
    """An RTM_NEWTFILTER request creating a ``bpf`` classifier that runs a classic BPF
    ``program`` ((code, jt, jf, k) each) and puts a packet it matches into ``classid``
    (``tc filter add ... bpf bytecode ... classid``; pyroute2 encodes eBPF descriptors only)."""
    ops = b"".join(struct.pack("=HBBI", *insn) for insn in program)
    options = (nlattr(TCA_BPF_CLASSID, struct.pack("=I", classid))
               + nlattr(TCA_BPF_OPS_LEN, struct.pack("=H", len(program)))
               + nlattr(TCA_BPF_OPS, ops))
    info = (prio << 16) | socket.htons(ETH_P_ALL)
    body = (_TCMSG_HDR.pack(0, ifindex, 0, parent, info)
            + nlattr(1, b"bpf\0") + nlattr(2, options))
    return _NLMSG_HDR.pack(_NLMSG_HDR.size + len(body), RTM_NEWTFILTER,
                           NLM_F_REQUEST_ACK | NLM_F_CREATE_EXCL, 0, 0) + body


_RED_STAB = bytes([0] + [31] * 255)  # EWMA weight 1: an idle queue's average is 0 at once
TC_RED_ECN, TC_RED_NODROP = 1, 8


def red_options(plan) -> bytes:
    """The options of a RED leaf (:class:`testbed.plan.tcplan.RedPlan`): ECN marking, no early drop
    of packets that are not ECN-capable, the instantaneous backlog (Wlog 0)."""
    parms = struct.pack("=IIIBBBB", plan.limit_bytes, plan.min_bytes, plan.max_bytes, 0, 0, 0, 0)
    max_p = min(0xFFFFFFFF, int(plan.max_p * 2 ** 32))
    flags = TC_RED_ECN | TC_RED_NODROP  # all in TCA_RED_FLAGS: the kernel refuses both places
    return (nlattr(1, parms) + nlattr(2, _RED_STAB) + nlattr(3, struct.pack("=I", max_p))
            + nlattr(4, struct.pack("=II", flags, flags)))


_NDMSG = struct.Struct("=BxxxiHBB")  # family, ifindex, state, flags, type
RTM_NEWNEIGH, NUD_PERMANENT, NDA_DST, NDA_LLADDR = 28, 0x80, 1, 2
NLM_F_REPLACE_CREATE_ACK = 0x1 | 0x4 | 0x100 | 0x400  # REQUEST | ACK | REPLACE | CREATE
BATCH_BYTES = 16 * 1024  # requests per send (their ACKs must fit the receive buffer)


def route_socket(pid: int | None) -> socket.socket:
    """An unbound rtnetlink socket in a process's network namespace (None: this thread's)."""
    if pid is None:
        return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
    with in_netns(f"/proc/{pid}/ns/net"):
        return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)


def add_neighbours(pid: int | None, ifindex: int, entries: list[tuple[str, str]]) -> None:
    """Permanent IPv4 neighbour entries (address, MAC) on interface ``ifindex`` of a namespace
    (a process's; None: the root's), many requests per send and their ACKs read after each
    batch: a thousand entries in a few milliseconds, where one request at a time through
    pyroute2 costs about a millisecond each.

    Raises:
        TestbedError: the kernel refused an entry (its errno named).
    """
    sock = route_socket(pid)
    try:
        _ack_room(sock)
        sock.bind((0, 0))
        batch = bytearray()
        waiting = 0
        for seq, (ip, mac) in enumerate(entries, start=1):
            body = (_NDMSG.pack(socket.AF_INET, ifindex, NUD_PERMANENT, 0, 0)
                    + nlattr(NDA_DST, socket.inet_aton(ip))
                    + nlattr(NDA_LLADDR, bytes.fromhex(mac.replace(":", ""))))
            batch += _NLMSG_HDR.pack(_NLMSG_HDR.size + len(body), RTM_NEWNEIGH,
                                     NLM_F_REPLACE_CREATE_ACK, seq, 0) + body
            waiting += 1
            if len(batch) >= BATCH_BYTES or seq == len(entries):
                sock.send(batch)
                _read_acks(sock, waiting, "a permanent neighbour entry")
                batch, waiting = bytearray(), 0
    finally:
        sock.close()


RTM_DELLINK, IFLA_GROUP = 17, 27
_IFINFOMSG = struct.Struct("=BxHiII")


def delete_link_group(group: int) -> None:
    """Delete every link of link group ``group`` in the root namespace, in one request.

    Raises:
        ValueError: group 0, the default group of every interface (never deleted).
        TestbedError: the kernel refused.
    """
    if group <= 0:
        raise ValueError(f"link group {group}: only a run's own group may be deleted")
    body = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + nlattr(IFLA_GROUP,
                                                                  struct.pack("=I", group))
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
    try:
        sock.bind((0, 0))
        sock.send(_NLMSG_HDR.pack(_NLMSG_HDR.size + len(body), RTM_DELLINK, 0x5, 1, 0) + body)
        try:
            _read_acks(sock, 1, f"deleting link group {group}")
        except TestbedError as err:
            if "errno 19" not in str(err):  # ENODEV: the group is empty already
                raise
    finally:
        sock.close()


SOL_NETLINK, NETLINK_CAP_ACK, SO_RCVBUFFORCE = 270, 10, 33


def _ack_room(sock: socket.socket) -> None:
    """Room for a batch's ACKs: short ones (without the request echoed back), a receive buffer
    of 4 MiB (the kernel counts each ACK's buffer, not its bytes: a few hundred overflowed
    the default)."""
    sock.setsockopt(SOL_NETLINK, NETLINK_CAP_ACK, 1)
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 1 << 22)
    except PermissionError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)


def _read_acks(sock: socket.socket, count: int, what: str) -> None:
    """Read ``count`` ACKs; raise on the first error."""
    while count:
        data = sock.recv(1 << 20)
        offset = 0
        while offset + _NLMSG_HDR.size <= len(data):
            length, kind, _flags, _seq, _pid = _NLMSG_HDR.unpack_from(data, offset)
            if kind == 2:  # NLMSG_ERROR: an ACK when its code is 0
                code = -struct.unpack_from("=i", data, offset + _NLMSG_HDR.size)[0]
                if code:
                    raise TestbedError(f"netlink: {what} refused: {os.strerror(code)} "
                                       f"(errno {code})")
                count -= 1
            offset += (length + 3) & ~3 if length else len(data)


class RawTc:
    """Prebuilt qdisc requests on raw rtnetlink sockets (one per network namespace): the PFC
    agent's TBF changes (built once per port, priority and setting; each change is one send and
    one ACK, about 0.05 ms, where pyroute2's encoding took 2-3 ms) and the RED leaves pyroute2
    cannot encode."""

    _NLMSG = _NLMSG_HDR
    _RATESPEC = struct.Struct("=BBHhHI")
    _NLMSG_ERROR = 2
    _TCA_TBF_PARMS, _TCA_TBF_BURST = 1, 6
    _LINKLAYER_ETHERNET = 1

    def __init__(self) -> None:
        self._socks: dict[int | None, socket.socket] = {}

    def close(self) -> None:
        for sock in self._socks.values():
            sock.close()
        self._socks.clear()

    def socket(self, pid: int | None) -> socket.socket:
        """The namespace's socket (None: the root namespace's)."""
        if pid not in self._socks:
            sock = route_socket(pid)
            sock.bind((0, 0))
            self._socks[pid] = sock
        return self._socks[pid]

    @classmethod
    def request(cls, ifindex: int, priority: int, tbf: TbfSetting) -> bytes:
        """The change request of a priority's TBF leaf."""
        rate = cls._RATESPEC.pack(0, cls._LINKLAYER_ETHERNET, 0, 0, 0, tbf.rate_kbit * 125)
        parms = rate + bytes(cls._RATESPEC.size) + struct.pack("=III", tbf.limit_bytes, 0, 0)
        options = nlattr(cls._TCA_TBF_PARMS, parms) + nlattr(
            cls._TCA_TBF_BURST, struct.pack("=I", tbf.burst_bytes))
        return qdisc_request("tbf", ifindex, leaf_handle(priority), class_id(priority), options)

    def send(self, pid: int | None, request: bytes, what: str) -> None:
        """Send a prebuilt request in a namespace and wait for its ACK."""
        sock = self.socket(pid)
        sock.send(request)
        data = sock.recv(65536)
        _length, kind, _f, _seq, _pid = self._NLMSG.unpack_from(data)
        if kind == self._NLMSG_ERROR:
            code = -struct.unpack_from("=i", data, self._NLMSG.size)[0]
            if code:
                raise TestbedError(f"netlink: {what} failed: {os.strerror(code)} "
                                   f"(errno {code})")


class _RawDump:
    """A raw rtnetlink socket that dumps one kind of object of its namespace and parses only
    the attributes its subclass reads (pyroute2's generic parsing costs about 1 ms of CPU per
    object; these take a few microseconds)."""

    _NLMSG = struct.Struct("=IHHII")
    _RTA = struct.Struct("=HH")
    _NLMSG_DONE, _NLMSG_ERROR = 3, 2
    _DUMP_FLAGS = 0x301  # NLM_F_REQUEST | NLM_F_DUMP

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        self.sock.bind((0, 0))
        self.seq = 0

    def close(self) -> None:
        self.sock.close()

    def _dump(self, request: int, body: bytes, reply: int, what: str,
              keep: Callable[[bytes, int], bool], parse: Callable[[bytes, int, int], object]
              ) -> list:
        """Send a dump request; ``parse(data, start, end)`` every reply message whose body
        ``keep(data, start)`` accepts."""
        self.seq += 1
        self.sock.send(self._NLMSG.pack(self._NLMSG.size + len(body), request,
                                        self._DUMP_FLAGS, self.seq, 0) + body)
        out = []
        while True:
            data = self.sock.recv(1 << 20)
            offset = 0
            while offset + self._NLMSG.size <= len(data):
                length, kind, _flags, seq, _pid = self._NLMSG.unpack_from(data, offset)
                if kind == self._NLMSG_DONE and seq == self.seq:
                    return out
                if kind == self._NLMSG_ERROR:
                    code = -struct.unpack_from("=i", data, offset + self._NLMSG.size)[0]
                    raise TestbedError(f"netlink: {what} dump failed (errno {code})")
                start = offset + self._NLMSG.size
                if kind == reply and seq == self.seq and keep(data, start):
                    out.append(parse(data, start, offset + length))
                offset += (length + 3) & ~3

    def _attrs(self, data: bytes, start: int, end: int):
        offset = start
        while offset + self._RTA.size <= end:
            length, kind = self._RTA.unpack_from(data, offset)
            if length < self._RTA.size:
                return
            yield kind & 0x3FFF, offset + self._RTA.size, length - self._RTA.size
            offset += (length + 3) & ~3


class LinkDump(_RawDump):
    """Every interface's name, counters (``IFLA_STATS64``) and operational state, in one dump."""

    _IFINFO = struct.Struct("=BxHiII")
    _RTM_GETLINK, _RTM_NEWLINK = 18, 16
    _IFLA_IFNAME, _IFLA_OPERSTATE, _IFLA_STATS64, _IFLA_GROUP = 3, 16, 23, 27
    _IF_OPER_UNKNOWN, _IF_OPER_UP = 0, 6
    _STATS = struct.Struct("=8Q")  # rx/tx packets, rx/tx bytes, rx/tx errors, rx/tx dropped

    def read(self, names: set[str] | None = None,
             group: bool = False) -> dict[str, dict[str, int]]:
        """Name -> rx/tx packets, bytes and dropped and ``up`` (carrier), for ``names`` (None:
        every interface); with ``group``, also ``group`` (the link group)."""
        body = self._IFINFO.pack(0, 0, 0, 0, 0)
        rows = self._dump(self._RTM_GETLINK, body, self._RTM_NEWLINK, "link",
                          lambda _data, _start: True, self._link)
        out = {name: stats for name, stats in rows if names is None or name in names}
        if not group:
            for stats in out.values():
                del stats["group"]
        return out

    def _link(self, data: bytes, start: int, end: int) -> tuple[str, dict]:
        name, stats = "", {"up": False, "group": 0}
        for kind, at, length in self._attrs(data, start + self._IFINFO.size, end):
            if kind == self._IFLA_IFNAME:
                name = data[at:at + length].rstrip(b"\0").decode()
            elif kind == self._IFLA_OPERSTATE and length >= 1:
                # a device without carrier of its own (a cut link's VXLAN end) reports UNKNOWN
                # while it is up; taken down, DOWN
                stats["up"] = data[at] in (self._IF_OPER_UP, self._IF_OPER_UNKNOWN)
            elif kind == self._IFLA_GROUP and length >= 4:
                stats["group"] = struct.unpack_from("=I", data, at)[0]
            elif kind == self._IFLA_STATS64 and length >= self._STATS.size:
                (stats["rx_packets"], stats["tx_packets"], stats["rx_bytes"], stats["tx_bytes"],
                 _rx_err, _tx_err, stats["rx_dropped"], stats["tx_dropped"]
                 ) = self._STATS.unpack_from(data, at)
        return name, stats


class LinkEvents(LinkDump):
    """The root namespace's link announcements (``RTMGRP_LINK``): which interfaces went up or
    down (operational state), read when :meth:`fileno` is readable. Should the kernel drop
    announcements (the socket's buffer full), a dump gives every interface's state instead."""

    _RTMGRP_LINK, _RTM_DELLINK = 1, 17

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
        self.sock.bind((0, self._RTMGRP_LINK))
        self.sock.setblocking(False)
        self.seq = 0

    def fileno(self) -> int:
        return self.sock.fileno()

    def changes(self) -> list[tuple[str, bool]]:
        """(interface, up) of every announcement since the last call, in order."""
        out: list[tuple[str, bool]] = []
        while True:
            try:
                data = self.sock.recv(1 << 20)
            except BlockingIOError:
                return out
            except OSError as err:
                if err.errno != errno.ENOBUFS:
                    raise
                dump = LinkDump()
                try:
                    return out + [(name, st["up"]) for name, st in dump.read().items()]
                finally:
                    dump.close()
            offset = 0
            while offset + self._NLMSG.size <= len(data):
                length, kind, _flags, _seq, _pid = self._NLMSG.unpack_from(data, offset)
                if kind in (self._RTM_NEWLINK, self._RTM_DELLINK) and length:
                    name, stats = self._link(data, offset + self._NLMSG.size, offset + length)
                    out.append((name, stats["up"] and kind == self._RTM_NEWLINK))
                offset += max((length + 3) & ~3, self._NLMSG.size)


class QdiscDump(_RawDump):
    """Every qdisc's counters (``TCA_STATS2``: basic bytes/packets, queue length, backlog,
    drops), in one dump."""

    _TCMSG = struct.Struct("=BxxxiIII")
    _RTM_GETQDISC, _RTM_NEWQDISC = 38, 36
    _TCA_KIND, _TCA_STATS2, _TCA_STATS_BASIC, _TCA_STATS_QUEUE, _TCA_STATS_APP = 1, 7, 1, 3, 4

    def read(self, handles: set[int] | None = None) -> list[tuple[int, int, dict[str, int]]]:
        """(interface index, qdisc handle, counters) of every qdisc (or of those with one of
        ``handles``: the others' attributes are not parsed), now."""
        return self._dump(
            self._RTM_GETQDISC, self._TCMSG.pack(0, 0, 0, 0, 0), self._RTM_NEWQDISC, "qdisc",
            lambda data, start: handles is None or self._TCMSG.unpack_from(data, start)[2]
            in handles, self._qdisc)

    def _qdisc(self, data: bytes, start: int, end: int) -> tuple[int, int, dict[str, int]]:
        _family, index, handle, _parent, _info = self._TCMSG.unpack_from(data, start)
        stats = {"bytes": 0, "packets": 0, "drops": 0, "backlog_bytes": 0, "backlog_packets": 0,
                 "marked": 0}
        red = False
        for kind, payload, plen in self._attrs(data, start + self._TCMSG.size, end):
            if kind == self._TCA_KIND:
                red = data[payload:payload + plen].rstrip(b"\0") == b"red"
            if kind != self._TCA_STATS2:
                continue
            for sub, at, slen in self._attrs(data, payload, payload + plen):
                if sub == self._TCA_STATS_BASIC and slen >= 12:
                    stats["bytes"], stats["packets"] = struct.unpack_from("=QI", data, at)
                elif sub == self._TCA_STATS_QUEUE and slen >= 12:
                    qlen, backlog, drops = struct.unpack_from("=III", data, at)
                    stats.update(backlog_packets=qlen, backlog_bytes=backlog, drops=drops)
                elif sub == self._TCA_STATS_APP and red and slen >= 16:  # tc_red_xstats
                    stats["marked"] = struct.unpack_from("=IIII", data, at)[3]
        return index, handle, stats
