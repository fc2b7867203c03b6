"""The eBPF switch's adapter: its program (``progs/switch.c``) loaded once and pinned, attached
at the clsact ingress of every switch port, and each switch's flow table (as tuple-space
subtables, :mod:`testbed.plan.tss`), groups (:mod:`testbed.plan.groups`) and ports written into
its maps. The ctypes structures here mirror the C structures field for field.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from testbed.errors import TestbedError
from testbed.linux import bpf
from testbed.linux.netlink import Netlink
from testbed.linux.rawnl import LinkDump
from testbed.plan.localroute import chance_of
from testbed.plan.tss import MAX_SUBTABLES, Subtable

PROGRAM = "switch"
MAX_BUCKETS = 16
FIELD_BITS = {"in_port": 1, "eth_type": 2, "eth_dst": 4, "ip_dscp": 8, "ip_proto": 16,
              "tcp_src": 32, "udp_src": 32, "tcp_dst": 64, "udp_dst": 64, "eth_src": 128}
A_OUTPUT, A_GROUP, A_DROP, A_CONTROLLER = 1, 2, 3, 4
G_SELECT, G_FF = 1, 2
#: a SELECT group's selection in the datapath (progs/switch.c SEL_*): both hash methods hash
#: (SEL_NEXT, 4: weighing the next switch's path quality, publishing the group's own)
SELECTION = {"hash": 0, "dp_hash": 0, "flowlet": 1, "packet": 2, "flowlet_next": 5,
             "packet_next": 6}
PUNT_ALL = 0xFFFF  # the whole packet to the controller (OFPCML_NO_BUFFER)
PUNT_RING_BYTES = 1 << 22  # progs/switch.c PUNT_RING


class PortId(ctypes.Structure):
    _fields_ = [("sw", ctypes.c_uint32), ("port", ctypes.c_uint32)]


class PortOut(ctypes.Structure):
    _fields_ = [("ifindex", ctypes.c_uint32), ("live", ctypes.c_uint32)]


class TableId(ctypes.Structure):
    _fields_ = [("sw", ctypes.c_uint32), ("table", ctypes.c_uint32)]


class MaskValue(ctypes.Structure):
    _fields_ = [("fields", ctypes.c_uint32), ("max_priority", ctypes.c_int32),
                ("src_len", ctypes.c_uint8), ("dst_len", ctypes.c_uint8),
                ("valid", ctypes.c_uint8), ("pad", ctypes.c_uint8)]


class FlowKey(ctypes.Structure):
    _fields_ = [("sw", ctypes.c_uint32), ("table", ctypes.c_uint32),
                ("in_port", ctypes.c_uint32), ("src", ctypes.c_uint32), ("dst", ctypes.c_uint32),
                ("eth_type", ctypes.c_uint16), ("sport", ctypes.c_uint16),
                ("dport", ctypes.c_uint16), ("proto", ctypes.c_uint8), ("dscp", ctypes.c_uint8),
                ("eth_dst", ctypes.c_uint8 * 6), ("eth_src", ctypes.c_uint8 * 6)]


class Action(ctypes.Structure):
    _fields_ = [("priority", ctypes.c_int32), ("kind", ctypes.c_uint32),
                ("arg", ctypes.c_uint32), ("punt", ctypes.c_uint32),
                ("packets", ctypes.c_uint64), ("bytes", ctypes.c_uint64)]


class PuntHead(ctypes.Structure):
    """What precedes a punted packet in the ring buffer."""

    _fields_ = [("sw", ctypes.c_uint32), ("port", ctypes.c_uint32),
                ("total_len", ctypes.c_uint32), ("reason", ctypes.c_uint32)]


class GroupId(ctypes.Structure):
    _fields_ = [("sw", ctypes.c_uint32), ("group", ctypes.c_uint32)]


class Beyond(ctypes.Structure):
    """What a bucket weighs beyond its port (progs/switch.c struct beyond)."""

    _fields_ = [("sw", ctypes.c_uint32), ("group", ctypes.c_uint32),
                ("link_sw", ctypes.c_uint32), ("link_port", ctypes.c_uint32)]


class Group(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_uint32), ("basis", ctypes.c_uint32), ("n", ctypes.c_uint32),
                ("selection", ctypes.c_uint32), ("gap_ns", ctypes.c_uint64),
                ("ports", ctypes.c_uint32 * MAX_BUCKETS),
                ("weights", ctypes.c_uint32 * MAX_BUCKETS),
                ("next", Beyond * MAX_BUCKETS),
                ("rb_delta_pct", ctypes.c_uint32), ("rb_chance", ctypes.c_uint32)]


class Quality(ctypes.Structure):
    """A group's path quality (progs/switch.c struct quality)."""

    _fields_ = [("delay_ns", ctypes.c_uint64), ("at_ns", ctypes.c_uint64)]


