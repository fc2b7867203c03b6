"""RoCEv2-like reliable connection: go-back-N over UDP with DCQCN rate control.

Sender (one per queue pair): packets carry consecutive PSNs; every ACK is cumulative; a NAK says
"resend from PSN e" and the sender goes back to e, resending everything after it; a retransmission
timeout goes back to the oldest unacknowledged PSN. The sender is paced at DCQCN's current rate and
keeps at most ``max_outstanding`` packets unacknowledged (a NIC's limit per queue pair).

Receiver: accepts only the expected PSN; an out-of-order packet is dropped and answered by one
NAK per gap; a duplicate is re-acknowledged; ACKs are coalesced (every ``ack_every`` packets, at
a message's last packet, or after ``ack_delay_s``); a CE mark becomes a CNP, at most one per
``cnp_interval_s`` per queue pair (the notification point).

DCQCN (Zhu et al., SIGCOMM 2015), the reaction point: on a CNP the target rate takes the current
rate, the current rate is cut by ``alpha / 2`` and ``alpha`` grows towards 1 by ``g``; without
CNPs ``alpha`` decays every ``alpha_period_s``; the rate recovers by stages counted by a timer
(``rate_period_s``) and by a byte counter (``byte_counter``): ``F`` stages of fast recovery
(halfway to the target), then additive increase of the target by ``rate_ai``, then hyper increase
by ``rate_hai`` once both counters are past ``F``. Every increase event moves the rate halfway
to the target.

Two profiles (``DcqcnConfig.scaled(scale, profile)``):

- ``paper``: the SIGCOMM'15 constants (40 Gbit/s: g 1/256, timers 55 us, byte counter 10 MB,
  F 5, AI 40 Mbit/s, HAI 400 Mbit/s); every CNP cuts the rate and clamps the target to it.
- ``connectx``: what NVIDIA ConnectX NICs ship (``/sys/class/net/*/ecn/roce_rp``, at 100 Gbit/s):
  rate increase timer 300 us, byte counter 32 KiB, F 1, AI 5 Mbit/s, HAI 50 Mbit/s, at most
  one cut per ``rate_reduce_monitor_period`` (4 us), and ``clamp_tgt_rate`` off: a CNP lowers
  the target only when a timer stage has passed since the previous cut
  (``clamp_tgt_rate_after_time_inc``), so back-to-back cuts recover to the old target quickly.

``off`` sends at the line rate and ignores CNPs: RoCE as large AI fabrics run it when the
collective library's own scheduling keeps the queues short and DCQCN is switched off (Meta,
"RDMA over Ethernet for Distributed AI Training at Meta Scale", SIGCOMM 2024). It separates what
the paths cost (ECMP collisions, go-back-N) from what the rate control costs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from traffic.transports.packet import (INT_SIZE, Flag, Kind, Packet, Scale, next_send,
                                       packetize, wire_bytes)
from traffic.transports.rate_control import Hpcc, HpccConfig, Swift, SwiftConfig

INF = float("inf")
#: ConnectX NICs send CNPs in DSCP 48 (priority 6), which switches serve from a strict-priority
#: queue; the fabric does so when ``traffic_classes`` maps it to a ``strict`` priority.
CNP_DSCP = 48


@dataclass(frozen=True)
class DcqcnConfig:
    """DCQCN's constants; :meth:`scaled` brings the published ones to the emulated fabric."""

    line_rate_bps: float
    g: float = 1 / 256
    alpha_period_s: float = 55e-6
    rate_period_s: float = 55e-6
    byte_counter: int = 10 * 1024 * 1024
    fast_recovery_stages: int = 5
    rate_ai_bps: float = 40e6
    rate_hai_bps: float = 400e6
    min_rate_bps: float = 0.0
    clamp_target: bool = True  # every cut clamps the target (False: only after a timer stage)
    cut_interval_s: float = 0.0  # at most one cut per interval (ConnectX's monitor period)
    cnp_interval_s: float = 50e-6  # the notification point's, per queue pair
    profile: str = "paper"

    PROFILES = ("paper", "connectx", "off")

    @classmethod
    def published(cls, profile: str = "paper") -> tuple[DcqcnConfig, float]:
        """A profile's constants as published, and the link rate they were set for."""
        if profile == "paper":
            return cls(40e9), 40e9
        if profile == "connectx":
            return cls(100e9, g=1 / 256, alpha_period_s=1e-6, rate_period_s=300e-6,
                       byte_counter=32767, fast_recovery_stages=1, rate_ai_bps=5e6,
                       rate_hai_bps=50e6, clamp_target=False, cut_interval_s=4e-6,
                       cnp_interval_s=4e-6, profile="connectx"), 100e9
        raise ValueError(f"dcqcn: no published constants for profile {profile!r} (one of "
                         f"{', '.join(cls.PROFILES[:-1])})")

    @classmethod
    def scaled(cls, scale: Scale, profile: str = "paper") -> DcqcnConfig:
        """A profile's constants (tens of Gbit/s, microseconds of RTT) at the emulated rate and
        RTT: times by the RTT ratio, the byte counter by the bandwidth-delay product ratio,
        rate steps as the same share of the link."""
        base, ref_bps = cls.published(profile)
        share = scale.rate_bps / ref_bps
        return cls(scale.rate_bps, base.g, base.alpha_period_s * scale.time,
                   base.rate_period_s * scale.time,
                   scale.bytes_(base.byte_counter, ref_bps), base.fast_recovery_stages,
                   base.rate_ai_bps * share, base.rate_hai_bps * share, scale.rate_bps / 1000,
                   base.clamp_target, base.cut_interval_s * scale.time,
                   base.cnp_interval_s * scale.time, profile)

    def describe(self) -> str:
        return (f"DCQCN ({self.profile}) g={self.g:g} alpha period "
                f"{self.alpha_period_s * 1e3:.1f} ms, rate period "
                f"{self.rate_period_s * 1e3:.1f} ms, byte counter "
                f"{self.byte_counter / 1024:.1f} KiB, F={self.fast_recovery_stages}, AI "
                f"{self.rate_ai_bps / 1e3:.1f} kbit/s, HAI {self.rate_hai_bps / 1e3:.1f} kbit/s, "
                f"CNP interval {self.cnp_interval_s * 1e3:.1f} ms, "
                + ("target clamped at every cut" if self.clamp_target else
                   f"target clamped after a timer stage, a cut at most every "
                   f"{self.cut_interval_s * 1e3:.1f} ms"))


