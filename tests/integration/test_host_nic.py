"""Host NICs send TCP's acknowledgements first: two hosts that send to each other at once
with BBR both keep their link's rate, and the acknowledgements' class carries only short
frames. With ``queue.acks_first`` the switch ports do too: two hosts on two leaves that send
to each other keep the rate, and the uplinks' acknowledgement classes carry only short
frames."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import experiment

FABRIC = """version: 1
fabric:
  topology: leaf_spine
  leaves: 1
  spines: 1
  hosts_per_leaf: 2
  host_link: {rate_mbps: 50}
  fabric_link: {rate_mbps: 50}
  mtu: 9000
  queue: {size_kb: 2048}
"""
#: one host's side: a receiver on port 7001, and a sender of ``rounds`` transfers of ``size``
#: bytes to the peer, each acknowledged by one byte, printing each transfer's seconds
PROGRAM = """
import socket, sys, threading, time
peer, size, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
srv = socket.create_server(("0.0.0.0", 7001))
def receive():
    conn, _ = srv.accept()
    buf = memoryview(bytearray(1 << 20))
    for _ in range(rounds):
        left = size
        while left:
            left -= conn.recv_into(buf, min(left, len(buf)))
        conn.sendall(b"k")
receiver = threading.Thread(target=receive)
receiver.start()
for _ in range(100):
    try:
        s = socket.create_connection((peer, 7001)); break
    except OSError:
        time.sleep(0.05)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b"bbr")
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
data, times = bytes(1 << 20), []
for _ in range(rounds):
    t, left = time.monotonic(), size
    while left:
        left -= s.send(data[:min(left, len(data))])
    s.recv(1)
    times.append(time.monotonic() - t)
    time.sleep(0.05)
receiver.join()  # the peer's last transfer acknowledged before this process ends
print(" ".join(f"{x:.4f}" for x in times))
"""


def _classes(fabric, host: str = "", dev: str | None = None) -> dict[str, dict]:
    """Each HTB class's bytes and packets sent on a host's NIC (or a switch port ``dev`` in
    the root namespace): ``tc -s class show``, no JSON for classes in Debian 12's iproute2."""
    argv = ["tc", "-s", "class", "show", "dev", dev or f"{host}-eth0"]
    if dev is None:
        (code, out, err), = fabric.hosts.run_parallel({host: argv}, timeout_s=10).values()
    else:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        code, out, err = done.returncode, done.stdout, done.stderr
    assert code == 0, err
    return {m[1]: {"bytes": int(m[2]), "packets": int(m[3])} for m in re.finditer(
        r"class htb (\S+) [^\n]*\n Sent (\d+) bytes (\d+) pkt", out)}


def _both_ways(fabric, tmp_path, a: str, b: str, size: int, rounds: int) -> dict:
    """Each host's transfer times (seconds) while both send to each other at once."""
    ip = {h.name: h.ip for h in fabric.topo.hosts}
    script = tmp_path / "both.py"
    script.write_text(PROGRAM)
    results = fabric.hosts.run_parallel(
        {h: [sys.executable, str(script), ip[peer], str(size), str(rounds)]
         for h, peer in ((a, b), (b, a))}, timeout_s=60)
    out = {}
    for host, (code, text, err) in results.items():
        assert code == 0, err
        out[host] = [float(x) for x in text.split()]
    return out


def _needs_bbr() -> None:
    if "bbr" not in Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text():
        pytest.skip("no bbr in this kernel")


def test_both_directions_keep_the_rate_with_bbr(make_fabric, tmp_path):
    _needs_bbr()
    fabric = make_fabric(experiment(FABRIC, "ebpf"))
    a, b = [h.name for h in fabric.topo.hosts]
    size, rounds = 1_000_000, 8
    line = size * 8 / 50e6 / (8948 / 9038)  # at the link's payload rate
    for host, times in _both_ways(fabric, tmp_path, a, b, size, rounds).items():
        # without acknowledgements first: up to 1.6 x line (measured); with: within 10 %
        assert len(times) == rounds and max(times) < 1.1 * line, (host, times, line)
    for host in (a, b):
        stats = _classes(fabric, host)
        acks, data = stats["1:20"], stats["1:10"]
        assert acks["packets"] >= 10 * rounds, stats  # GRO: an ACK per several frames
        assert acks["bytes"] <= 128 * acks["packets"], stats
        assert data["bytes"] >= rounds * size, stats


def test_switch_ports_send_acknowledgements_first_when_asked(make_fabric, tmp_path):
    """Two hosts on two leaves send to each other: each uplink carries one direction's data
    and the other's acknowledgements, which go first."""
    _needs_bbr()
    text = FABRIC.replace("leaves: 1", "leaves: 2").replace(
        "size_kb: 2048}", "size_kb: 2048, acks_first: true}")
    fabric = make_fabric(experiment(text, "ebpf"))
    topo = fabric.topo
    a, b = topo.hosts[0].name, topo.hosts[-1].name  # one under each leaf
    size, rounds = 1_000_000, 8
    line = size * 8 / 50e6 / (8948 / 9038)
    for host, times in _both_ways(fabric, tmp_path, a, b, size, rounds).items():
        assert len(times) == rounds and max(times) < 1.1 * line, (host, times, line)
    uplinks = [f"{leaf}-eth{port}" for leaf in ("leaf1", "leaf2")
               for port, link in topo.ports(leaf).items() if link.other(leaf).node == "spine1"]
    assert len(uplinks) == 2
    for dev in uplinks:
        stats = _classes(fabric, dev=dev)
        acks, data = stats["1:20"], stats["1:10"]
        assert acks["packets"] >= 10 * rounds, (dev, stats)
        assert acks["bytes"] <= 128 * acks["packets"], (dev, stats)
        assert data["bytes"] >= rounds * size, (dev, stats)
