"""A TCP connection's own counters (traffic.agents.tcpinfo), read from the kernel over
loopback."""

import socket
import struct

from traffic.agents import tcpinfo


def test_the_fields_are_read_at_struct_tcp_infos_offsets():
    raw = bytearray(tcpinfo.SIZE)
    for value, (name, (offset, fmt)) in enumerate(tcpinfo.FIELDS.items(), start=7):
        struct.pack_into("=" + fmt, raw, offset, value)
    got = tcpinfo.parse(bytes(raw))
    assert got == {name: v for v, name in enumerate(tcpinfo.FIELDS, start=7)}
    assert "rcv_ooopack" not in tcpinfo.parse(bytes(raw[:200]))  # an older kernel's answer
    assert set(tcpinfo.AS_TRANSPORT) == set(tcpinfo.FIELDS)


def test_a_receiver_counts_the_data_segments_it_got():
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
        with client, peer:
            for _ in range(20):
                client.sendall(b"x" * 1000)
                peer.recv(4096)
            got = tcpinfo.read(peer)
    assert got["data_segs_in"] >= 10 and got["rcv_ooopack"] == 0, got