class PortLoad(ctypes.Structure):
    """A port's load (progs/switch.c struct port_load; the kernel keeps its lock)."""

    _fields_ = [("lock", ctypes.c_uint32), ("pad", ctypes.c_uint32),
                ("level", ctypes.c_uint64), ("last_ns", ctypes.c_uint64),
                ("rate_bytes_s", ctypes.c_uint64), ("sent_bytes", ctypes.c_uint64),
                ("largest", ctypes.c_uint64), ("recent", ctypes.c_uint64),
                ("pushed_ns", ctypes.c_uint64)]


def flow_key(sw: int, table: int, subtable: Subtable, key: tuple) -> FlowKey:
    """The C key of one subtable entry (``key`` as :func:`testbed.plan.tss.split_match` made)."""
    values, src, dst = key
    fields = dict(zip(subtable.mask.fields, values))
    out = FlowKey(sw=sw, table=table, in_port=int(fields.get("in_port", 0)), src=src, dst=dst,
                  eth_type=int(fields.get("eth_type", 0)), proto=int(fields.get("ip_proto", 0)),
                  dscp=int(fields.get("ip_dscp", 0)),
                  sport=int(fields.get("tcp_src", fields.get("udp_src", 0))),
                  dport=int(fields.get("tcp_dst", fields.get("udp_dst", 0))))
    for name in ("eth_dst", "eth_src"):
        if name in fields:
            getattr(out, name)[:] = bytes.fromhex(str(fields[name]).replace(":", ""))
    return out


def action(priority: int, actions: tuple) -> Action:
    """The C action of an entry: its first output or group (else drop), and what of the packet
    goes to the controller (all of it for an output there, the first bytes for a punt)."""
    punt = 0
    for name, value in actions:
        if name == "punt":
            punt = max(punt, int(value))
        elif name == "output" and value == "controller":
            punt = PUNT_ALL
    for name, value in actions:
        if name == "output" and value != "controller":
            return Action(priority, A_OUTPUT, int(value), punt)
        if name == "group":
            return Action(priority, A_GROUP, int(value), punt)
    return Action(priority, A_CONTROLLER if punt else A_DROP, 0, punt)


