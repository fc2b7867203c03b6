"""The Ultra-Ethernet-like sender's settings and controls (pure, sans-I/O): its constants at
the emulated scale and the NSCC-like congestion window (the choice of entropy is
:mod:`traffic.transports.entropy`); :mod:`traffic.transports.uet` drives them."""

from __future__ import annotations

from dataclasses import dataclass

from traffic.transports.entropy import ENTROPY_CHOICES
from traffic.transports.packet import (
    Scale,
)


#: UET's delivery modes (UEC 1.0, the packet delivery sublayer): reliable unordered (RUD:
#: sprayed, placed in any order), reliable ordered (ROD: one path per flow, accepted in order,
#: go back N), unreliable unordered (UUD: sprayed, never resent; a lost packet is lost).
DELIVERY_MODES = ("rud", "rod", "uud")


@dataclass(frozen=True)
class UetConfig:
    """A queue pair's settings (see the module docstring)."""

    mss: int
    line_rate_bps: float
    base_rtt_s: float
    rto_s: float
    spray: bool = True
    delivery: str = "rud"
    nscc: bool = True  # the sender's window reacts to ECN, delay and loss (False: fixed)
    rccc: bool = False  # the receiver grants credits; new data waits for them
    entropies: int = 128
    entropy: str = "reps"  # the choice of entropy per packet (traffic.transports.entropy)
    reorder_threshold: int = 8
    target_factor: float = 2.5  # the delay target: base RTT x this
    md: float = 0.5  # NSCC's largest multiplicative decrease
    gamma: float = 0.8  # NSCC's decrease per unit of queueing delay over the target
    max_bdps: float = 4.0  # the window's ceiling, in bandwidth-delay products
    init_bdps: float = 1.0
    ack_every: int = 4  # an ACK covers up to this many packets (echoing up to MAX_ECHO entropies)
    ack_delay_s: float = 0.001
    path_slack: float = 1.0  # a path is slow past the flow's least RTT + this x base RTT (0: off)
    rccc_initial_bdps: float = 0.0  # RCCC: credit a queue pair starts with, unasked
    rccc_window_bdps: float = 4.0  # RCCC: a receiver's most credit outstanding (granted, not arrived)

    def __post_init__(self) -> None:
        if self.delivery not in DELIVERY_MODES:
            raise ValueError(f"uet delivery {self.delivery!r}: one of "
                             f"{', '.join(DELIVERY_MODES)}")
        if self.entropy not in ENTROPY_CHOICES:
            raise ValueError(f"uet entropy {self.entropy!r}: one of "
                             f"{', '.join(ENTROPY_CHOICES)}")

    @classmethod
    def scaled(cls, scale: Scale, **kw) -> UetConfig:
        kw.setdefault("rto_s", scale.rto_s)
        kw.setdefault("ack_delay_s", max(0.001, scale.base_rtt_s / 2))
        return cls(scale.mss, scale.rate_bps, scale.base_rtt_s, **kw)

    @property
    def ordered(self) -> bool:
        """ROD: one path, in order."""
        return self.delivery == "rod"

    @property
    def reliable(self) -> bool:
        return self.delivery != "uud"

    @property
    def bdp_bytes(self) -> int:
        return max(self.mss, int(self.line_rate_bps / 8 * self.base_rtt_s))

    @property
    def rccc_initial_bytes(self) -> int:
        """Unasked credit (0: the first packet waits for a grant)."""
        return int(self.rccc_initial_bdps * self.bdp_bytes)

    @property
    def rccc_window_bytes(self) -> int:
        return max(4 * self.mss, int(self.rccc_window_bdps * self.bdp_bytes))

    def describe(self) -> str:
        """The constants at the emulated scale, for the run's output."""
        slack = (f" or an RTT {self.path_slack:g} base RTT "
                 f"({self.path_slack * self.base_rtt_s * 1e3:.0f} ms) over the flow's least"
                 if self.path_slack > 0 else "")
        paths = (f"sprayed over {self.entropies} entropies ({self.entropy})"
                 if self.spray and not self.ordered else "one path")
        if self.nscc:
            window = (f"NSCC window from {self.init_bdps:g} BDP ({self.bdp_bytes / 1024:.0f} "
                      f"KiB) up to {self.max_bdps:g} BDP, delay target {self.target_factor:g} "
                      f"base RTTs ({self.base_rtt_s * self.target_factor * 1e3:.0f} ms), cut "
                      f"(at most by {self.md:g}) when CE and delay agree; an entropy is congested "
                      f"after CE{slack}")
        else:
            window = f"fixed window of {self.max_bdps:g} BDP ({self.bdp_bytes / 1024:.0f} KiB)"
        credit = (f"; receiver credits (RCCC): {self.rccc_initial_bytes / 1024:.0f} KiB "
                  f"unasked, up to {self.rccc_window_bytes / 1024:.0f} KiB outstanding per "
                  "receiver, granted at its line rate" if self.rccc else "")
        loss = ("no retransmission (UUD)" if not self.reliable else
                f"loss after {self.reorder_threshold} later packets and a reordering window; "
                f"RTO at least {self.rto_s:.2f} s")
        return (f"UET {self.delivery.upper()} {paths}; {window}{credit}; ACK per "
                f"{self.ack_every} packets or {self.ack_delay_s * 1e3:.0f} ms; {loss}")


