"""A TLS connection that two threads use at once, one TLS operation at a time.

os-ken on native threads (its default hub, the launcher's) reads a switch's connection in one
thread and writes it in another. OpenSSL's connection object is not safe for that: a read and
a write at the same moment corrupt its state (``DECRYPTION_FAILED_OR_BAD_RECORD_MAC`` on the
read, which os-ken's receive loop skips as a passing SSL error; the write then fails and os-ken
drops the switch). A switch of a reactive app (packet-ins in while packet-outs and flows go
out) was dropped that way, and for the second until Open vSwitch reconnected it forwarded
nothing new.

:class:`SerialTLS` takes a lock around every TLS operation. A read waits for the socket to
become readable *outside* the lock and then reads without blocking under it (a record not yet
whole is waited for outside it again), so a writer is never held up by a reader waiting for
data; a write likewise sends what the socket takes without blocking and waits for room
outside the lock.
"""

from __future__ import annotations

import select
import socket
import ssl
import threading


class SerialTLS:
    """``tls``'s reads, writes and shutdown one at a time; everything else is ``tls``'s own.

    Args:
        tls: a connected TLS socket in blocking or timeout mode (os-ken's: 5 s), the timeout
            each wait for the socket is bounded by (``socket.timeout`` past it).
    """

    def __init__(self, tls: ssl.SSLSocket) -> None:
        self._tls = tls
        self._lock = threading.Lock()
        self._timeout_s = tls.gettimeout()

    def recv(self, size: int) -> bytes:
        """Up to ``size`` bytes; b"" at the end of the connection."""
        while True:
            with self._lock:
                data, wait_for = self._now(self._tls.recv, size)
            if wait_for is None:
                return data
            if not self._waited(wait_for):
                return b""

    def sendall(self, data: bytes) -> None:
        """All of ``data``, sent as the socket takes it (a write TLS could not finish is
        repeated with the same bytes, as OpenSSL requires)."""
        view = memoryview(data)
        while view:
            with self._lock:
                sent, wait_for = self._now(self._tls.send, view)
            if wait_for is None:
                view = view[sent:]
            elif not self._waited(wait_for):
                raise BrokenPipeError("the connection ended while sending")

    def _now(self, operation, arg):
        """(``operation(arg)`` done without blocking, None), or (None, what to wait for
        before trying again: the socket readable, or writable where TLS must write first)."""
        self._tls.settimeout(0.0)
        try:
            return operation(arg), None
        except ssl.SSLWantReadError:
            return None, select.POLLIN
        except ssl.SSLWantWriteError:
            return None, select.POLLOUT
        finally:
            self._tls.settimeout(self._timeout_s)

    def _waited(self, events: int) -> bool:
        """Wait, outside the lock, for the socket (poll: no limit on the descriptor's number);
        False: it was closed meanwhile. Raises ``socket.timeout`` where the socket's timeout
        passed first (os-ken's receive loop then reads again; its send loop ends the
        connection)."""
        poller = select.poll()
        try:
            poller.register(self._tls.fileno(), events)
        except (OSError, ValueError):  # closed by another thread
            return False
        ready = poller.poll(None if self._timeout_s is None else self._timeout_s * 1000)
        if not ready:
            raise socket.timeout("timed out")
        return not any(mask & select.POLLNVAL for _fd, mask in ready)

    def shutdown(self, how: int) -> None:
        with self._lock:
            self._tls.shutdown(how)

    def settimeout(self, timeout_s: float | None) -> None:
        with self._lock:
            self._timeout_s = timeout_s
            self._tls.settimeout(timeout_s)

    def gettimeout(self) -> float | None:
        return self._timeout_s

    def __getattr__(self, name: str):
        return getattr(self._tls, name)
