"""A fake OpenFlow switch and fabric walker: applies policy ops and forwards packets."""

from __future__ import annotations

import ipaddress

from controllers.routing.tables import FlowEntry, GroupEntry, Op, OpKind
from testbed.model.topology import Topology


class FakeSwitch:
    def __init__(self) -> None:
        self.flows: dict[tuple, FlowEntry] = {}
        self.groups: dict[int, GroupEntry] = {}
        self.barriers = 0

    def apply(self, ops: list[Op]) -> None:
        for op in ops:
            match op.kind:
                case OpKind.CLEAR:
                    self.flows.clear()
                    self.groups.clear()
                case OpKind.BARRIER:
                    self.barriers += 1
                case OpKind.GROUP_ADD:
                    assert op.entry.group_id not in self.groups, "group added twice"
                    self.groups[op.entry.group_id] = op.entry
                case OpKind.GROUP_MOD:
                    assert op.entry.group_id in self.groups, "modify of a missing group"
                    self.groups[op.entry.group_id] = op.entry
                case OpKind.GROUP_DEL:
                    del self.groups[op.entry.group_id]
                case OpKind.FLOW_MOD:
                    assert op.entry.key in self.flows, "modify of a missing flow"
                    self.flows[op.entry.key] = op.entry
                case OpKind.FLOW_ADD:
                    for name, value in op.entry.actions:
                        if name == "group":
                            assert value in self.groups, "flow points at a missing group"
                    self.flows[op.entry.key] = op.entry
                case OpKind.FLOW_DEL:
                    del self.flows[op.entry.key]
                case _:
                    raise AssertionError(f"unknown op {op.kind}")

    def lookup(self, packet: dict) -> FlowEntry | None:
        best = None
        for flow in self.flows.values():
            if _matches(flow, packet) and (best is None or flow.priority > best.priority):
                best = flow
        return best

    def out_ports(self, packet: dict) -> list:
        """Every port the packet may leave by (all buckets of a SELECT group)."""
        flow = self.lookup(packet)
        if flow is None:
            return []
        ports = []
        for name, value in flow.actions:
            if name == "output":
                ports.append(value)
            elif name == "group":
                group = self.groups[value]
                # fast failover: the first bucket (the tables list live ports only)
                ports.extend(group.ports[:1] if group.kind == "ff" else group.ports)
        return ports


def _matches(flow: FlowEntry, packet: dict) -> bool:
    for field, value in flow.match:
        if field in ("ipv4_src", "ipv4_dst"):
            addr, mask = value
            net = ipaddress.ip_network(f"{addr}/{mask}")
            if ipaddress.ip_address(packet.get(field, "0.0.0.0")) not in net:
                return False
        elif packet.get(field) != value:
            return False
    return True


def walk(topo: Topology, switches: dict[str, FakeSwitch], src: str, dst: str,
         max_hops: int = 16, **fields) -> list[list[str]]:
    """All node paths an IPv4 packet from host ``src`` to host ``dst`` (with more header
    ``fields``, e.g. ip_proto and tcp ports) can take.

    Raises AssertionError on a loop, a drop, or delivery to the wrong host.
    """
    packet = {"eth_type": 0x0800, "ipv4_dst": topo.nodes[dst].ip,
              "ipv4_src": topo.nodes[src].ip, **fields}
    first = topo.attachment(src).node
    paths = []

    def step(node: str, path: list[str]) -> None:
        assert len(path) <= max_hops, f"loop: {path}"
        ports = switches[node].out_ports(packet)
        assert ports, f"dropped at {node} on the way {src}->{dst}: {path}"
        for port in ports:
            assert port != "controller", f"{node} punts IPv4 to the controller"
            link = topo.link_at(node, port)
            peer = link.other(node).node
            if not topo.nodes[peer].is_switch:
                assert peer == dst, f"delivered to {peer} instead of {dst}"
                paths.append(path + [peer])
            else:
                step(peer, path + [peer])

    step(first, [src, first])
    return sorted(paths)
