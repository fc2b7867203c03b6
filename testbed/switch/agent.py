"""The control side of the eBPF switches of one machine: one OpenFlow connection per switch to
the controller, its :class:`testbed.openflow.session.SwitchSession`, and what the controller set
installed into the datapath (flow tables compiled as tuple-space subtables, groups) before any
reply to the messages that set it is sent, so a barrier reply means installed. The other way:
the packets the datapath punts go to the controller as packet-ins, a port's carrier change
(as netlink announces it) as a port status after the datapath's groups stopped using the port,
and statistics requests are answered from the datapath's counters.

One thread serves every switch (a selector over their sockets, the punt ring and the link
announcements), and with a management folder the switches' management sockets for tools such
as ``ovs-ofctl`` (:mod:`testbed.switch.mgmt`). The datapath is anything with the methods of :class:`Datapath`
(:class:`testbed.linux.ebpfswitch.EbpfSwitches` on a machine, a fake in the unit tests).
"""

from __future__ import annotations

import selectors
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from testbed.errors import TestbedError
from testbed.linux.files import unix_address
from testbed.plan import tss
from testbed.model.openflow import FlowEntry, GroupEntry
from testbed.openflow.replies import PortCounters
from testbed.openflow.session import Port, SwitchSession
from testbed.paths import SIGNAL_SOCKET
from testbed.switch.derive import Derived, NextHops
from testbed.switch.mgmt import Management


class Datapath(Protocol):
    """What the agent installs into."""

    def set_table(self, sw: int, subtables: list[tss.Subtable]) -> None: ...

    def set_group(self, sw: int, group_id: int, kind: str, ports: list[int],
                  weights: list[int] | None = None, basis: int = 0, selection: str = "hash",
                  gap_us: int = 0, beyond: NextHops | None = None,
                  rebalance: tuple[int, int] = (0, 0)) -> None: ...

    def delete_group(self, sw: int, group_id: int) -> None: ...

    def set_live(self, sw: int, port: int, live: bool) -> None: ...

    def counters(self, sw: int, mask: tss.Mask, key: tuple) -> tuple[int, int]: ...

    def port_counters(self, names: set[str]) -> dict[str, dict[str, int]]: ...

    def read_punts(self) -> list[tuple[object, bytes]]: ...

    @property
    def punts(self): ...  # readable (``fileno``) when punted packets wait


class LinkWatch(Protocol):
    """Link announcements (:class:`testbed.linux.rawnl.LinkEvents`)."""

    def fileno(self) -> int: ...

    def changes(self) -> list[tuple[str, bool]]: ...

    def close(self) -> None: ...


@dataclass
class SwitchSpec:
    """One switch: its index in the datapath's maps, its datapath id and its ports."""

    index: int
    dpid: int
    ports: list[Port]
    #: port number -> the switch behind it (switch-to-switch links only): where fault notices
    #: go (:mod:`testbed.plan.notices`), whose path quality a local choice weighs (``lookahead``)
    peers: dict[int, str] = field(default_factory=dict)


@dataclass
class _Conn:
    spec: SwitchSpec
    sock: socket.socket
    session: SwitchSession
    dirty: bool = False
    # what the datapath holds: the session's groups and flows as last installed
    groups: dict[int, GroupEntry] = field(default_factory=dict)
    ahead: dict[int, NextHops] = field(default_factory=dict)  # their next switches' groups
    flows: dict[tuple, FlowEntry] = field(default_factory=dict)
    out: bytes = b""


class _Counters:
    """A switch's statistics, read from the datapath when the controller asks."""

    def __init__(self, datapath: Datapath, spec: SwitchSpec) -> None:
        self.datapath, self.spec = datapath, spec

    def ports(self) -> dict[int, PortCounters]:
        read = self.datapath.port_counters({p.name for p in self.spec.ports})
        return {p.number: PortCounters(**{k: v for k, v in read[p.name].items() if k != "up"})
                for p in self.spec.ports if p.name in read}

    def flow(self, entry: FlowEntry) -> tuple[int, int]:
        try:
            mask, key = tss.split_match(entry.match)
        except tss.UnsupportedMatch:
            return (0, 0)
        return self.datapath.counters(self.spec.index, mask, key)


