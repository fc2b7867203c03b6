"""A link failure as a cut cable, the adapter: the link stops, its switches learn it, then its
veths go down.

Taking a veth down is slow to show: the kernel's close waits for an RCU grace period before it
drops the carrier and announces it (9-74 ms measured here), the link carries packets until then,
and the switch cannot know sooner. A real switch's port sees the loss of signal within
microseconds. So a failure, in this order:

1. **cut**: an eBPF program (``bpf/link_cut.c``) at the egress of both ends, ahead of the
   marker and the qdisc, drops every frame sent into the link from now on (a netlink request
   per end, well under a millisecond each), counting them;
2. **loss of signal**: each switch end's Open vSwitch is told at once
   (:func:`testbed.linux.ovs.signal_loss`: a BFD session that is down makes the port not live): its
   groups skip the port and the controller gets the port status, within milliseconds;
3. **down**: both veth ends go down, as before (their carrier follows, tens of ms later).

A repair runs it backwards: the veths up, the cut removed, the switches' signal back. Without
the eBPF toolchain the failure is the veths going down alone (the fabric warns).
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from testbed.linux import bpf

from testbed.linux import ovs
from testbed.linux.netlink import Netlink

PROGRAM = "link_cut"
CUT_PRIO = 1  # before the marker's filter (prio 2)


@dataclass(frozen=True)
class End:
    """One end of a link: its interface, the namespace it is in (a host's pid, None for the root
    namespace) and, on a switch, that switch's Open vSwitch database (None: the machine's)."""

    ifname: str
    pid: int | None
    switch: bool
    db: str | None = None


class LinkCut:
    """The cut program of one run, pinned under ``pin_dir``: built and loaded when
    ``state_dir`` is given (the fabric's owner, at bring-up), else opened from the pins
    (``fabriclab fail`` in another process)."""

    def __init__(self, pin_dir: Path, state_dir: Path | None = None) -> None:
        self.pin_dir = Path(pin_dir)
        if state_dir is not None:
            bpf.load(bpf.build(PROGRAM, state_dir), self.pin_dir)
        self.fd = bpf.obj_get(self.pin_dir / "progs" / PROGRAM)
        self.drops = bpf.Map(self.pin_dir / "cut_drops", ctypes.c_uint32, ctypes.c_uint64)

    def cut(self, netlink: Netlink, end: End) -> None:
        netlink.attach_bpf(end.ifname, self.fd, PROGRAM, pid=end.pid, prio=CUT_PRIO)

    def mend(self, netlink: Netlink, end: End) -> None:
        netlink.detach_bpf(end.ifname, CUT_PRIO, pid=end.pid)

    def dropped(self, netlink: Netlink, ends: Iterable[End]) -> int:
        """Frames the cut dropped so far at ``ends`` (all of its cuts of them)."""
        total = 0
        for end in ends:
            value = self.drops.lookup(ctypes.c_uint32(netlink.index(end.ifname, end.pid)))
            total += value.value if value is not None else 0
        return total

    def dropped_at(self, ifindex: int) -> int:
        """Frames the cut dropped so far at one root-namespace interface (by its index)."""
        value = self.drops.lookup(ctypes.c_uint32(ifindex))
        return value.value if value is not None else 0

    def close(self) -> None:
        self.drops.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def set_links(netlink: Netlink, links: list[tuple[End, End]], up: bool,
              cut: LinkCut | None,
              signal: Callable[[list[End], bool], None] | None = None) -> dict[str, float]:
    """Fail (``up=False``) or repair the links, all at once, in the order of the module's doc.

    Args:
        netlink: the caller's sockets.
        links: both ends of each link.
        cut: the run's cut program, or None (the veths only).
        signal: tells the switches of the loss (or return) of signal at their ends, given
            every switch end at once (default: each end's Open vSwitch,
            :func:`testbed.linux.ovs.signal_loss`, in parallel: one OVSDB transaction each).

    Returns:
        When each step was done, in seconds after the call: ``cut_s``, ``signalled_s``,
        ``down_s`` (or ``up_s``, ``mended_s``, ``signalled_s`` for a repair).
    """
    if signal is None:
        ovs.has_ovsdb_client()  # imported here, not in the pool's threads (a fabric did already)
        signal = _tell_each_vswitchd
    ends = [e for pair in links for e in pair]
    switch_ends = [e for e in ends if e.switch]
    start = time.monotonic()
    times: dict[str, float] = {}

    def mark(step: str) -> None:
        times[step] = round(time.monotonic() - start, 4)

    def tell(lost: bool) -> None:
        if switch_ends:
            signal(switch_ends, lost)

    if not up:
        if cut is not None:
            for end in ends:
                cut.cut(netlink, end)
            mark("cut_s")
        tell(True)
        mark("signalled_s")
        for end in ends:
            netlink.set_state(end.ifname, False, pid=end.pid)
        mark("down_s")
    else:
        for end in ends:
            netlink.set_state(end.ifname, True, pid=end.pid)
        mark("up_s")
        if cut is not None:
            for end in ends:
                cut.mend(netlink, end)
            mark("mended_s")
        tell(False)
        mark("signalled_s")
    return times


def _tell_each_vswitchd(ends: list[End], lost: bool) -> None:
    """Each end's Open vSwitch told of the loss (or return) of signal, all at once."""
    with ThreadPoolExecutor(max_workers=min(8, len(ends))) as pool:
        for future in [pool.submit(ovs.signal_loss, e.ifname, lost, e.db) for e in ends]:
            future.result()