class Dcqcn:
    """The reaction point of one queue pair."""

    def __init__(self, cfg: DcqcnConfig, now: float) -> None:
        self.cfg = cfg
        self.rate = self.target = cfg.line_rate_bps
        self.alpha = 1.0
        self.timer_stage = self.byte_stage = 0
        self.bytes_since = 0
        self.alpha_due = now + cfg.alpha_period_s
        self.rate_due = now + cfg.rate_period_s
        self.cuts = 0
        self.last_cut = -INF

    def on_cnp(self, now: float) -> None:
        cfg = self.cfg
        if now < self.last_cut + cfg.cut_interval_s:
            return  # within the monitor period of the previous cut
        self.last_cut = now
        if cfg.clamp_target or self.timer_stage > 0:
            self.target = self.rate
        self.rate = max(cfg.min_rate_bps, self.rate * (1 - self.alpha / 2))
        self.alpha = (1 - cfg.g) * self.alpha + cfg.g
        self.timer_stage = self.byte_stage = 0
        self.bytes_since = 0
        self.alpha_due = now + cfg.alpha_period_s
        self.rate_due = now + cfg.rate_period_s
        self.cuts += 1

    def on_sent(self, nbytes: int) -> None:
        self.bytes_since += nbytes
        if self.bytes_since >= self.cfg.byte_counter:
            self.bytes_since = 0
            self.byte_stage += 1
            self._increase()

    def timer(self) -> float:
        return min(self.alpha_due, self.rate_due)

    def on_timer(self, now: float) -> None:
        cfg = self.cfg
        if now >= self.alpha_due:
            self.alpha *= 1 - cfg.g
            self.alpha_due = now + cfg.alpha_period_s
        if now >= self.rate_due:
            self.timer_stage += 1
            self.rate_due = now + cfg.rate_period_s
            self._increase()

    def _increase(self) -> None:
        cfg = self.cfg
        f = cfg.fast_recovery_stages
        if max(self.timer_stage, self.byte_stage) < f:
            pass  # fast recovery: towards the target only
        elif min(self.timer_stage, self.byte_stage) >= f:
            self.target += (min(self.timer_stage, self.byte_stage) - f + 1) * cfg.rate_hai_bps
        else:
            self.target += cfg.rate_ai_bps
        self.target = min(self.target, cfg.line_rate_bps)
        self.rate = min(cfg.line_rate_bps, (self.rate + self.target) / 2)


