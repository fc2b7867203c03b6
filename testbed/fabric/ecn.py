"""The ECN marker of a run (``testbed/linux/progs/ecn_marker.c``): loaded once, attached at the egress
of every switch port, configured per port through its maps, and read back as counters.

The structures below mirror the C program's; a size check at import keeps them in step.
"""

from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass
from pathlib import Path

from testbed.linux import bpf
from testbed.model.congestion import PRIORITIES, EcnMode, EcnThresholds
from testbed.plan.trim import TrimSpec
from testbed.model.spec import ImpairSpec
from testbed.errors import TestbedError
from testbed.linux.netlink import Netlink

OBJECT = "ecn_marker"
EGRESS_PROGRAM = "ecn_marker"
INGRESS_PROGRAM = "rx_count"
PORT_CLASSIFY = 1  # a host NIC: steer into classes, keep nothing per port
PORT_CLASSES = 2  # the port has one HTB class per priority
_MODES = {EcnMode.OFF: 0, EcnMode.STEP: 1, EcnMode.RED: 2}
PROB_SCALE = 1_000_000


class _EcnCfg(ctypes.Structure):
    _fields_ = [("mode", ctypes.c_uint32), ("k_bytes", ctypes.c_uint32),
                ("kmin_bytes", ctypes.c_uint32), ("kmax_bytes", ctypes.c_uint32),
                ("pmax", ctypes.c_uint32)]


class _PortCfg(ctypes.Structure):
    _fields_ = [("rate_bytes_s", ctypes.c_uint64), ("burst_bytes", ctypes.c_uint64),
                ("limit_bytes", ctypes.c_uint64), ("flags", ctypes.c_uint32),
                ("drop_ppm", ctypes.c_uint32), ("dscp_prio", ctypes.c_uint8 * 64),
                ("ecn", _EcnCfg * PRIORITIES), ("trim_threshold", ctypes.c_uint32),
                ("trim_size", ctypes.c_uint16), ("trim_dscp", ctypes.c_uint8),
                ("trim_prios", ctypes.c_uint8), ("ber_fe", ctypes.c_uint64),
                ("llr", ctypes.c_uint32), ("cbfc_prios", ctypes.c_uint32)]


class _VQueue(ctypes.Structure):
    _fields_ = [("lock", ctypes.c_uint32), ("pad", ctypes.c_uint32),
                ("level_bytes", ctypes.c_int64), ("last_ns", ctypes.c_uint64),
                ("max_bytes", ctypes.c_uint64), ("tx_bytes", ctypes.c_uint64)]


class _EnqKey(ctypes.Structure):
    _fields_ = [("ifindex", ctypes.c_uint32), ("ingress", ctypes.c_uint32),
                ("prio", ctypes.c_uint32)]


class _CountKey(ctypes.Structure):
    _fields_ = [("ifindex", ctypes.c_uint32), ("prio", ctypes.c_uint32)]


COUNTER_FIELDS = ("packets", "bytes", "ect", "marked", "ce_seen", "vq_drops", "loss_drops",
                  "trimmed", "corrupted", "llr_replays")


class _Counters(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in COUNTER_FIELDS]


class _RxCounters(ctypes.Structure):
    _fields_ = [("packets", ctypes.c_uint64), ("bytes", ctypes.c_uint64),
                ("bad_fcs", ctypes.c_uint64)]


assert (ctypes.sizeof(_PortCfg), ctypes.sizeof(_VQueue), ctypes.sizeof(_Counters)) == (280, 40, 80)


@dataclass(frozen=True)
class PortMarking:
    """What the marker does at one port: the queue it mirrors and the marking per priority."""

    rate_mbps: float
    burst_bytes: int  # the HTB class's burst
    limit_bytes: int  # the bfifo's limit (0 for a packet-count queue: not mirrored)
    dscp_priority: tuple[int, ...]  # 64 entries
    thresholds: tuple[EcnThresholds, ...]  # one per priority
    classes: bool = False  # steer IP packets into one HTB class per priority
    loss_percent: float = 0.0  # the link's random loss, dropped here
    trim: TrimSpec | None = None  # packet trimming at this port
    impair: ImpairSpec | None = None  # the link's bit errors (and LLR), at this end
    cbfc_priorities: tuple[int, ...] = ()  # count these priorities' bytes by ingress


