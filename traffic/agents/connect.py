"""How the agents of a job find each other over TCP: a connection to a peer's agent (retried
until it listens, from a source port drawn from the run seed where one is given), and the
hellos that name each accepted connection's rank and channel."""

from __future__ import annotations

import errno
import random
import selectors
import socket
import struct
import time

from testbed.errors import TestbedError
from testbed.poll import wait_for

HELLO = struct.Struct("!II")  # sender rank, channel
CONNECT_TIMEOUT_S = 30.0
#: where the agents' data connections' source ports are drawn from (:class:`SourcePorts`):
#: below Linux's ephemeral range (32768-60999, the kernel's own choices), above the agents'
#: listening ports, and below 29500 (PyTorch's rendezvous port, which a user's program run
#: after the jobs listens on: a port still in TIME_WAIT there would be in its way)
SOURCE_PORTS = range(20000, 29500)


def accept_hellos(listener: socket.socket, count: int,
                  deadline: float) -> dict[tuple[int, int], socket.socket]:
    """The first ``count`` connections to say who they are (a hello: rank, channel), each
    hello read as it comes, over a selector of them all: a silent stranger holds up nobody,
    and a peer slow to say its rank (descheduled on a busy machine: 16 agents starting on 2
    cores) is not dropped for it. Connections silent at ``deadline``, or closed before their
    hello, are closed."""
    accepted: dict[tuple[int, int], socket.socket] = {}
    partial: dict[socket.socket, bytes] = {}
    listener.setblocking(False)
    with selectors.DefaultSelector() as sel:
        sel.register(listener, selectors.EVENT_READ)
        try:
            while len(accepted) < count and time.monotonic() < deadline:
                for key, _ in sel.select(max(0.0, deadline - time.monotonic())):
                    conn = key.fileobj
                    if conn is listener:
                        try:
                            conn, _ = listener.accept()
                        except BlockingIOError:
                            continue
                        conn.setblocking(False)
                        partial[conn] = b""
                        sel.register(conn, selectors.EVENT_READ)
                        continue
                    try:
                        chunk = conn.recv(HELLO.size - len(partial[conn]))
                    except BlockingIOError:
                        continue
                    except OSError:
                        chunk = b""
                    if chunk:
                        partial[conn] += chunk
                    if chunk and len(partial[conn]) < HELLO.size:
                        continue
                    sel.unregister(conn)
                    hello = partial.pop(conn)
                    if not chunk:  # gone before saying who it is: not one of the job's
                        conn.close()
                        continue
                    conn.setblocking(True)
                    accepted[HELLO.unpack(hello)] = conn
        finally:
            for conn in partial:
                conn.close()
    return accepted


def recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise OSError("connection closed during hello")
        data += chunk
    return data


class SourcePorts:
    """The source ports of one agent's data connections, in the order it opens them, drawn
    from :data:`SOURCE_PORTS` by a key (the run seed, job and rank): the same key, the same
    ports, so the 5-tuples an ECMP switch hashes repeat from run to run. A port this host
    cannot use (bound, or its 4-tuple still in TIME_WAIT from a run before on a fabric kept
    up) gives way to the next one drawn."""

    def __init__(self, key: str) -> None:
        self.order = random.Random(key).sample(SOURCE_PORTS, len(SOURCE_PORTS))
        self.at = 0

    def take(self) -> int:
        if self.at >= len(self.order):
            raise OSError("no source port left to draw")
        self.at += 1
        return self.order[self.at - 1]


def connect(ip: str, port: int, ports: SourcePorts | None = None) -> socket.socket:
    """A connection to a peer's agent, retried until it listens (``CONNECT_TIMEOUT_S``), from
    the next source port of ``ports`` (None: the kernel's choice)."""
    errors: list[OSError] = []
    sport = [ports.take() if ports else 0]

    def attempt() -> socket.socket | None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.settimeout(5)
            if sport[0]:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(("", sport[0]))
            sock.connect((ip, port))
        except OSError as err:  # the peer's agent is not listening yet, or the port is taken
            sock.close()
            errors[:] = [err]
            if sport[0] and err.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
                sport[0] = ports.take()
            return None
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    try:
        return wait_for(attempt, CONNECT_TIMEOUT_S, f"{ip}:{port} to accept")
    except TestbedError as err:
        raise OSError(f"{err} (last: {errors[0] if errors else 'no attempt'})") from None


def udp_socket(ip: str, port: int, tos: int, ports: SourcePorts | None = None) -> socket.socket:
    """A non-blocking UDP socket bound to ``ip``:``port`` with ``tos`` on what it sends; port
    0 with ``ports``: the next drawn port this host has free (else the kernel's choice)."""
    while True:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
        chosen = ports.take() if ports is not None and port == 0 else port
        try:
            sock.bind((ip, chosen))
        except OSError as err:
            sock.close()
            if chosen != port and err.errno == errno.EADDRINUSE:
                continue  # taken on this host: the next one drawn
            raise
        sock.setblocking(False)
        return sock
