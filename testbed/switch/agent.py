"""The control side of the eBPF switches of one machine: one OpenFlow connection per switch to
the controller, its :class:`testbed.switch.session.SwitchSession`, and what the controller set
installed into the datapath (flow tables compiled as tuple-space subtables, groups) before any
reply to the messages that set it is sent, so a barrier reply means installed.

One thread serves every switch (a selector over their sockets). The datapath is anything with
the methods of :class:`Datapath` (:class:`testbed.linux.ebpfswitch.EbpfSwitches` on a machine,
a fake in the unit tests).
"""

from __future__ import annotations

import selectors
import socket
import threading
from dataclasses import dataclass, field
from typing import Protocol

from testbed.errors import TestbedError
from testbed.plan import tss
from testbed.switch.session import Port, SwitchSession


class Datapath(Protocol):
    """What the agent installs into."""

    def set_table(self, sw: int, subtables: list[tss.Subtable]) -> None: ...

    def set_group(self, sw: int, group_id: int, kind: str, ports: list[int],
                  weights: list[int] | None = None, basis: int = 0) -> None: ...

    def delete_group(self, sw: int, group_id: int) -> None: ...

    def set_live(self, sw: int, port: int, live: bool) -> None: ...


@dataclass
class SwitchSpec:
    """One switch: its index in the datapath's maps, its datapath id and its ports."""

    index: int
    dpid: int
    ports: list[Port]


@dataclass
class _Conn:
    spec: SwitchSpec
    sock: socket.socket
    session: SwitchSession
    dirty: bool = False
    groups: set[int] = field(default_factory=set)  # installed in the datapath
    out: bytes = b""


class SwitchAgent:
    """Connects every switch of ``switches`` (name -> spec) to the controller at
    ``controller`` and serves them until :meth:`stop`.

    Raises (from :meth:`start`):
        TestbedError: the controller does not accept a switch's connection.
    """

    def __init__(self, datapath: Datapath, switches: dict[str, SwitchSpec],
                 controller: tuple[str, int]) -> None:
        self.datapath = datapath
        self.switches = switches
        self.controller = controller
        self.conns: dict[str, _Conn] = {}
        self.selector = selectors.DefaultSelector()
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.raw_sockets: dict[str, socket.socket] = {}  # port name -> for packet-outs

    def start(self) -> None:
        for name, spec in self.switches.items():
            try:
                sock = socket.create_connection(self.controller, timeout=5)
            except OSError as err:
                self.stop()
                raise TestbedError(f"switch {name}: the controller at {self.controller[0]}:"
                                   f"{self.controller[1]} refused it: {err}") from None
            sock.setblocking(False)
            conn = _Conn(spec, sock, SwitchSession(spec.dpid, spec.ports))
            conn.session.on_change = lambda _f, _g, c=conn: setattr(c, "dirty", True)
            conn.out = conn.session.start()
            self.conns[name] = conn
            self.selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, name)
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
        for raw in self.raw_sockets.values():
            raw.close()
        self.raw_sockets.clear()

    close = stop  # a fabric service: closed at teardown

    def set_port(self, name: str, port: int, live: bool) -> None:
        """A port's carrier changed: the datapath's groups stop (or start) using it at once,
        then the controller is told."""
        conn = self.conns[name]
        self.datapath.set_live(conn.spec.index, port, live)
        with self.lock:
            conn.out += conn.session.port_status(port, live)

    def _send_frames(self, conn: _Conn) -> None:
        """The controller's packet-outs, sent out of their ports (one raw socket a port)."""
        frames, conn.session.packets_out = conn.session.packets_out, []
        names = {p.number: p.name for p in conn.spec.ports}
        for port, frame in frames:
            raw = self.raw_sockets.get(names[port])
            if raw is None:
                raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
                raw.bind((names[port], 0))
                self.raw_sockets[names[port]] = raw
            raw.send(frame)

    def _install(self, conn: _Conn) -> None:
        session, sw = conn.session, conn.spec.index
        for gid, group in session.groups.items():
            self.datapath.set_group(sw, gid, group.kind, list(group.ports),
                                    list(group.weights) or None, group.hash_basis)
        self.datapath.set_table(sw, tss.compile_table(session.flows.values()))
        for gid in conn.groups - set(session.groups):
            self.datapath.delete_group(sw, gid)
        conn.groups = set(session.groups)
        conn.dirty = False

    def _serve(self) -> None:
        while not self.stopping.is_set():
            for key, events in self.selector.select(timeout=0.1):
                conn = self.conns.get(key.data)
                if conn is None:
                    continue
                try:
                    if events & selectors.EVENT_READ:
                        data = conn.sock.recv(65536)
                        if not data:
                            raise ConnectionError("the controller closed the connection")
                        replies = conn.session.receive(data)
                        if conn.dirty:
                            self._install(conn)  # before any reply: a barrier means installed
                        self._send_frames(conn)
                        with self.lock:
                            conn.out += replies
                    with self.lock:
                        if conn.out:
                            sent = conn.sock.send(conn.out)
                            conn.out = conn.out[sent:]
                except (OSError, ConnectionError, ValueError, TestbedError) as err:
                    self.errors.append(f"{key.data}: {type(err).__name__}: {err}")
                    self.selector.unregister(conn.sock)
                    conn.sock.close()
                    del self.conns[key.data]
