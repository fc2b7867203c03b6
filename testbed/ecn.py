"""The ECN marker of a run (``testbed/bpf/ecn_marker.c``): loaded once, attached at the egress
of every switch port, configured per port through its maps, and read back as counters.

The structures below mirror the C program's; a size check at import keeps them in step.
"""

from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass
from pathlib import Path

from testbed import bpf
from testbed.congestion import PRIORITIES, EcnMode, EcnThresholds
from testbed.netlink import Netlink

PROGRAM = "ecn_marker"
_MODES = {EcnMode.OFF: 0, EcnMode.STEP: 1, EcnMode.RED: 2}
PROB_SCALE = 1_000_000


class _EcnCfg(ctypes.Structure):
    _fields_ = [("mode", ctypes.c_uint32), ("k_bytes", ctypes.c_uint32),
                ("kmin_bytes", ctypes.c_uint32), ("kmax_bytes", ctypes.c_uint32),
                ("pmax", ctypes.c_uint32)]


class _PortCfg(ctypes.Structure):
    _fields_ = [("rate_bytes_s", ctypes.c_uint64), ("burst_bytes", ctypes.c_uint64),
                ("limit_bytes", ctypes.c_uint64),
                ("dscp_prio", ctypes.c_uint8 * 64), ("ecn", _EcnCfg * PRIORITIES)]


class _VQueue(ctypes.Structure):
    _fields_ = [("lock", ctypes.c_uint32), ("pad", ctypes.c_uint32),
                ("level_bytes", ctypes.c_int64), ("last_ns", ctypes.c_uint64),
                ("max_bytes", ctypes.c_uint64)]


class _CountKey(ctypes.Structure):
    _fields_ = [("ifindex", ctypes.c_uint32), ("prio", ctypes.c_uint32)]


COUNTER_FIELDS = ("packets", "bytes", "ect", "marked", "ce_seen", "vq_drops")


class _Counters(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in COUNTER_FIELDS]


assert (ctypes.sizeof(_PortCfg), ctypes.sizeof(_VQueue), ctypes.sizeof(_Counters)) == (248, 32, 48)


@dataclass(frozen=True)
class PortMarking:
    """What the marker does at one port: the queue it mirrors and the marking per priority."""

    rate_mbps: float
    burst_bytes: int  # the HTB class's burst
    limit_bytes: int  # the bfifo's limit (0 for a packet-count queue: not mirrored)
    dscp_priority: tuple[int, ...]  # 64 entries
    thresholds: tuple[EcnThresholds, ...]  # one per priority


def _port_cfg(marking: PortMarking) -> _PortCfg:
    cfg = _PortCfg(rate_bytes_s=int(marking.rate_mbps * 1e6 / 8),
                   burst_bytes=marking.burst_bytes, limit_bytes=marking.limit_bytes)
    for dscp, prio in enumerate(marking.dscp_priority):
        cfg.dscp_prio[dscp] = prio
    for prio, th in enumerate(marking.thresholds):
        cfg.ecn[prio] = _EcnCfg(_MODES[th.mode], th.k_bytes, th.kmin_bytes, th.kmax_bytes,
                                int(th.pmax * PROB_SCALE))
    return cfg


class Marker:
    """One run's marker: ``pin_dir`` holds its program and maps until :meth:`close`.

    Args:
        state_dir: where the built object is cached.
        pin_dir: the run's BPF pins (``/sys/fs/bpf/fabriclab/<run id>``).
    """

    def __init__(self, state_dir: Path, pin_dir: Path) -> None:
        self.pin_dir = pin_dir
        self.prog_fd = bpf.obj_get(bpf.load(bpf.build(PROGRAM, state_dir), pin_dir))
        self.cfg = bpf.Map(pin_dir / "fl_cfg", ctypes.c_uint32, _PortCfg)
        self.queue = bpf.Map(pin_dir / "fl_queue", ctypes.c_uint32, _VQueue)
        self.count = bpf.Map(pin_dir / "fl_count", _CountKey, _Counters)
        self.ports: dict[int, tuple[str, float]] = {}  # ifindex -> (name, rate in bytes/s)

    def attach(self, netlink: Netlink, ifname: str, marking: PortMarking) -> None:
        """Configure and attach the marker at a root-namespace port's egress."""
        ifindex = netlink.index(ifname)
        key = ctypes.c_uint32(ifindex)
        self.cfg.update(key, _port_cfg(marking))
        self.queue.update(key, _VQueue())
        netlink.attach_bpf_egress(ifname, self.prog_fd, PROGRAM)
        self.ports[ifindex] = (ifname, marking.rate_mbps * 1e6 / 8)

    def counters(self) -> dict[tuple[str, int], dict[str, int]]:
        """(port, priority) -> packets, bytes, ect, marked, ce_seen, vq_drops, read now."""
        return {(self.ports[k.ifindex][0], k.prio): {f: getattr(v, f) for f in COUNTER_FIELDS}
                for k, v in self.count.items() if k.ifindex in self.ports}

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

    def close(self) -> None:
        for m in (self.cfg, self.queue, self.count):
            m.close()
        if self.prog_fd >= 0:
            os.close(self.prog_fd)
            self.prog_fd = -1
