"""How the agents of a job find each other over TCP: a connection to a peer's agent (retried
until it listens, from a source port of the job's choosing where one is given), and the
hellos that name each accepted connection's rank and channel."""

from __future__ import annotations

import selectors
import socket
import struct
import time

from testbed.errors import TestbedError
from testbed.poll import wait_for

HELLO = struct.Struct("!II")  # sender rank, channel
CONNECT_TIMEOUT_S = 30.0


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


def connect(ip: str, port: int) -> socket.socket:
    """A connection to a peer's agent, retried until it listens (``CONNECT_TIMEOUT_S``)."""
    errors: list[OSError] = []

    def attempt() -> socket.socket | None:
        try:
            sock = socket.create_connection((ip, port), timeout=5)
        except OSError as err:  # the peer's agent is not listening yet
            errors[:] = [err]
            return None
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    try:
        return wait_for(attempt, CONNECT_TIMEOUT_S, f"{ip}:{port} to accept")
    except TestbedError as err:
        raise OSError(f"{err} (last: {errors[0] if errors else 'no attempt'})") from None