@dataclass(frozen=True)
class RoceConfig:
    """A queue pair's settings."""

    mss: int
    rto_s: float
    max_outstanding: int = 64  # packets
    ack_every: int = 4
    ack_delay_s: float = 0.002
    cnp_interval_s: float = 50e-6  # the notification point's, per queue pair
    cnp_dscp: int = CNP_DSCP  # CNPs leave in their own class, as NICs send them
    dcqcn: DcqcnConfig | None = None  # None: line rate, no congestion control
    spray: bool = False  # a fresh entropy per packet (to show go-back-N's collapse)
    entropies: int = 256
    line_rate_bps: float = INF  # the pace without DCQCN
    hpcc: HpccConfig | None = None  # instead of DCQCN: HPCC (INT on every DATA packet)
    swift: SwiftConfig | None = None  # instead of DCQCN: Swift (delay)

    @property
    def congestion_control(self) -> str:
        return ("hpcc" if self.hpcc else "swift" if self.swift else "dcqcn" if self.dcqcn
                else "off")

    def describe(self) -> str:
        """The constants at the emulated scale, for the run's output."""
        paths = f" sprayed over {self.entropies} entropies" if self.spray else ""
        return (f"RoCEv2 go-back-N{paths}, up to {self.max_outstanding} packets outstanding, ACK per {self.ack_every} "
                f"packets or {self.ack_delay_s * 1e3:.0f} ms, RTO {self.rto_s:.2f} s, CNPs in "
                f"DSCP {self.cnp_dscp}; "
                + (self.dcqcn.describe() if self.dcqcn else self.hpcc.describe() if self.hpcc
                   else self.swift.describe() if self.swift else "no rate control"))

    @classmethod
    def scaled(cls, scale: Scale, profile: str = "paper", cc: str = "dcqcn",
               **kw) -> RoceConfig:
        """Timers at the emulated RTT: the RTO of :attr:`Scale.rto_s`, DCQCN's ``profile``
        (with its CNP interval; ``off``: none, paced at the line rate), outstanding packets up to
        4 bandwidth-delay products."""
        outstanding = max(8, 4 * scale.bdp_bytes // scale.mss)
        if profile not in DcqcnConfig.PROFILES:
            raise ValueError(f"dcqcn: unknown profile {profile!r} (one of "
                             f"{', '.join(DcqcnConfig.PROFILES)})")
        if cc == "hpcc":
            kw.update(dcqcn=None, hpcc=HpccConfig(scale.rate_bps, scale.base_rtt_s, scale.mss))
        elif cc == "swift":
            kw.update(dcqcn=None, swift=SwiftConfig(scale.rate_bps, scale.base_rtt_s,
                                                    scale.mss))
        elif cc != "dcqcn":
            raise ValueError(f"rocev2: unknown congestion control {cc!r}")
        kw.setdefault("dcqcn", None if profile == "off" else DcqcnConfig.scaled(scale, profile))
        return cls(scale.mss, scale.rto_s, outstanding,
                   cnp_interval_s=(kw["dcqcn"].cnp_interval_s if kw["dcqcn"]
                                   else 50e-6 * scale.time), ack_delay_s=max(0.001, scale.base_rtt_s / 4),
                   line_rate_bps=scale.rate_bps, **kw)


@dataclass
class RoceSender:
    """The requester side of a queue pair."""

    qp: tuple[int, int]
    cfg: RoceConfig
    now: float
    entropy: int = 0
    rng: random.Random = field(default_factory=lambda: random.Random(1))

    def __post_init__(self) -> None:
        self.lengths: list[int] = []  # payload bytes of each PSN
        self.last_of_message: set[int] = set()
        self.una = 0  # oldest unacknowledged PSN
        self.nxt = 0  # next PSN to send
        self.high = 0  # PSNs below were sent at least once
        # the pace: the previous packet's scheduled time and size; the gap after it is taken
        # at the rate of the moment (a rate that rises ends a long gap early: HPCC and Swift
        # windows of a fraction of a packet make gaps of many round trips)
        self.pace_from = self.now
        self.pace_bits = 0
        self.progress_at = self.now
        cfg = self.cfg
        self.cc: Dcqcn | Hpcc | Swift | None = (
            Dcqcn(cfg.dcqcn, self.now) if cfg.dcqcn else Hpcc(cfg.hpcc, self.now) if cfg.hpcc
            else Swift(cfg.swift, self.now) if cfg.swift else None)
        self.window_cc = isinstance(self.cc, (Hpcc, Swift))  # a window besides the pace
        self.stats = {"packets": 0, "bytes": 0, "retransmitted": 0, "retransmitted_bytes": 0,
                      "naks": 0, "cnps": 0, "timeouts": 0, "entropies": set()}

    # -- the application's side ------------------------------------------------------------
    def offer(self, nbytes: int) -> int:
        """Queue a message; returns the PSN its last packet ends before (done when acked)."""
        return packetize(self.lengths, self.last_of_message, nbytes, self.cfg.mss)

    @property
    def acked(self) -> int:
        """Every PSN below is acknowledged."""
        return self.una

    @property
    def rate_bps(self) -> float:
        return self.cc.rate if self.cc else self.cfg.line_rate_bps

    # -- sending ---------------------------------------------------------------------------
    def next_send_time(self) -> float | None:
        """When the next packet may leave (None: nothing to send, or the window is full)."""
        if self.nxt >= len(self.lengths) or self.nxt - self.una >= self.cfg.max_outstanding:
            return None
        if self.window_cc and self.nxt > self.una and \
                (self.nxt - self.una + 1) * self.cfg.mss > self.cc.window:
            return None
        return self.next_send

    @property
    def next_send(self) -> float:
        rate = self.rate_bps
        return self.pace_from + (self.pace_bits / rate if rate < INF else 0.0)

    def poll(self, now: float) -> Packet | None:
        """The packet to send now, if one may leave."""
        due = self.next_send_time()
        if due is None or due > now:
            return None
        psn = self.nxt
        if self.una == psn:  # nothing in flight: the timeout runs from this packet, not from
            self.progress_at = now  # the last acknowledgement (maybe a collective ago)
        length = self.lengths[psn]
        flags = (Flag.RETX if psn < self.high else 0) | (
            Flag.LAST if psn in self.last_of_message else 0)
        if self.cfg.hpcc and length >= INT_SIZE:
            flags |= Flag.INT  # the switches stamp it; the ACK brings it back
        entropy = self.rng.randrange(self.cfg.entropies) if self.cfg.spray else self.entropy
        self.nxt += 1
        self.high = max(self.high, self.nxt)
        wire = wire_bytes(length)
        self.pace_from = next_send(now, self.next_send, 0.0)
        self.pace_bits = wire * 8
        if self.cc:
            self.cc.on_sent(wire)
        st = self.stats
        st["packets"] += 1
        st["bytes"] += length
        st["retransmitted"] += 1 if flags & Flag.RETX else 0
        st["retransmitted_bytes"] += length if flags & Flag.RETX else 0
        st["entropies"].add(entropy)
        return Packet(Kind.DATA, self.qp, psn, 0, length, entropy, flags=flags,
                      sent_ns=int(now * 1e9))

    # -- feedback --------------------------------------------------------------------------
    def on_packet(self, pkt: Packet, now: float) -> None:
        if pkt.kind == Kind.ACK:
            if pkt.ack > self.una:
                self.una = min(pkt.ack, self.high)
                self.progress_at = now
                self.nxt = max(self.nxt, self.una)
            if self.window_cc and pkt.sent_ns:
                self.cc.on_ack(pkt.ack, self.nxt, pkt.hops, now - pkt.sent_ns / 1e9, now)
        elif pkt.kind == Kind.NAK:
            self.stats["naks"] += 1
            if pkt.ack > self.una:
                self.una = pkt.ack
                self.progress_at = now
            if self.nxt > pkt.ack >= self.una:  # go back N
                self.nxt = pkt.ack
        elif pkt.kind == Kind.CNP:
            self.stats["cnps"] += 1
            if self.cc:
                self.cc.on_cnp(now)

    def timer(self) -> float | None:
        times = [self.cc.timer()] if self.cc else []
        if self.una < self.nxt:
            times.append(self.progress_at + self.cfg.rto_s)
        return min(times) if times else None

    def on_timer(self, now: float) -> None:
        if self.cc:
            self.cc.on_timer(now)
        if self.una < self.nxt and now >= self.progress_at + self.cfg.rto_s:
            self.stats["timeouts"] += 1
            self.nxt = self.una  # resend everything unacknowledged
            self.progress_at = now

    def describe(self) -> str:
        """Where an unfinished queue pair stands (for a stuck job's report)."""
        return (f"{self.una}/{len(self.lengths)} packets acknowledged, next {self.nxt}, rate "
                f"{self.rate_bps / 1e6:.3f} Mbit/s, {self.stats['timeouts']} timeouts")

    def summary(self) -> dict:
        out = {k: v for k, v in self.stats.items() if k != "entropies"}
        out["entropies"] = len(self.stats["entropies"])
        out["rate_cuts"] = self.cc.cuts if self.cc else 0
        if self.window_cc:
            out["cwnd_bytes"] = int(self.cc.window)
        return out


@dataclass
class RoceReceiver:
    """The responder side of a queue pair."""

    qp: tuple[int, int]
    cfg: RoceConfig

    def __post_init__(self) -> None:
        self.expected = 0
        self.delivered = 0  # payload bytes accepted, in order
        self.unacked = 0
        self.ack_due: float | None = None
        self.nak_for = -1
        self.last_cnp = -INF
        self.latest: Packet | None = None  # the latest DATA accepted: its ACK echoes its send
        # time (Swift's delay) and INT (HPCC)
        self.stats = {"packets": 0, "out_of_order": 0, "duplicates": 0, "naks": 0, "cnps": 0,
                      "ce": 0, "trimmed": 0}

    def on_packet(self, pkt: Packet, now: float) -> list[Packet]:
        """A DATA packet arrived; returns the ACK, NAK or CNP to send back."""
        st = self.stats
        st["packets"] += 1
        out = []
        if pkt.trimmed:  # RoCE knows nothing of trimming: a packet cut short is a bad one,
            st["trimmed"] += 1  # discarded (go back N recovers it, as a loss)
            return out
        if pkt.ce:
            st["ce"] += 1
            if now - self.last_cnp >= self.cfg.cnp_interval_s:
                self.last_cnp = now
                st["cnps"] += 1
                out.append(Packet(Kind.CNP, self.qp, ack=self.expected))
        if pkt.psn <= self.expected:
            self.latest = pkt
        if pkt.psn == self.expected:
            self.expected += 1
            self.delivered += pkt.length
            self.unacked += 1
            if self.unacked >= self.cfg.ack_every or pkt.flags & Flag.LAST:
                out.append(self._ack())
            elif self.ack_due is None:
                self.ack_due = now + self.cfg.ack_delay_s
        elif pkt.psn > self.expected:
            st["out_of_order"] += 1
            if self.nak_for != self.expected:  # one NAK per gap
                self.nak_for = self.expected
                st["naks"] += 1
                out.append(Packet(Kind.NAK, self.qp, ack=self.expected))
        else:
            st["duplicates"] += 1
            out.append(self._ack())
        return out

    def _ack(self) -> Packet:
        self.unacked = 0
        self.ack_due = None
        last = self.latest
        if last is None:
            return Packet(Kind.ACK, self.qp, ack=self.expected)
        if last.flags & Flag.INT:  # the switches' stamps go back in the ACK's payload
            return Packet(Kind.ACK, self.qp, psn=last.psn, ack=self.expected,
                          length=INT_SIZE, sent_ns=last.sent_ns, flags=Flag.INT,
                          hops=last.hops)
        return Packet(Kind.ACK, self.qp, psn=last.psn, ack=self.expected,
                      sent_ns=last.sent_ns)

    def timer(self) -> float | None:
        return self.ack_due

    def on_timer(self, now: float) -> list[Packet]:
        if self.ack_due is not None and now >= self.ack_due:
            return [self._ack()]
        return []
