"""The CBFC agent: credit-based flow control for the lossless priorities (instead of PFC's pause
frames), a fabric service like the PFC agent (:mod:`testbed.fabric.pfc`), whose links, feeders
and wake-up frames it shares.

Every ``poll_s`` it reads the backlog of every switch port's lossless leaves (one qdisc dump)
and the marker's count of bytes each switch port enqueued from each of its switch's ingress
ports (the eBPF egress program reads ``skb->ingress_ifindex``: the eBPF switches forward in
the kernel, so a packet still knows its ingress at the egress); :class:`testbed.plan.credits.CreditState`
decides each link's credit, and the agent gives it to the link's upstream port: its lossless TBF
leaf becomes a bucket of exactly that many bytes at a standstill rate (the kernel then holds
the rest of that port's lossless packets back, as a port without credit does), or runs freely
while the credit covers more than the port can send before the next sample. A change is
followed by a wake-up frame through the port (the TBF's own timer is seconds away); it carries
the local experimental EtherType 0x88B5, not a PFC frame, and the switches drop it.
"""

from __future__ import annotations

import struct
import time

from testbed.linux.rawnl import RawTc
from testbed.model.congestion import PfcThresholds, frame_bytes
from testbed.plan.credits import CreditState, Grant
from testbed.plan.tcplan import TBF_MAX_BUFFER_S, TbfSetting
from testbed.fabric.pfc import REACTIONS_KEPT, PfcAgent, PortAccess, _class, _quantiles

#: a credit update's wake-up frame: MAC control's address, EtherType 0x88B5 (local
#: experimental), a priority and a credit in bytes
CREDIT_ETHERTYPE = 0x88B5


def wake_frame(priority: int, credit: int) -> bytes:
    return (bytes.fromhex("0180c2000001") + bytes(6)
            + struct.pack("!HBI", CREDIT_ETHERTYPE, priority, credit)).ljust(60, b"\0")


class CbfcAgent(PfcAgent):
    """Runs as :meth:`testbed.fabric.services.FabricRun.start_thread`'s target.

    Args:
        access: the ports it watches and gives credits for (eBPF switches).
        thresholds: the lossless priorities' settings (``credit_bytes`` per link).
    """

    def __init__(self, access: PortAccess, thresholds: PfcThresholds) -> None:
        super().__init__(access, thresholds)
        # every link always has a bucket of its credit (never running freely: a free run
        # between two samples could send more than the buffer left)
        self.state = CreditState(self.feeders, thresholds.priorities, thresholds.credit_bytes,
                                 frame_bytes(access.mtu), 1 << 62)
        self.where = {port: (pid, access.netlink.index(port, pid), plan)
                      for port, (pid, plan) in self.upstream.items()}
        self.credits_given = 0

    def _decide(self, now: float, backlog: dict[tuple[str, int], int]) -> list:
        """This sample's credits (the loop is the PFC agent's)."""
        enqueued = self.access.marker.enqueued()
        with self.lock:
            return self.state.step(now, enqueued, backlog)

    def _apply(self, changer: RawTc, grant: Grant, sampled_at: float) -> None:
        pid, index, plan = self.where[grant.port]
        cls = _class(plan, grant.priority)
        if grant.credit is None:
            setting = plan.running(cls)
        elif grant.credit == 0:
            setting = plan.paused(cls)
        else:  # a bucket of the credit, refilled at a standstill (as slow as the kernel holds
            # such a bucket: 2^32 ns of it)
            kbit = max(plan.paused(cls).rate_kbit,
                       -(-grant.credit * 8 // int(TBF_MAX_BUFFER_S * 1000)))
            setting = TbfSetting(kbit, grant.credit, cls.limit_bytes)
        t0 = time.monotonic()
        changer.send(pid, RawTc.request(index, grant.priority, setting),
                     f"credit {grant.credit} to {grant.port} priority {grant.priority}")
        if grant.credit != 0:
            self._kick_port(grant.port, pid, wake_frame(grant.priority, grant.credit or 0))
        t1 = time.monotonic()
        with self.lock:
            self.credits_given += 1
            if len(self.apply_s) < REACTIONS_KEPT:
                self.apply_s.append(t1 - t0)
            if grant.stalls and len(self.reactions_s) < REACTIONS_KEPT:
                self.reactions_s.append(t1 - sampled_at)

    def counters(self) -> dict[tuple[str, int], dict]:
        """(upstream port, priority) -> credit stalls: events, stalled seconds, stalled now."""
        with self.lock:
            return self.state.counters(time.monotonic())

    def report(self) -> dict:
        """The agent's figures: its settings, samples, credit changes, CPU, the credit cycles
        it saw (deadlocks)."""
        with self.lock:
            deadlocks = [{"priority": d["priority"], "ports": d["ports"],
                          "first_seen_s": round(d["first_seen"] - self.started, 3)}
                         for d in self.state.deadlocks()]
            apply_s, reactions = sorted(self.apply_s), sorted(self.reactions_s)
            return {"mode": "cbfc",
                    "thresholds": (f"priorities {', '.join(map(str, self.th.priorities))}: "
                                   f"credit {self.th.credit_bytes / 1024:.1f} KiB per link, "
                                   f"sampled every {self.th.poll_s * 1000:g} ms"),
                    "samples": self.samples, "credit_changes": self.credits_given,
                    "stall_reaction_ms": _quantiles(reactions),
                    "change_ms": _quantiles(apply_s), "cpu_s": round(self.cpu_s, 3),
                    "kicks_lost": self.kicks_lost, "deadlocks": deadlocks,
                    "warnings": [], "errors": list(self.errors)}
