"""The agents' delay line and their timing, sans I/O.

A kernel without netem cannot hold a packet on a link for a while. The UDP transports' agents
can: every datagram an agent receives waits in its :class:`DelayLine` until its path's one-way
delay has passed since it arrived (the links' latency, summed along the path and added at the
receiving end; queueing at the switches happened on the way, at the emulated rates). Data and
acknowledgements alike: a round trip then carries both directions' delay.

Putting the whole path's latency at its end keeps what the end hosts see (every round trip,
the ACK clock, the delay a delay-based control measures) and every queue's service; what moves
is where in the round trip a flow's packets spend their latency: a switch sees a flow's packets
up to one path's latency earlier than with the latency spread over the hops, a constant shift
per flow that matters only to flows whose start times are within a path's latency of each
other's (a few microseconds of the real fabric).

:class:`~testbed.plan.delayline.Lateness` counts how late the agent did what it was due to do (a packet released, a
paced packet sent), in a histogram that sums over agents and differences over collectives.
"""

from __future__ import annotations

from testbed.plan.delayline import DelayLine, Lateness


class AgentTiming:
    """An agent's latency and timing: the delay line for what it receives (``delays_s``: the
    one-way delay from each rank; None: none), its lateness, the least round trip its senders
    measured (and the least against each path's unloaded one, ``rtts_s``), and its pings'
    round trips less the links' latency (what the emulation adds)."""

    def __init__(self, delays_s: list[float] | None, rtts_s: list[float] | None) -> None:
        self.delays_s = delays_s if delays_s and any(delays_s) else None
        self.rtts_s = rtts_s
        self.line = DelayLine()
        self.late = Lateness()
        self.rtt_min_s: float | None = None
        self.rtt_min_ratio: float | None = None
        self.probe_excess_s: list[float] = []
        self.pongs = 0

    def delay(self, peer: int) -> float:
        """How long a packet from rank ``peer`` waits (-1: not a rank of the job: none)."""
        return self.delays_s[peer] if self.delays_s and peer >= 0 else 0.0

    def released(self, now: float) -> list[object]:
        """The held items due by ``now``, their lateness counted."""
        out = []
        for due, item in self.line.release(now):
            self.late.released(now - due)
            out.append(item)
        return out

    def rtt(self, rtt: float, peer: int) -> None:
        """A round trip a sender measured to ``peer``."""
        if rtt <= 0:
            return
        if self.rtt_min_s is None or rtt < self.rtt_min_s:
            self.rtt_min_s = rtt
        unloaded = self.rtts_s[peer] if self.rtts_s and peer >= 0 else 0.0
        if unloaded > 0 and (self.rtt_min_ratio is None or rtt / unloaded < self.rtt_min_ratio):
            self.rtt_min_ratio = rtt / unloaded

    def pong(self, rtt: float, peer: int) -> None:
        """A ping's answer from ``peer``, ``rtt`` after it left."""
        self.probe_excess_s.append(max(0.0, rtt - 2 * self.delay(peer)))
        self.pongs += 1

    def summary(self) -> dict:
        """The counters the agent reports (see :class:`traffic.measure.rows.TransportCounters`)."""
        out: dict = {"lateness_us": self.late.summary()}
        if self.rtt_min_s is not None:
            out["rtt_min_us"] = round(self.rtt_min_s * 1e6, 1)
        if self.rtt_min_ratio is not None:
            out["rtt_min_ratio"] = round(self.rtt_min_ratio, 4)
        if self.probe_excess_s:
            out["probe_excess_min_us"] = round(min(self.probe_excess_s) * 1e6, 1)
            out["probe_excess_max_us"] = round(max(self.probe_excess_s) * 1e6, 1)
        return out