def _port_cfg(marking: PortMarking) -> _PortCfg:
    cfg = _PortCfg(rate_bytes_s=int(marking.rate_mbps * 1e6 / 8),
                   burst_bytes=marking.burst_bytes, limit_bytes=marking.limit_bytes,
                   flags=PORT_CLASSES if marking.classes else 0,
                   drop_ppm=_ppm(marking.loss_percent))
    _impair(cfg, marking.impair)
    cfg.cbfc_prios = sum(1 << p for p in marking.cbfc_priorities)
    for dscp, prio in enumerate(marking.dscp_priority):
        cfg.dscp_prio[dscp] = prio
    for prio, th in enumerate(marking.thresholds):
        cfg.ecn[prio] = _EcnCfg(_MODES[th.mode], th.k_bytes, th.kmin_bytes, th.kmax_bytes,
                                int(th.pmax * PROB_SCALE))
    trim = marking.trim
    if trim is not None and marking.limit_bytes:  # trimming needs the mirrored byte queue
        cfg.trim_threshold = max(1, trim.threshold_bytes(marking.limit_bytes))
        cfg.trim_size, cfg.trim_dscp = trim.size_b, trim.dscp
        cfg.trim_prios = sum(1 << p for p in range(PRIORITIES) if trim.trims(p))
    return cfg


def _impair(cfg: _PortCfg, impair: ImpairSpec | None) -> None:
    if impair is not None:
        cfg.ber_fe = impair.ber_fe
        cfg.llr = int(impair.llr)


def _ppm(loss_percent: float) -> int:
    return int(round(loss_percent * PROB_SCALE / 100))