class Nscc:
    """The NSCC congestion window of one queue pair (UEC 1.0; the law of UEC's htsim model),
    in RTT terms: the queueing delay is the RTT less the base RTT, its target is
    ``(target_factor - 1)`` base RTTs. On each ACK, by what it says:

    ============  ==========================  =============================================
    CE            delay under the target      delay over the target
    ============  ==========================  =============================================
    no            proportional increase:      fair increase: a packet per window
                  the bytes acknowledged,
                  scaled by how far under
    yes           none (another path is       multiplicative decrease, once per RTT, by
                  congested: the entropy is   ``gamma`` x (delay - target) / delay of the
                  not reused, see Reps)       smoothed delay, at most ``md``
    ============  ==========================  =============================================

    Quick adapt: a trimmed or lost packet, or a delay over four targets, sets the window to
    what was acknowledged over the last base RTT plus target (if that is less), at most once
    per such period.
    """

    def __init__(self, cfg: UetConfig) -> None:
        self.cfg = cfg
        self.cwnd = max(cfg.mss, int(cfg.init_bdps * cfg.bdp_bytes))
        self.target_q = cfg.base_rtt_s * (cfg.target_factor - 1)
        self.avg_q = 0.0  # the smoothed queueing delay
        self.cut_until = 0.0
        self.cuts = 0
        self.quick_adapts = 0
        self.period = cfg.base_rtt_s + self.target_q
        self.period_end: float | None = None  # quick adapt's period (None: not started)
        self.achieved = 0  # bytes acknowledged in the current period
        self.qa_pending = False

    @property
    def ceiling(self) -> int:
        return max(self.cfg.mss, int(self.cfg.max_bdps * self.cfg.bdp_bytes))

    def on_ack(self, acked_bytes: int, rtt_s: float, ce: bool, now: float) -> None:
        cfg = self.cfg
        q = max(0.0, rtt_s - cfg.base_rtt_s)
        self.avg_q += 0.125 * (q - self.avg_q)
        self.achieved += acked_bytes
        if q > 4 * self.target_q:
            self.qa_pending = True
        if self._quick_adapt(now):
            return
        if not ce and q < self.target_q:  # proportional increase
            self.cwnd += round(acked_bytes * (self.target_q - q) / self.target_q) if \
                self.target_q > 0 else acked_bytes
        elif not ce:  # fair increase
            self.cwnd += max(1, cfg.mss * acked_bytes // self.cwnd)
        elif q >= self.target_q and now >= self.cut_until:  # multiplicative decrease
            avg = max(self.avg_q, q)
            factor = max(1 - cfg.gamma * (avg - self.target_q) / avg, 1 - cfg.md)
            self.cwnd = max(cfg.mss, int(self.cwnd * factor))
            self.cut_until = now + rtt_s
            self.cuts += 1
        self.cwnd = min(self.cwnd, self.ceiling)

    def _quick_adapt(self, now: float) -> bool:
        """At a period's end: a pending trigger sets the window to the bytes the period
        achieved, when that is less."""
        if self.period_end is None:
            self.period_end = now + self.period
            return False
        if now < self.period_end:
            return False
        done = False
        if self.qa_pending and self.achieved < self.cwnd:
            self.cwnd = max(self.cfg.mss, self.achieved)
            self.quick_adapts += 1
            self.cuts += 1
            done = True
        self.qa_pending = False
        self.achieved = 0
        self.period_end = now + self.period
        return done

    def on_trim(self, rtt_s: float, now: float) -> None:
        """A packet of ours was trimmed (or is lost): a full queue on its path. Quick adapt at
        the period's end."""
        self.qa_pending = True
        self._quick_adapt(now)

    def on_timeout(self) -> None:
        self.cwnd = max(self.cfg.mss, self.cwnd // 2)
        self.cuts += 1


class FixedWindow:
    """``nscc: false``: the window stays at its ceiling whatever the network says (the
    receiver's credits, if on, are then the only control)."""

    def __init__(self, cfg: UetConfig) -> None:
        self.cwnd = max(cfg.mss, int(cfg.max_bdps * cfg.bdp_bytes))
        self.cuts = self.quick_adapts = 0

    def on_ack(self, acked_bytes: int, rtt_s: float, ce: bool, now: float) -> None:
        pass

    def on_trim(self, rtt_s: float, now: float) -> None:
        pass

    def on_timeout(self) -> None:
        pass


def window_for(cfg: UetConfig) -> Nscc | FixedWindow:
    return Nscc(cfg) if cfg.nscc else FixedWindow(cfg)
