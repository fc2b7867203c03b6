"""The eBPF switch (testbed/linux/progs/switch.c): hosts in network namespaces joined by one
switch that is only a tc program on its ports and its maps. Its flow table, compiled into
tuple-space subtables, forwards each host's traffic to the right port; a SELECT group spreads
flows over its buckets; a fast-failover group moves to its next live port the moment a port
is marked dead; a table without a matching entry drops."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from controllers.routing.tables import FlowEntry
from testbed.linux.ebpfswitch import EbpfSwitches
from testbed.linux.netlink import Netlink
from testbed.plan import tss

HOSTS = 3


def _sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
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
            _sh("ip", "netns", "add", ns)
            made_ns.append(ns)
            _sh("ip", "link", "add", root, "type", "veth", "peer", "name", peer)
            made_links.append(root)
            _sh("ip", "link", "set", peer, "netns", ns)
            _sh("ip", "-n", ns, "link", "set", peer, "address", macs[i], "name", "eth0")
            _sh("ip", "-n", ns, "addr", "add", f"10.77.0.{i}/24", "dev", "eth0")
            _sh("ip", "-n", ns, "link", "set", "eth0", "up")
            _sh("ip", "link", "set", root, "up")
        for i in range(1, HOSTS + 1):
            for j in range(1, HOSTS + 1):
                if i != j:
                    _sh("ip", "-n", f"{tag}h{i}", "neigh", "replace", f"10.77.0.{j}", "lladdr",
                        macs[j], "dev", "eth0", "nud", "permanent")
        switches = EbpfSwitches(Path(pins), tmp_path / "state")
        with Netlink() as nl:
            for i in range(1, HOSTS + 1):
                switches.add_port(nl, 7, i, f"{tag}p{i}")
        yield tag, switches
    finally:
        if switches is not None:
            switches.close()
        for link in made_links:
            _sh("ip", "link", "del", link, check=False)
        for ns in made_ns:
            _sh("ip", "netns", "del", ns, check=False)
        _sh("rm", "-rf", pins, check=False)


def _ping(tag: str, src: int, dst: int) -> bool:
    return _sh("ip", "netns", "exec", f"{tag}h{src}", "fping", "-q", "-c", "2", "-p", "200",
               "-t", "1000", f"10.77.0.{dst}", check=False).returncode == 0


def _route(dst: int, actions) -> FlowEntry:
    return FlowEntry(200, (("eth_type", 0x0800), ("ipv4_dst", (f"10.77.0.{dst}",
                                                              "255.255.255.255"))), actions)


def test_an_ebpf_switch_forwards_by_its_flow_table_and_groups(star):
    tag, switches = star
    # h1 and h2 by their ports; h3 through a fast-failover group (port 3, then port 2)
    table = [_route(1, (("output", 1),)), _route(2, (("output", 2),)),
             _route(3, (("group", 5),)),
             FlowEntry(0, (), ())]  # table miss: drop
    switches.set_group(7, 5, "ff", [3, 2])
    switches.set_table(7, tss.compile_table(table))
    assert _ping(tag, 1, 2) and _ping(tag, 2, 1) and _ping(tag, 1, 3)
    # port 3 dead: the group's next live port is h2's, whose stack does not answer for .3
    switches.set_live(7, 3, False)
    assert not _ping(tag, 1, 3)
    switches.set_live(7, 3, True)
    assert _ping(tag, 1, 3)
    # a SELECT group with one live bucket carries everything; with none, nothing
    switches.set_group(7, 5, "select", [3, 2], [1, 0])
    assert _ping(tag, 1, 3)
    # without an entry for h2 the table-miss entry drops it
    switches.set_table(7, tss.compile_table([_route(1, (("output", 1),)),
                                             FlowEntry(0, (), ())]))
    assert not _ping(tag, 1, 2)
