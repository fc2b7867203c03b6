"""Tuple space search (testbed/plan/tss.py): a switch's flow table as subtables finds, for every
packet, the entry a linear walk of the table finds, on the tables fabriclab's controller
computes for every routing mode; in a few lookups; unsupported matches refused as OpenFlow
errors."""

from __future__ import annotations

import random

import pytest

from controllers.routing.adaptive import AdaptiveRouting, FlowKey
from controllers.routing.tables import (FLOW_COOKIE, PRIORITY_FLOW, FlowEntry,
                                        compute_tables)
from testbed.model.builders import fat_tree
from testbed.model.spec import Routing
from testbed.plan import tss
from tests.unit.fakeswitch import FakeSwitch

TOPO = fat_tree(4)


def _tables(routing: Routing):
    up = {link.name: True for link in TOPO.links}
    adaptive = AdaptiveRouting(TOPO, poll_s=1.0) if routing == Routing.ADAPTIVE else None
    tables = compute_tables(TOPO, up, routing, adaptive=adaptive)
    if routing == Routing.ADAPTIVE:  # exact 5-tuple entries, as placed flows get
        rng = random.Random(7)
        hosts = TOPO.hosts
        for _ in range(40):
            src, dst = rng.sample(hosts, 2)
            key = FlowKey(src.ip, dst.ip, rng.choice((6, 17)), rng.randrange(1024, 65535),
                          rng.randrange(1, 65535))
            first = TOPO.attachment(src.name).node
            tables[first].add_flow(FlowEntry(PRIORITY_FLOW, key.match(), (("output", 1),),
                                             FLOW_COOKIE))
    return tables


def _packets(switch: str, rng: random.Random, count: int) -> list[dict]:
    ports = list(TOPO.ports(switch))
    hosts = TOPO.hosts
    out = []
    for i in range(count):
        src, dst = rng.sample(hosts, 2)
        kind = i % 10
        if kind == 0:
            out.append({"eth_type": 0x0806, "in_port": rng.choice(ports)})
        elif kind == 1:
            out.append({"eth_type": 0x88CC, "in_port": rng.choice(ports)})
        else:
            proto = rng.choice((6, 17, 1))
            pkt = {"eth_type": 0x0800, "in_port": rng.choice(ports), "ipv4_src": src.ip,
                   "ipv4_dst": dst.ip, "ip_proto": proto, "ip_dscp": rng.choice((0, 26))}
            name = {6: "tcp", 17: "udp"}.get(proto)
            if name:
                pkt[f"{name}_src"] = rng.randrange(1, 65536)
                pkt[f"{name}_dst"] = rng.randrange(1, 65536)
            out.append(pkt)
    return out


@pytest.mark.parametrize("routing", [Routing.ECMP, Routing.DMODK, Routing.SPRAY,
                                     Routing.ADAPTIVE])
def test_subtables_find_what_a_linear_walk_finds(routing):
    rng = random.Random(1)
    worst = 0
    for name, table in _tables(routing).items():
        fake = FakeSwitch()
        fake.flows = dict(table.flows)
        subtables = tss.compile_table(table.flows.values())
        assert len(subtables) <= tss.MAX_SUBTABLES
        packets = _packets(name, rng, 300)
        if routing == Routing.ADAPTIVE:  # the placed flows' own packets too
            packets += [dict({"in_port": 1}, **{k: v[0] if isinstance(v, tuple) else v
                                                 for k, v in f.match})
                        for f in table.flows.values() if f.priority == PRIORITY_FLOW]
        for packet in packets:
            want = fake.lookup(packet)
            got, probes = tss.lookup(subtables, packet)
            worst = max(worst, probes)
            assert (got.priority, got.actions) == (want.priority, want.actions) \
                if want else got is None, (name, packet, want, got)
    assert worst <= 8, worst  # a handful of hash lookups per packet (adaptive: 7)


def test_the_highest_priority_wins_and_the_search_stops_early():
    flows = [FlowEntry(100, (("eth_type", 0x0800), ("ipv4_dst", ("10.1.0.0", "255.255.0.0"))),
                       (("output", 1),)),
             FlowEntry(200, (("eth_type", 0x0800), ("ipv4_dst", ("10.1.1.0", "255.255.255.0"))),
                       (("output", 2),)),
             FlowEntry(300, (("eth_type", 0x0806),), (("output", "controller"),)),
             FlowEntry(0, (), (("drop", True),))]
    subtables = tss.compile_table(flows)
    assert [t.max_priority for t in subtables] == [300, 200, 100, 0]
    entry, probes = tss.lookup(subtables, {"eth_type": 0x0800, "ipv4_dst": "10.1.1.9"})
    assert entry.actions == (("output", 2),) and probes == 2  # /24 found: /16 and miss skipped
    entry, _ = tss.lookup(subtables, {"eth_type": 0x0800, "ipv4_dst": "10.1.2.9"})
    assert entry.actions == (("output", 1),)
    entry, probes = tss.lookup(subtables, {"eth_type": 0x86DD})
    assert entry.priority == 0 and probes == 4  # the table-miss entry


@pytest.mark.parametrize("match, code", [
    ((("ipv6_dst", "::1"),), tss.OFPBMC_BAD_FIELD),
    ((("eth_type", 0x0800), ("ipv4_dst", ("10.0.0.0", "255.0.255.0"))),
     tss.OFPBMC_BAD_WILDCARDS)])
def test_what_it_cannot_match_is_an_openflow_bad_match(match, code):
    with pytest.raises(tss.UnsupportedMatch) as err:
        tss.compile_table([FlowEntry(1, match, ())])
    assert (err.value.type, err.value.code) == (tss.OFPET_BAD_MATCH, code)


def test_more_masks_than_the_datapath_looks_up_are_refused():
    flows = [FlowEntry(i, (("eth_type", 0x0800), ("ipv4_dst", ("10.0.0.0", f"255.{m}.0.0"))),
                       ()) for i, m in enumerate((0, 128, 192, 224, 240, 248, 252, 254, 255))]
    flows += [FlowEntry(i, (("in_port", 1), ("ipv4_src", ("10.0.0.0", f"{m}.0.0.0"))), ())
              for i, m in enumerate((128, 192, 224, 240, 248, 252, 254, 255))]
    with pytest.raises(tss.UnsupportedMatch, match="17 distinct masks") as err:
        tss.compile_table(flows)
    assert err.value.code == tss.OFPBMC_BAD_WILDCARDS
