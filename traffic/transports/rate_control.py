"""rocev2's congestion controls besides DCQCN (:mod:`traffic.transports.rocev2`), sans I/O:
each keeps a window (bytes in flight) and a pacing rate, and reads the ACKs.

HPCC (Li et al., SIGCOMM 2019; the IETF draft's pseudocode, draft-miao-tsv-hpcc): every ACK
echoes the INT the switches stamped on the packet it answers (:class:`Hop`: time, bytes sent,
queue, rate per hop). Per hop, the utilization is the queue over a base RTT's worth of bytes
plus the rate the port sent at since the previous ACK, over its rate; the most loaded hop's
smooths ``U`` (an EWMA weighted by the time between the two stamps, up to a base RTT ``T``).
The window is ``Wc / (U / eta) + W_ai`` when ``U >= eta`` (or after ``max_stage`` additive
steps), else ``Wc + W_ai``; ``Wc`` (the reference) moves to it once per round trip. The pace
is the window per base RTT. HPCC aims at ``eta`` (95 %) of the bottleneck and near-empty
queues.

Swift (Kumar et al., SIGCOMM 2020), on the same transport and its ACKs' echoed send times:
under the target delay the window grows by ``ai`` packets per window acknowledged; over it,
it is cut by ``beta x (delay - target) / delay`` (at most ``max_mdf``), once per round trip.
A window below a packet is paced out over a round trip.
"""

from __future__ import annotations

from dataclasses import dataclass

from traffic.transports.packet import Hop

INF = float("inf")


class WindowControl:
    """What rocev2's sender asks of a rate control (DCQCN's names), for the window-based ones:
    they read ACKs, not CNPs, and keep no timer."""

    window: float

    def on_cnp(self, now: float) -> None:
        pass

    def on_sent(self, nbytes: int) -> None:
        pass

    def timer(self) -> float:
        return INF

    def on_timer(self, now: float) -> None:
        pass


@dataclass(frozen=True)
class HpccConfig:
    line_rate_bps: float
    base_rtt_s: float  # HPCC's T
    mss: int
    eta: float = 0.95
    max_stage: int = 5
    w_ai: int = 0  # bytes (0: :attr:`additive_bytes` chooses)

    @property
    def bdp_bytes(self) -> int:
        return max(self.mss, int(self.line_rate_bps / 8 * self.base_rtt_s))

    @property
    def additive_bytes(self) -> int:
        """W_ai: the draft's BDP x (1 - eta) / N with N (the flows a link carries) 10, at
        least 80 bytes (a packet would let 16 senders overshoot by 16 packets a round trip)."""
        return self.w_ai or max(80, int(self.bdp_bytes * (1 - self.eta) / 10))

    def describe(self) -> str:
        return (f"HPCC eta {self.eta:g}, max stage {self.max_stage}, W_ai "
                f"{self.additive_bytes} B, T {self.base_rtt_s * 1e3:.1f} ms")


