"""Helpers of the eBPF switch's integration tests: three hosts in network namespaces on one
eBPF switch (the ``star`` fixture), a route to a host, the packets a port sent, and flows of
UDP datagrams or bare TCP segments from one host to another."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from controllers.routing.tables import FlowEntry
from testbed.linux.ebpfswitch import EbpfSwitches
from testbed.linux.netlink import Netlink

HOSTS = 3
RATE_BYTES_S = 125_000_000  # the ports' loads drain at 1 Gbit/s


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=30)


@pytest.fixture
def star(tmp_path):
    """Three hosts on one eBPF switch: ns ``<tag>h<i>`` with 10.77.0.<i>/24, each behind root
    end ``<tag>p<i>`` (switch port i); yields (tag, switches)."""
    tag = f"ebs{os.getpid() % 10000}"
    made_ns, made_links = [], []
    pins = f"/sys/fs/bpf/fabriclab/{tag}"
    switches = None
    try:
        macs = {i: f"02:00:0a:4d:00:{i:02x}" for i in range(1, HOSTS + 1)}
        for i in range(1, HOSTS + 1):
            ns, root, peer = f"{tag}h{i}", f"{tag}p{i}", f"{tag}x{i}"
            sh("ip", "netns", "add", ns)
            made_ns.append(ns)
            sh("ip", "link", "add", root, "type", "veth", "peer", "name", peer)
            made_links.append(root)
            # the root end sends nothing of its own (IPv6 solicitations would count as tx)
            sh("sysctl", "-qw", f"net.ipv6.conf.{root}.disable_ipv6=1")
            sh("ip", "link", "set", peer, "netns", ns)
            sh("ip", "-n", ns, "link", "set", peer, "address", macs[i], "name", "eth0")
            sh("ip", "-n", ns, "addr", "add", f"10.77.0.{i}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "link", "set", root, "up")
        for i in range(1, HOSTS + 1):
            for j in range(1, HOSTS + 1):
                if i != j:
                    sh("ip", "-n", f"{tag}h{i}", "neigh", "replace", f"10.77.0.{j}", "lladdr",
                        macs[j], "dev", "eth0", "nud", "permanent")
        switches = EbpfSwitches(Path(pins), tmp_path / "state")
        with Netlink() as nl:
            for i in range(1, HOSTS + 1):
                switches.add_port(nl, 7, i, f"{tag}p{i}", RATE_BYTES_S)
        yield tag, switches
    finally:
        if switches is not None:
            switches.close()
        for link in made_links:
            sh("ip", "link", "del", link, check=False)
        for ns in made_ns:
            sh("ip", "netns", "del", ns, check=False)
        sh("rm", "-rf", pins, check=False)


def route(dst: int, actions) -> FlowEntry:
    return FlowEntry(200, (("eth_type", 0x0800), ("ipv4_dst", (f"10.77.0.{dst}",
                                                              "255.255.255.255"))), actions)


def tx(tag: str, port: int) -> int:
    return int(Path(f"/sys/class/net/{tag}p{port}/statistics/tx_packets").read_text())


def send_udp(tag: str, src: int, dst: int, count: int, sport: int = 40000,
              gap_s: float = 0.0) -> None:
    """``count`` UDP datagrams of one flow from host ``src`` to ``dst``'s address."""
    code = ("import socket, time\n"
            "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            f"s.bind(('10.77.0.{src}', {sport}))\n"
            f"for _ in range({count}):\n"
            f"    s.sendto(b'x' * 100, ('10.77.0.{dst}', 9))\n"
            f"    time.sleep({gap_s})\n")
    sh("ip", "netns", "exec", f"{tag}h{src}", sys.executable, "-c", code)


def send_tcp(tag: str, src: int, dst: int, count: int, sport: int, dport: int,
              flags: int, gap_s: float = 0.01, payload: int = 0) -> None:
    """``count`` bare TCP segments (a raw socket: headers, ``flags`` as given, and
    ``payload`` bytes) of one flow from host ``src`` to ``dst``'s address: what the switch
    parses, no connection."""
    code = ("import socket, struct, time\n"
            "s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)\n"
            f"seg = struct.pack('!HHIIBBHHH', {sport}, {dport}, 1, 1, 5 << 4, {flags}, 1024,"
            f" 0, 0) + b'x' * {payload}\n"
            f"for _ in range({count}):\n"
            f"    s.sendto(seg, ('10.77.0.{dst}', 0))\n"
            f"    time.sleep({gap_s})\n")
    sh("ip", "netns", "exec", f"{tag}h{src}", sys.executable, "-c", code)
