"""One TLS connection read and written by two threads at once, as os-ken on native threads
uses a switch's (controllers.serialtls), against a peer that, like a vswitchd, serves it from
one thread without blocking (loopback, no root)."""

from __future__ import annotations

import select
import socket
import ssl
import threading

from controllers.launcher import _one_tls_operation_at_a_time
from controllers.serialtls import SerialTLS
from testbed.linux.pki import make_run_pki
from tests.unit.test_tls import _client_context, _server_context

MESSAGES = 20_000  # each way: enough that reads and writes overlap many times


def _pattern(n_bytes: int, seed: int) -> bytes:
    return bytes((seed + i * 7) % 251 for i in range(n_bytes))


def _switch(ctx: ssl.SSLContext, port: int, out: bytes, got: bytearray, errors: list) -> None:
    """A vswitchd's way: one thread, non-blocking, writing ``out`` and reading all it is sent
    until the controller's side ends."""
    with ctx.wrap_socket(socket.create_connection(("127.0.0.1", port)),
                         server_hostname="127.0.0.1") as tls:
        tls.setblocking(False)
        sent = 0
        try:
            while True:
                readable, writable, _ = select.select([tls], [tls] if sent < len(out) else [],
                                                      [], 10)
                if not readable and not writable:
                    raise TimeoutError("the controller's side went quiet")
                if writable:
                    try:
                        sent += tls.send(out[sent:sent + 16384])
                    except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                        pass
                if readable and not _drained(tls, got):
                    return
        except Exception as err:  # noqa: BLE001 - reported by the test
            errors.append(f"switch: {err!r}")


def _drained(tls: ssl.SSLSocket, got: bytearray) -> bool:
    """Read what is there; False at the end of the connection."""
    try:
        while True:
            data = tls.recv(65536)
            if not data:
                return False
            got += data
    except ssl.SSLWantReadError:
        return True


def test_a_read_and_a_write_at_once_from_two_threads_keep_the_stream_whole(tmp_path):
    """os-ken's receive loop (8-byte headers, then the rest; timeouts and SSL errors read
    again) beside its send loop: every byte arrives in order both ways, and no read saw an SSL
    error (plain, a read and a write at the same moment corrupt OpenSSL's state)."""
    pki = make_run_pki(tmp_path / "pki", "run-1", "127.0.0.1")
    server = socket.create_server(("127.0.0.1", 0))
    to_controller, to_switch = _pattern(MESSAGES * 120, 3), _pattern(MESSAGES * 100, 5)
    at_switch, errors = bytearray(), []
    peer = threading.Thread(target=_switch, args=(_client_context(pki),
                            server.getsockname()[1], to_controller, at_switch, errors))
    peer.start()
    raw, _ = server.accept()
    tls = _server_context(pki).wrap_socket(raw, server_side=True)
    tls.settimeout(5.0)
    conn, at_controller = SerialTLS(tls), bytearray()

    def receive() -> None:
        while len(at_controller) < len(to_controller):
            try:
                data = conn.recv(8)
            except socket.timeout:
                continue
            except ssl.SSLError as err:
                errors.append(f"read: {err!r}")
                continue
            if not data:
                return
            at_controller.extend(data)

    reader = threading.Thread(target=receive)
    reader.start()
    for i in range(MESSAGES):
        conn.sendall(to_switch[i * 100:(i + 1) * 100])
    reader.join(60)
    conn.shutdown(socket.SHUT_WR)
    peer.join(60)
    tls.close()
    server.close()
    assert not reader.is_alive() and not peer.is_alive()
    assert errors == []
    assert bytes(at_controller) == to_controller
    assert bytes(at_switch) == to_switch


def test_a_read_ends_with_the_connection_and_waits_no_longer_than_the_timeout(tmp_path):
    pki = make_run_pki(tmp_path / "pki", "run-1", "127.0.0.1")
    server = socket.create_server(("127.0.0.1", 0))
    client = _client_context(pki).wrap_socket(
        socket.create_connection(server.getsockname()), server_hostname="127.0.0.1",
        do_handshake_on_connect=False)
    shaking = threading.Thread(target=client.do_handshake)
    shaking.start()
    raw, _ = server.accept()
    tls = _server_context(pki).wrap_socket(raw, server_side=True)
    shaking.join(10)
    tls.settimeout(0.2)
    conn = SerialTLS(tls)
    try:
        try:
            conn.recv(8)
            raise AssertionError("a read of nothing returned")
        except socket.timeout:
            pass
        client.sendall(b"hello")
        assert conn.recv(8) == b"hello"
        client.close()
        assert conn.recv(8) == b""
    finally:
        tls.close()
        server.close()


def test_the_launcher_serializes_a_switchs_tls_connection_and_leaves_plain_tcp_alone(tmp_path):
    class Datapath:  # os-ken's constructor keeps the connection as ``socket``
        def __init__(self, sock, address):
            self.socket, self.address = sock, address

    _one_tls_operation_at_a_time(Datapath)
    pki = make_run_pki(tmp_path / "pki", "run-1", "127.0.0.1")
    plain = socket.socket()
    tls = _client_context(pki).wrap_socket(socket.socket(), server_hostname="127.0.0.1")
    try:
        assert Datapath(plain, "a").socket is plain
        wrapped = Datapath(tls, "b").socket
        assert isinstance(wrapped, SerialTLS) and wrapped.fileno() == tls.fileno()
    finally:
        plain.close()
        tls.close()