class Hpcc(WindowControl):
    """HPCC's sender state of one queue pair."""

    def __init__(self, cfg: HpccConfig, now: float) -> None:
        self.cfg = cfg
        self.wc = float(cfg.bdp_bytes)  # the reference window
        self.window = self.wc
        self.u = cfg.eta
        self.stage = 0
        self.links: tuple[Hop, ...] = ()  # the previous ACK's INT
        self.last_update_seq = 0
        self.cuts = 0
        self.updates = 0

    @property
    def rate(self) -> float:
        return min(self.cfg.line_rate_bps, self.window * 8 / self.cfg.base_rtt_s)

    def utilization(self, hops: tuple[Hop, ...]) -> float | None:
        """The draft's MeasureInflight: U after this ACK's INT (None: no previous sample of
        the same path)."""
        cfg = self.cfg
        if len(hops) != len(self.links) or not hops:
            self.links = hops
            return None
        u, tau = 0.0, cfg.base_rtt_s
        for now, then in zip(hops, self.links):
            dt = (now.ts_ns - then.ts_ns) / 1e9
            if dt <= 0 or now.rate_kbps == 0:
                continue
            sent = (now.tx_bytes - then.tx_bytes) % (1 << 32)
            rate = now.rate_bytes_s
            u_hop = min(now.qlen_bytes, then.qlen_bytes) / (rate * cfg.base_rtt_s) \
                + sent / dt / rate
            if u_hop > u:
                u, tau = u_hop, dt
        tau = min(tau, cfg.base_rtt_s)
        self.u = (1 - tau / cfg.base_rtt_s) * self.u + tau / cfg.base_rtt_s * u
        self.links = hops
        return self.u

    def on_ack(self, ack_psn: int, next_psn: int, hops: tuple[Hop, ...], rtt_s: float,
               now: float) -> None:
        """An ACK up to ``ack_psn`` with the INT of the packet it answers; ``next_psn`` the
        next PSN to send (a round trip ends when an ACK passes the PSN sent at the previous
        update)."""
        if self.utilization(hops) is None:
            return
        update = ack_psn > self.last_update_seq
        if update:
            self.last_update_seq = next_psn
            self.updates += 1
        cfg = self.cfg
        if self.u >= cfg.eta or self.stage >= cfg.max_stage:
            # U of 0 (no queue and no bytes between two stamps of one instant): the ceiling
            w = (self.wc / (self.u / cfg.eta) if self.u > 0 else 4.0 * cfg.bdp_bytes) \
                + cfg.additive_bytes
            if update:
                self.stage = 0
                if w < self.wc:
                    self.cuts += 1
                self.wc = w
        else:
            w = self.wc + cfg.additive_bytes
            if update:
                self.stage += 1
                self.wc = w
        # at least W_ai: the pace (window per T) of many senders together must be able to
        # fall under the bottleneck's rate (a quarter packet each let 16 overrun 20 Mbit/s)
        self.window = max(float(cfg.additive_bytes), min(w, 4.0 * cfg.bdp_bytes))


@dataclass(frozen=True)
class SwiftConfig:
    line_rate_bps: float
    base_rtt_s: float
    mss: int
    target_factor: float = 1.5  # the target delay: base RTT x this
    ai: float = 1.0  # packets per window acknowledged, under the target
    beta: float = 0.8
    max_mdf: float = 0.5

    @property
    def bdp_bytes(self) -> int:
        return max(self.mss, int(self.line_rate_bps / 8 * self.base_rtt_s))

    def describe(self) -> str:
        return (f"Swift target delay {self.target_factor:g} base RTTs "
                f"({self.target_factor * self.base_rtt_s * 1e3:.1f} ms), AI {self.ai:g} "
                f"packet per window, beta {self.beta:g}, cut at most {self.max_mdf:g}")


class Swift(WindowControl):
    """Swift's sender state of one queue pair (window in bytes; the delay is the RTT the ACK
    echoes: fabric and host together, one target)."""

    def __init__(self, cfg: SwiftConfig, now: float) -> None:
        self.cfg = cfg
        self.window = float(cfg.bdp_bytes)
        self.cut_until = 0.0
        self.cuts = 0

    @property
    def target_s(self) -> float:
        return self.cfg.base_rtt_s * self.cfg.target_factor

    @property
    def rate(self) -> float:
        """The line rate, or a window below a packet spread over a round trip."""
        if self.window >= self.cfg.mss:
            return self.cfg.line_rate_bps
        return self.window * 8 / self.target_s

    def on_ack(self, ack_psn: int, next_psn: int, hops: tuple[Hop, ...], rtt_s: float,
               now: float, acked_bytes: int = 0) -> None:
        cfg = self.cfg
        acked = acked_bytes or cfg.mss
        if rtt_s < self.target_s:
            self.window += cfg.ai * cfg.mss * acked / max(self.window, cfg.mss)
        elif now >= self.cut_until:
            factor = max(1 - cfg.beta * (rtt_s - self.target_s) / rtt_s, 1 - cfg.max_mdf)
            self.window *= factor
            self.cut_until = now + rtt_s
            self.cuts += 1
        self.window = max(cfg.mss / 16, min(self.window, 4.0 * cfg.bdp_bytes))