#: how long after a table change the notices and next switches' groups are worked out again (a
#: port's change: at once); notices only take ports away, so ones a few milliseconds stale
#: still loop nowhere
NOTICES_COALESCE_S = 0.005
RECONNECT_S, RECONNECT_MAX_S = 0.1, 2.0  # a lost connection's first retry, and the longest wait
_PUNTS, _LINKS, _WAKE = "\0punts", "\0links", "\0wake"  # selector keys beside switch names
_SIGNALS = "\0signals"


def tell_lost_signal(folder: Path, ifname: str) -> bool:
    """Tell the switch agent whose management folder is ``folder`` that the link behind its
    port ``ifname`` lost its signal (another process's failure: the agent sends the port's
    status at once instead of at the carrier's loss, 6-16 ms later). False: no agent there."""
    try:
        with unix_address(folder / SIGNAL_SOCKET) as address, \
                socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(ifname.encode(), address)
        return True
    except OSError:
        return False


class SwitchAgent:
    """Connects every switch of ``switches`` (name -> spec) to the controller at
    ``controller`` and serves them until :meth:`stop`.

    Raises (from :meth:`start`):
        TestbedError: the controller does not accept a switch's connection.
    """

    def __init__(self, datapath: Datapath, switches: dict[str, SwitchSpec],
                 controller: tuple[str, int], links: LinkWatch | None = None,
                 tls: ssl.SSLContext | None = None, mgmt_dir: Path | None = None,
                 notify: bool = True) -> None:
        self.datapath = datapath
        #: fault notices between the switches (:mod:`testbed.plan.notices`): on, the groups
        #: installed are the controller's less the ports whose switch stranded their routes
        self.notify = notify
        #: the notices' exclusions and the next switches' groups (what every table implies)
        self.derived = Derived(notify, {n: s.peers for n, s in switches.items()},
                               {n: s.index for n, s in switches.items()})
        #: when they are to be worked out again (monotonic; None: nothing changed)
        self.notices_at: float | None = None
        self.mgmt_dir = mgmt_dir  # each switch's management socket here (None: none)
        self.tls = tls  # OpenFlow over TLS: the run's client context (controller.tls)
        self.switches = switches
        self.controller = controller
        self.links = links
        # a port's interface -> (its switch, its number); a switch's index -> its name
        self.port_of = {p.name: (name, p.number) for name, spec in switches.items()
                        for p in spec.ports}
        self.by_index = {spec.index: name for name, spec in switches.items()}
        self.disconnects: list[str] = []  # connections lost (each one reconnected)
        #: version negotiations the switches refused (the controller speaks no version of
        #: theirs): no reconnection will do better
        self.refusals: list[str] = []
        self.backoff: dict[str, float] = {}
        self.reconnect_at: dict[str, tuple[float, SwitchSession]] = {}
        self.conns: dict[str, _Conn] = {}
        self.selector = selectors.DefaultSelector()
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.raw: socket.socket | None = None  # the controller's packet-outs go out by it
        self._waker = socket.socketpair()  # another thread's message to send: a byte here
        self.mgmt: Management | None = None  # the switches' management sockets
        self.signals: socket.socket | None = None  # lost signals told by other processes

    def start(self) -> None:
        for name, spec in self.switches.items():
            try:
                self._connect(name, SwitchSession(spec.dpid, spec.ports,
                                                  counters=_Counters(self.datapath, spec)))
            except OSError as err:
                self.stop()
                raise TestbedError(f"switch {name}: the controller at {self.controller[0]}:"
                                   f"{self.controller[1]} refused it: {err}") from None
        if self.mgmt_dir is not None:
            self.mgmt = Management(self.mgmt_dir, self.selector, self._sessions, self.lock)
            self.errors += self.mgmt.listen({name: (spec, _Counters(self.datapath, spec))
                                             for name, spec in self.switches.items()})
        self._waker[0].setblocking(False)
        self.selector.register(self._waker[0], selectors.EVENT_READ, _WAKE)
        if self.mgmt_dir is not None:
            self._listen_signals(self.mgmt_dir)
        self.selector.register(self.datapath.punts, selectors.EVENT_READ, _PUNTS)
        if self.links is not None:
            self.selector.register(self.links, selectors.EVENT_READ, _LINKS)
        self.thread = threading.Thread(target=self._serve, name="switch-agent", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(10)
        for conn in self.conns.values():
            try:
                self.selector.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
            conn.sock.close()
        self.conns.clear()
        if self.mgmt is not None:
            self.mgmt.close()
            self.mgmt = None
        if self.signals is not None:
            self.signals.close()
            (self.mgmt_dir / SIGNAL_SOCKET).unlink(missing_ok=True)
            self.signals = None
        if self.raw is not None:
            self.raw.close()
            self.raw = None
        if self.links is not None:
            self.links.close()
            self.links = None
        for end in self._waker:
            end.close()
        self.selector.close()

    close = stop  # a fabric service: closed at teardown

    def states(self) -> dict[str, tuple[bool, int]]:
        """Each switch: whether it is connected to the controller, and how many flows and
        groups it holds (read from another thread: a snapshot)."""
        with self.lock:
            conns = dict(self.conns)
        return {name: (conns[name].session.handshaken, len(conns[name].session.flows)
                       + len(conns[name].session.groups)) if name in conns else (False, 0)
                for name in self.switches}

    def set_port(self, name: str, port: int, live: bool) -> None:
        """A port's carrier changed: the datapath's groups stop (or start) using it at once,
        then the controller is told (once a change: a second call of the same is nothing).
        Any thread may call it."""
        conn = self.conns.get(name)
        if conn is None:
            return
        with self.lock:
            if conn.session.ports[port].live == live:
                return
            self.datapath.set_live(conn.spec.index, port, live)
            conn.out += conn.session.port_status(port, live)
            if self.notify:  # a port: at once
                self.notices_at = 0.0
        try:
            self._waker[1].send(b"x")
        except OSError:  # stopped
            pass

    def signal(self, ifname: str, lost: bool) -> None:
        """A link behind switch port ``ifname`` lost its signal (:mod:`testbed.fabric.linkfail`):
        not live at once. Its return is the carrier's, announced when the link is up."""
        if lost and ifname in self.port_of:
            self.set_port(*self.port_of[ifname], False)

    def _listen_signals(self, folder: Path) -> None:
        """The datagram socket other processes tell a lost signal by (:func:`tell_lost_signal`);
        without it they are heard at the carrier's loss."""
        path = folder / SIGNAL_SOCKET
        path.unlink(missing_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            with unix_address(path) as address:
                sock.bind(address)
            path.chmod(0o600)
        except OSError as err:
            sock.close()
            self.errors.append(f"agent: no signal socket {path}: {err}")
            return
        sock.setblocking(False)
        self.signals = sock
        self.selector.register(sock, selectors.EVENT_READ, _SIGNALS)

    def _signalled(self) -> None:
        """Every lost signal told so far (a failure's ends come together: one round of
        notices for all of them)."""
        while True:
            try:
                ifname = self.signals.recv(256).decode(errors="replace")
            except OSError:  # none left (EAGAIN)
                return
            self.signal(ifname, True)

    def _punts(self) -> None:
        for head, data in self.datapath.read_punts():
            conn = self.conns.get(self.by_index.get(head.sw, ""))
            if conn is not None:
                with self.lock:
                    conn.out += conn.session.packet_in(head.port, head.total_len, data)

    def _links(self) -> None:
        for ifname, up in self.links.changes():
            if ifname in self.port_of:
                self.set_port(*self.port_of[ifname], up)

    def _send_frames(self, conn: _Conn) -> None:
        """The controller's packet-outs, sent out of their ports."""
        frames, conn.session.packets_out = conn.session.packets_out, []
        names = {p.number: p.name for p in conn.spec.ports} if frames else {}
        for port, frame in frames:
            try:
                if self.raw is None:  # one socket for every port (closing one costs an RCU
                    self.raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)  # grace period)
                self.raw.sendto(frame, (names[port], 0))
            except OSError:  # a port that is down (ENETDOWN): the frame is lost, as on a wire
                pass

    @property
    def excluded(self):
        """Per switch and group, the ports fault notices took (:mod:`testbed.plan.notices`)."""
        return self.derived.excluded

    @property
    def notice_log(self) -> list[tuple[float, str, int, tuple[int, ...]]]:
        """What the notices did, the newest 1000: (monotonic time, switch, group, ports out)."""
        return self.derived.log

    def _install(self, conn: _Conn, notify: bool = True) -> None:
        """The session's tables into the datapath: the groups that changed, the flow table if
        a flow did (a reroute changes a group or two, one message each, and each message is
        installed before the next is read). A group goes in less the ports fault notices
        took from it, with the next switches' groups its choice weighs."""
        session, sw, name = conn.session, conn.spec.index, self.by_index[conn.spec.index]
        installed, ahead = {}, {}
        for gid, group in session.groups.items():
            group, hops = self.derived.group(name, gid, group)
            installed[gid], ahead[gid] = group, hops
            if conn.groups.get(gid) != group or conn.ahead.get(gid, []) != hops:
                self.datapath.set_group(sw, gid, group.kind, list(group.ports),
                                        list(group.weights) or None, group.hash_basis,
                                        group.selection, group.gap_us, hops or None,
                                        group.rebalance)
        if session.flows != conn.flows:
            self.datapath.set_table(sw, tss.compile_table(session.flows.values()))
        for gid in set(conn.groups) - set(session.groups):
            self.datapath.delete_group(sw, gid)
        conn.groups, conn.ahead, conn.flows = installed, ahead, dict(session.flows)
        conn.dirty = False
        if notify and self.notices_at is None and self.derived.wanted(
                [c.session for c in list(self.conns.values())]):
            # the new tables may strand a destination (here or behind a neighbour), or no
            # longer strand one, or change what a local choice weighs: worked out once the
            # messages that come together are in (a reroute's dozen group mods)
            self.notices_at = time.monotonic() + NOTICES_COALESCE_S

    def _notices(self) -> None:
        """Fault notices and next switches' groups over every connected switch, from the
        controller's tables and the ports' liveness: the groups that change are installed
        again."""
        self.notices_at = None
        with self.lock:
            conns = dict(self.conns)
        changed = self.derived.update({n: c.session for n, c in conns.items()},
                                      time.monotonic())
        for name in changed:
            self._install(conns[name], notify=False)

    def _serve(self) -> None:
        """The agent's loop; what it did not expect is recorded (``errors``) and the loop goes
        on: one bad message or announcement must not leave every switch unprogrammed."""
        while not self.stopping.is_set():
            try:
                self._serve_once()
            except Exception as err:  # noqa: BLE001 - recorded, the switches go on
                if len(self.errors) < 100:
                    self.errors.append(f"agent: {type(err).__name__}: {err}")

    def _serve_once(self) -> None:
        if self.reconnect_at:
            self._reconnect()
        wait = 0.1 if self.notices_at is None else min(0.1, max(
            0.0, self.notices_at - time.monotonic()))
        for key, events in self.selector.select(timeout=wait):
            if key.data == _PUNTS:
                self._punts()
            elif key.data == _LINKS:
                self._links()
            elif key.data == _WAKE:
                self._waker[0].recv(4096)
            elif key.data == _SIGNALS:
                self._signalled()
            elif isinstance(key.data, tuple) and self.mgmt is not None:  # a tool's socket
                self.mgmt.event(key.data, key.fileobj)
            elif key.data in self.conns and events & selectors.EVENT_READ:
                self._receive(key.data, self.conns[key.data])
        if self.notices_at is not None and time.monotonic() >= self.notices_at:
            self._notices()
        for name, conn in list(self.conns.items()):  # what is to send, sent or waited for
            try:
                with self.lock:
                    if conn.out:
                        conn.out = conn.out[conn.sock.send(conn.out):]
                    events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.out
                                                     else 0)
                if self.selector.get_key(conn.sock).events != events:
                    self.selector.modify(conn.sock, events, name)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                continue
            except OSError as err:
                self._drop(name, conn, err)

    def _sessions(self, name: str) -> SwitchSession | None:
        """Switch ``name``'s session with its controller now (None: not connected)."""
        conn = self.conns.get(name)
        return conn.session if conn is not None else None

    def _receive(self, name: str, conn: _Conn) -> None:
        try:
            try:
                data = conn.sock.recv(65536)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return  # a TLS record not whole yet
            if not data:
                raise ConnectionError("the controller closed the connection")
            while self.tls is not None and conn.sock.pending():  # decrypted, not yet read:
                data += conn.sock.recv(65536)  # the selector would not wake for it
            replies = conn.session.receive(data)
            if conn.dirty:
                self._install(conn)  # before any reply: a barrier means installed
            self._send_frames(conn)
            with self.lock:
                conn.out += replies
            if conn.session.refused:  # HELLO_FAILED said (best effort), then the end
                if len(self.refusals) < 100:
                    self.refusals.append(f"{name}: {conn.session.refused}")
                conn.sock.send(conn.out)
                raise ConnectionError(conn.session.refused)
        except (OSError, ConnectionError, ValueError, TestbedError) as err:
            self._drop(name, conn, err)

    def _connect(self, name: str, session: SwitchSession) -> None:
        """Open switch ``name``'s connection to the controller with ``session`` (a new one at
        each connection, holding the ports' liveness) and queue its hello."""
        sock = socket.create_connection(self.controller, timeout=5)
        # each message leaves at once, as Open vSwitch's connections do (Nagle's algorithm would
        # hold a barrier's reply while an earlier message waits for its acknowledgement)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls is not None:  # the handshake while the socket blocks (at most 5 s)
            sock = self.tls.wrap_socket(sock, server_hostname=self.controller[0])
        sock.setblocking(False)
        conn = _Conn(self.switches[name], sock, session, groups=dict(session.groups),
                     flows=dict(session.flows))
        session.on_change = lambda _f, _g, c=conn: setattr(c, "dirty", True)
        conn.out = session.start()
        self.conns[name] = conn
        self.selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, name)

    def _drop(self, name: str, conn: _Conn, err: Exception) -> None:
        """The connection ended: as a switch does, it connects again (after ``RECONNECT_S``,
        doubling to ``RECONNECT_MAX_S``), its tables kept in the datapath and in its next
        session meanwhile; a controller clears and programs it again, or reads them back
        (a warm start) and changes what differs."""
        if len(self.disconnects) < 100:
            self.disconnects.append(f"{name}: {type(err).__name__}: {err}")
        self.selector.unregister(conn.sock)
        conn.sock.close()
        del self.conns[name]
        self._retry_later(name, conn.session)

    def _retry_later(self, name: str, session: SwitchSession) -> None:
        """Connect switch ``name`` again after its backoff (doubled at each try)."""
        backoff = min(RECONNECT_MAX_S, self.backoff.get(name, RECONNECT_S / 2) * 2)
        self.backoff[name] = backoff
        self.reconnect_at[name] = (time.monotonic() + backoff, session)

    def _reconnect(self) -> None:
        now = time.monotonic()
        for name, (when, old) in list(self.reconnect_at.items()):
            if when > now or self.stopping.is_set():
                continue
            del self.reconnect_at[name]
            spec = self.switches[name]
            try:
                self._connect(name, SwitchSession(spec.dpid, list(old.ports.values()),
                                                  counters=_Counters(self.datapath, spec))
                              .carry(old))
            except OSError as err:
                self._retry_later(name, old)
                if len(self.disconnects) < 100:
                    self.disconnects.append(f"{name}: reconnecting: {err}")

