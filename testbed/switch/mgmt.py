"""The eBPF switches' management sockets: each switch listens on a Unix socket
(``NAME.mgmt`` in the run's folder for them, as Open vSwitch's bridges do) for OpenFlow tools
such as ``ovs-ofctl``, each connection a read-only session over the switch's live tables and
counters (:meth:`testbed.openflow.session.SwitchSession.mirror`). Served on the switch
agent's loop (:mod:`testbed.switch.agent`): its selector, its lock."""

from __future__ import annotations

import selectors
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from testbed.linux.files import unix_address
from testbed.openflow.session import SwitchSession
from testbed.paths import MGMT_SUFFIX

MAX_CONNS = 16  # management connections at once, per agent


@dataclass
class _Conn:
    """A management connection (``ovs-ofctl``) to one switch."""

    switch: str
    sock: socket.socket
    session: SwitchSession


class Management:
    """The management sockets of an agent's switches.

    Args:
        folder: where the sockets are made (the run's).
        selector: the agent's selector (a tool's socket is served on its loop).
        live: a switch's session with its controller now (None: not connected).
        lock: the agent's lock, held while a tool reads the tables.
    """

    def __init__(self, folder: Path, selector: selectors.BaseSelector,
                 live: Callable[[str], SwitchSession | None], lock: threading.Lock) -> None:
        self.folder = folder
        self.selector = selector
        self.live = live
        self.lock = lock
        self.specs: dict[str, tuple] = {}  # switch -> (its spec, its counters)
        self.listeners: list[socket.socket] = []
        self.conns: dict[int, _Conn] = {}  # a connection by its socket's descriptor

    def listen(self, switches: dict[str, tuple]) -> list[str]:
        """Every switch's socket, listening (``switches``: name -> (spec, counters); a stale
        file of a killed run's is replaced: the folder is this run's). A socket's path may be
        longer than a Unix address holds (108 bytes): it is bound through the folder's
        descriptor in ``/proc/self/fd``, as Open vSwitch binds its own (and ovs-ofctl
        connects so). Returns what could not be made; the switches forward all the same."""
        self.specs = dict(switches)
        errors = []
        self.folder.mkdir(parents=True, exist_ok=True)
        for name in switches:
            path = self.folder / f"{name}{MGMT_SUFFIX}"
            path.unlink(missing_ok=True)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                with unix_address(path) as address:
                    sock.bind(address)
                path.chmod(0o600)  # root's, as Open vSwitch's are
                sock.listen(4)
            except OSError as err:
                sock.close()
                errors.append(f"{name}: no management socket {path}: {err}")
                continue
            sock.setblocking(False)
            self.listeners.append(sock)
            self.selector.register(sock, selectors.EVENT_READ, ("listen", name))
        return errors

    def event(self, key: tuple, sock: socket.socket) -> None:
        """A socket of theirs is readable: ``("listen", switch)`` a tool connecting,
        ``("mgmt", fd)`` a tool's request."""
        kind, what = key
        if kind == "listen":
            self._accept(what, sock)
            return
        conn = self.conns.get(what)
        if conn is None:
            return
        try:
            data = conn.sock.recv(65536)
        except OSError:
            data = b""
        live = self.live(conn.switch)
        if not data or live is None:  # the tool is done, or the switch has no tables now
            self._close(conn)
            return
        with self.lock:
            replies = conn.session.mirror(live).receive(data)
        self._send(conn, replies)

    def _accept(self, switch: str, listener: socket.socket) -> None:
        try:
            peer, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        if len(self.conns) >= MAX_CONNS:
            peer.close()
            return
        spec, counters = self.specs[switch]
        session = SwitchSession(spec.dpid, spec.ports, read_only=True, counters=counters)
        peer.settimeout(1.0)  # replies are small; a tool reads them at once
        conn = self.conns[peer.fileno()] = _Conn(switch, peer, session)
        self.selector.register(peer, selectors.EVENT_READ, ("mgmt", peer.fileno()))
        self._send(conn, session.start())

    def _send(self, conn: _Conn, data: bytes) -> None:
        try:
            conn.sock.sendall(data)
        except OSError:
            self._close(conn)

    def _close(self, conn: _Conn) -> None:
        fd = conn.sock.fileno()
        if fd >= 0 and self.conns.pop(fd, None) is not None:
            self.selector.unregister(conn.sock)
        conn.sock.close()

    def close(self) -> None:
        """Every tool's connection and every listening socket closed (the files go with the
        run's folder)."""
        for conn in list(self.conns.values()):
            self._close(conn)
        for sock in self.listeners:
            try:
                self.selector.unregister(sock)
            except (KeyError, ValueError):
                pass
            sock.close()
        self.listeners.clear()