class EbpfSwitches:
    """The switches of one fabric on this machine: the program pinned in ``pin_dir`` (recorded
    by the caller for teardown), its maps open for writing."""

    def __init__(self, pin_dir: Path, state_dir: Path) -> None:
        self.pin_dir = Path(pin_dir)
        progs = bpf.load(bpf.build(PROGRAM, state_dir), self.pin_dir)
        self.prog_fd = bpf.obj_get(progs / "switch_ingress")
        self.maps = {name: bpf.Map(self.pin_dir / name, k, v) for name, k, v in (
            ("sw_ports", ctypes.c_uint32, PortId), ("sw_out", PortId, PortOut),
            ("sw_masks", TableId, MaskValue), ("sw_flows", FlowKey, Action),
            ("sw_groups", GroupId, Group), ("sw_load", PortId, PortLoad),
            ("sw_dead", PortId, ctypes.c_uint64), ("sw_quality", GroupId, Quality))}
        # switch -> its flow keys in the map and what they hold, by subtable mask and key
        self.written: dict[int, dict[tuple, tuple[FlowKey, tuple]]] = {}
        self.masks: dict[int, list[bytes | None]] = {}  # switch -> its subtables' masks written
        self.punts = bpf.RingBuffer(self.pin_dir / "sw_punts", PUNT_RING_BYTES)
        self.links = LinkDump()  # the ports' counters, for the controller's port statistics

    def close(self) -> None:
        for m in self.maps.values():
            m.close()
        self.punts.close()
        self.links.close()
        if self.prog_fd >= 0:
            os.close(self.prog_fd)
            self.prog_fd = -1

    def add_port(self, netlink: Netlink, sw: int, port: int, ifname: str,
                 rate_bytes_s: int) -> None:
        """Make root-namespace interface ``ifname`` port ``port`` of switch ``sw``; its load
        drains at ``rate_bytes_s`` (its link's rate)."""
        ifindex = netlink.index(ifname)
        self.maps["sw_ports"].update(ctypes.c_uint32(ifindex), PortId(sw, port))
        self.maps["sw_out"].update(PortId(sw, port), PortOut(ifindex, 1))
        self.maps["sw_load"].update(PortId(sw, port), PortLoad(rate_bytes_s=int(rate_bytes_s)))
        netlink.attach_bpf(ifname, self.prog_fd, "fabriclab_switch", ingress=True, prio=3)

    def port_load(self, sw: int, port: int) -> PortLoad | None:
        """A port's load as the datapath keeps it (:class:`testbed.plan.localroute.PortLoad`'s
        fields)."""
        return self.maps["sw_load"].lookup(PortId(sw, port))

    def set_port_load(self, sw: int, port: int, rate_bytes_s: int, level: int = 0,
                      last_ns: int = 0, sent_bytes: int = 0, largest: int = 0,
                      recent: int = 0, pushed_ns: int = 0) -> None:
        """A port's load set: its rate (a degraded link's), and its queue, rate estimate and
        the time a rebalancing flow was last pushed onto it (a test's)."""
        self.maps["sw_load"].update(PortId(sw, port), PortLoad(
            level=int(level), last_ns=int(last_ns), rate_bytes_s=int(rate_bytes_s),
            sent_bytes=int(sent_bytes), largest=int(largest), recent=int(recent),
            pushed_ns=int(pushed_ns)))

    def sent_bytes(self, sw: int, port: int) -> int:
        """Every byte switch ``sw`` sent to its port so far (what the port was offered)."""
        load = self.port_load(sw, port)
        return load.sent_bytes if load is not None else 0

    def largest_packet(self, sw: int, port: int) -> int:
        """The largest packet switch ``sw`` sent to its port so far, in bytes: a host's
        segmentation-offload unit (a TCP super-packet of up to 64 KiB) passes a veth whole."""
        load = self.port_load(sw, port)
        return load.largest if load is not None else 0

    def dead_drops(self, sw: int, port: int) -> int:
        """Packets the switch sent towards its port while the port was not live (a group
        with no live bucket counts them at its first)."""
        value = self.maps["sw_dead"].lookup(PortId(sw, port))
        return value.value if value is not None else 0

    def set_port_rate(self, sw: int, port: int, rate_bytes_s: int) -> None:
        """A port's drain rate changed (a degraded link), its queue as the datapath left it."""
        load = self.port_load(sw, port)
        if load is None:
            self.set_port_load(sw, port, rate_bytes_s)
        else:
            self.set_port_load(sw, port, rate_bytes_s, load.level, load.last_ns, load.sent_bytes,
                               load.largest)

    def set_live(self, sw: int, port: int, live: bool) -> None:
        """A port's liveness, as groups' buckets watch it."""
        if not _mark_live(self.maps["sw_out"], PortId(sw, port), live):
            raise TestbedError(f"switch {sw} has no port {port}")

    def set_table(self, sw: int, subtables: list[Subtable]) -> None:
        """Write switch ``sw``'s whole flow table: its entries, then its masks, then the entries
        it no longer has are removed."""
        if len(subtables) > MAX_SUBTABLES:
            raise TestbedError(f"switch {sw}: {len(subtables)} subtables")
        flows = self.maps["sw_flows"]
        before = self.written.get(sw, {})
        now: dict[tuple, tuple[FlowKey, tuple]] = {}
        for t, table in enumerate(subtables):
            for key, entry in table.entries.items():
                c_key = flow_key(sw, t, table, key)
                value = action(entry.priority, entry.actions)
                held = (bytes(c_key), value.priority, value.kind, value.arg, value.punt)
                known = before.get((table.mask, key))
                if known is None or known[1] != held:  # an unchanged entry: not rewritten
                    old = flows.lookup(known[0]) if known is not None else None
                    if old is not None:  # a modified entry keeps its counts
                        value.packets, value.bytes = old.packets, old.bytes
                    flows.update(c_key, value)
                now[(table.mask, key)] = (c_key, held)
        masks, written = self.maps["sw_masks"], self.masks.setdefault(sw, [None] * MAX_SUBTABLES)
        for t in range(MAX_SUBTABLES):
            if t < len(subtables):
                m = subtables[t].mask
                bits = 0
                for name in m.fields:
                    bits |= FIELD_BITS[name]
                value = MaskValue(bits, subtables[t].max_priority, m.ipv4_src_len,
                                  m.ipv4_dst_len, 1, 0)
            else:
                value = MaskValue(0, -1, 0, 0, 0, 0)
            if written[t] != bytes(value):  # a mask unchanged since the last table: as it is
                masks.update(TableId(sw, t), value)
                written[t] = bytes(value)
        keep = {held[0] for _k, held in now.values()}
        for stale, held in before.values():
            if held[0] not in keep:
                flows.delete(stale)
        self.written[sw] = now

    def counters(self, sw: int, mask, key) -> tuple[int, int]:
        """The packets and bytes an entry of switch ``sw`` (by its subtable's ``mask`` and
        ``key``, :func:`testbed.plan.tss.split_match`) matched; (0, 0) when it is not in the
        datapath (shadowed by one of higher priority)."""
        known = self.written.get(sw, {}).get((mask, key))
        value = self.maps["sw_flows"].lookup(known[0]) if known is not None else None
        return (value.packets, value.bytes) if value is not None else (0, 0)

    def port_counters(self, names: set[str]) -> dict[str, dict[str, int]]:
        """The counters of the ports' interfaces (one netlink dump)."""
        return self.links.read(names)

    def read_punts(self) -> list[tuple[PuntHead, bytes]]:
        """The packets punted since the last call: (their switch, port and length; their bytes)."""
        size = ctypes.sizeof(PuntHead)
        return [(PuntHead.from_buffer_copy(rec[:size]), rec[size:])
                for rec in self.punts.read() if len(rec) >= size]

    def set_group(self, sw: int, group_id: int, kind: str, ports: list[int],
                  weights: list[int] | None = None, basis: int = 0, selection: str = "hash",
                  gap_us: int = 0,
                  beyond: list[tuple[int, int, int, int] | None] | None = None,
                  rebalance: tuple[int, int] = (0, 0)) -> None:
        """A SELECT (``select``) or fast-failover (``ff``) group of switch ``sw``; a SELECT
        group's ``selection``: ``hash``/``dp_hash``, or switch-local ``flowlet`` (with its
        ``gap_us``) or ``packet``, or either weighing the next switch (``flowlet_next``,
        ``packet_next``) with what each bucket weighs ``beyond`` its port: (the next switch,
        its group towards the same destinations, whose path quality it weighs (0: none); the
        switch and port of the first link every way on takes, whose queue it reads (0: none)),
        None: nothing (:mod:`testbed.plan.lookahead`); a flowlet group's ``rebalance``: its
        reactive rebalancing's quality delta and chance per packet, percent ((0, 0): off;
        :func:`testbed.plan.localroute.rebalanced`)."""
        if len(ports) > MAX_BUCKETS:
            raise TestbedError(f"switch {sw} group {group_id}: more than {MAX_BUCKETS} buckets")
        if selection not in SELECTION:
            raise TestbedError(f"switch {sw} group {group_id}: selection {selection!r} is not "
                               f"one of {', '.join(SELECTION)}")
        g = Group(kind=G_FF if kind == "ff" else G_SELECT, basis=basis, n=len(ports),
                  selection=SELECTION[selection], gap_ns=int(gap_us) * 1000,
                  rb_delta_pct=rebalance[0], rb_chance=chance_of(rebalance[1]))
        for i, port in enumerate(ports):
            g.ports[i] = port
            g.weights[i] = (weights or [1] * len(ports))[i]
            if beyond and beyond[i] is not None:
                g.next[i] = Beyond(*beyond[i])
        self.maps["sw_groups"].update(GroupId(sw, group_id), g)

    def quality(self, sw: int, group_id: int) -> Quality | None:
        """The path quality a group weighing the next switch last published (None: none)."""
        return self.maps["sw_quality"].lookup(GroupId(sw, group_id))

    def set_quality(self, sw: int, group_id: int, delay_ns: int, at_ns: int) -> None:
        """A group's path quality as if it had published it at ``at_ns`` (CLOCK_MONOTONIC)."""
        self.maps["sw_quality"].update(GroupId(sw, group_id), Quality(int(delay_ns), int(at_ns)))

    def delete_group(self, sw: int, group_id: int) -> None:
        """Remove a group of switch ``sw`` (no entry may point at it any more), and the path
        quality it published."""
        self.maps["sw_groups"].delete(GroupId(sw, group_id))
        self.maps["sw_quality"].delete(GroupId(sw, group_id))


def set_live_pinned(pin_dir: Path, ifindex: int, live: bool) -> bool:
    """Another process's word that the link behind a switch port (by its interface's index)
    lost its signal: the port not live in the pinned maps at once, so that groups skip it (its
    switch's agent tells the controller when the carrier follows). False: not a switch port."""
    with bpf.Map(Path(pin_dir) / "sw_ports", ctypes.c_uint32, PortId) as ports, \
            bpf.Map(Path(pin_dir) / "sw_out", PortId, PortOut) as outs:
        port = ports.lookup(ctypes.c_uint32(ifindex))
        return port is not None and _mark_live(outs, port, live)


def _mark_live(outs: bpf.Map, port: PortId, live: bool) -> bool:
    """Set a port's liveness in its ``sw_out`` entry; False when it has none."""
    out = outs.lookup(port)
    if out is None:
        return False
    out.live = int(live)
    outs.update(port, out)
    return True