class Marker:
    """One run's marker: ``pin_dir`` holds its program and maps until :meth:`close`.

    Args:
        state_dir: where the built object is cached.
        pin_dir: the run's BPF pins (``/sys/fs/bpf/fabriclab/<run id>``).
    """

    def __init__(self, state_dir: Path, pin_dir: Path) -> None:
        self.pin_dir = pin_dir
        progs = bpf.load(bpf.build(OBJECT, state_dir), pin_dir)
        self.prog_fd = bpf.obj_get(progs / EGRESS_PROGRAM)
        self.rx_fd = bpf.obj_get(progs / INGRESS_PROGRAM)
        self.cfg = bpf.Map(pin_dir / "fl_cfg", ctypes.c_uint32, _PortCfg)
        self.queue = bpf.Map(pin_dir / "fl_queue", ctypes.c_uint32, _VQueue)
        self.count = bpf.Map(pin_dir / "fl_count", _CountKey, _Counters)
        self.rx = bpf.Map(pin_dir / "fl_rx", _CountKey, _RxCounters)
        self.enq = bpf.Map(pin_dir / "fl_enq", _EnqKey, ctypes.c_uint64)
        self.ports: dict[int, tuple[str, float]] = {}  # ifindex -> (name, rate in bytes/s)
        self.host_keys: dict[int, set[str]] = {}  # host NICs' indexes (in their namespaces)
        self.index: dict[str, int] = {}  # switch port -> its index
        self.hosts: dict[int, str] = {}  # host NIC index -> its name

    def attach(self, netlink: Netlink, ifname: str, marking: PortMarking,
               count_rx: bool = False) -> None:
        """Configure and attach the marker at a root-namespace switch port's egress (and its
        packet counter per priority at the ingress, for the PFC agent)."""
        ifindex = netlink.index(ifname)
        if ifindex in self.host_keys:
            raise TestbedError(f"switch port {ifname} has interface index {ifindex}, as the "
                               f"NIC of {', '.join(sorted(self.host_keys[ifindex]))} in its "
                               "namespace: the marker's settings would collide")
        key = ctypes.c_uint32(ifindex)
        self.cfg.update(key, _port_cfg(marking))
        self.queue.update(key, _VQueue())
        netlink.attach_bpf(ifname, self.prog_fd, EGRESS_PROGRAM)
        if count_rx:
            netlink.attach_bpf(ifname, self.rx_fd, INGRESS_PROGRAM, ingress=True)
        self.ports[ifindex] = (ifname, marking.rate_mbps * 1e6 / 8)
        self.index[ifname] = ifindex

    def classify_host(self, netlink: Netlink, host: str, pid: int, ifname: str,
                      dscp_priority: tuple[int, ...], classes: bool = True,
                      loss_percent: float = 0.0, impair: ImpairSpec | None = None) -> None:
        """At a host NIC (in the host's namespace): steer its IP packets into their priority's
        class, and drop the link's random loss in its direction. Host NICs are made in the
        root namespace and moved, so their indexes are unique (checked)."""
        ifindex = netlink.index(ifname, pid)
        if ifindex in self.ports:
            raise TestbedError(f"the NIC of {host} has interface index {ifindex} in its "
                               f"namespace, as switch port {self.ports[ifindex][0]}: the "
                               "marker's settings would collide")
        cfg = _PortCfg(flags=PORT_CLASSIFY | (PORT_CLASSES if classes else 0),
                       drop_ppm=_ppm(loss_percent))
        _impair(cfg, impair)
        for dscp, prio in enumerate(dscp_priority):
            cfg.dscp_prio[dscp] = prio
        self.cfg.update(ctypes.c_uint32(ifindex), cfg)
        self.host_keys.setdefault(ifindex, set()).add(host)
        self.hosts[ifindex] = ifname
        netlink.attach_bpf(ifname, self.prog_fd, EGRESS_PROGRAM, pid=pid)
        if impair is not None:  # corrupted frames from the switch die here (a bad FCS)
            netlink.attach_bpf(ifname, self.rx_fd, INGRESS_PROGRAM, pid=pid, ingress=True)

    def set_rate(self, ifname: str, rate_bytes_s: float) -> None:
        """A switch port's rate changed (a degraded link): its virtual queue drains at it."""
        ifindex = self.index[ifname]
        key = ctypes.c_uint32(ifindex)
        cfg = self.cfg.lookup(key)
        cfg.rate_bytes_s = int(rate_bytes_s)
        self.cfg.update(key, cfg)
        self.ports[ifindex] = (ifname, float(rate_bytes_s))

    def offered(self, names: set[str], prios: set[int] | None = None) -> dict[str, int]:
        """Switch port -> the bytes offered to its egress so far, of ``prios`` (default every
        priority; those its queue then dropped too): one lookup per port and priority."""
        out = {}
        for name in names:
            total = 0
            for prio in (range(PRIORITIES) if prios is None else prios):
                value = self.count.lookup(_CountKey(self.index[name], prio))
                total += value.bytes if value is not None else 0
            out[name] = total
        return out

    def arrivals(self, keys: set[tuple[str, int]] | None = None) -> dict[tuple[str, int], int]:
        """(switch port, priority) -> packets received so far (ports with ``count_rx``): all of
        them, or those of ``keys`` (one lookup each)."""
        if keys is None:
            return {(self.ports[k.ifindex][0], k.prio): v.packets for k, v in self.rx.items()
                    if k.ifindex in self.ports}
        out = {}
        for name, prio in keys:
            value = self.rx.lookup(_CountKey(self.index[name], prio))
            out[(name, prio)] = value.packets if value is not None else 0
        return out

    def counters(self) -> dict[tuple[str, int], dict[str, int]]:
        """(port, priority) -> packets, bytes, ect, marked, ce_seen, vq_drops, loss_drops,
        read now (host NICs count only their loss drops)."""
        names = {**self.hosts, **{i: p[0] for i, p in self.ports.items()}}
        out = {(names[k.ifindex], k.prio): {f: getattr(v, f) for f in COUNTER_FIELDS}
               for k, v in self.count.items() if k.ifindex in names}
        for k, v in self.rx.items():  # frames that arrived corrupted, dropped there
            if k.ifindex in names and v.bad_fcs:
                out.setdefault((names[k.ifindex], k.prio), {})["bad_fcs"] = v.bad_fcs
        return out

    def queues(self) -> dict[str, tuple[int, int]]:
        """Port -> (virtual backlog now, its maximum so far), in bytes. The program updates a
        queue only when a packet passes; "now" drains it to this instant at the port's rate
        (``bpf_ktime_get_ns`` is CLOCK_MONOTONIC)."""
        out = {}
        now = time.monotonic_ns()
        for ifindex, (name, rate) in self.ports.items():
            q = self.queue.lookup(ctypes.c_uint32(ifindex))
            if q is not None:
                drained = max(0, now - q.last_ns) * rate / 1e9
                out[name] = (max(0, int(q.level_bytes - drained)), q.max_bytes)
        return out

    def enqueued(self) -> dict[tuple[str, str, int], int]:
        """(switch port, ingress port of its switch, priority) -> bytes it enqueued from there
        so far (the priorities counted for credit-based flow control)."""
        names = {i: p[0] for i, p in self.ports.items()}
        return {(names[k.ifindex], names[k.ingress], k.prio): v.value if hasattr(v, "value")
                else int(v) for k, v in self.enq.items()
                if k.ifindex in names and k.ingress in names}

    def tx_bytes(self) -> dict[str, int]:
        """Port -> the bytes that joined its queue so far (what its INT stamps say, modulo
        2^32)."""
        out = {}
        for ifindex, (name, _rate) in self.ports.items():
            q = self.queue.lookup(ctypes.c_uint32(ifindex))
            if q is not None:
                out[name] = q.tx_bytes
        return out

    def close(self) -> None:
        for m in (self.cfg, self.queue, self.count, self.rx, self.enq):
            m.close()
        for attr in ("prog_fd", "rx_fd"):
            if getattr(self, attr) >= 0:
                os.close(getattr(self, attr))
                setattr(self, attr, -1)
