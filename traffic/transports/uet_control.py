"""The Ultra-Ethernet-like sender's settings and controls (pure, sans-I/O): its constants at
the emulated scale, REPS (recycled entropy path selection: the entropies whose packets came
back unmarked are sent again) and the NSCC-like congestion window; :mod:`traffic.transports.uet`
drives them."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

from traffic.transports.packet import (
    Scale,
)


@dataclass(frozen=True)
class UetConfig:
    """A queue pair's settings (see the module docstring)."""

    mss: int
    line_rate_bps: float
    base_rtt_s: float
    rto_s: float
    spray: bool = True
    ordered: bool = False
    entropies: int = 128
    reorder_threshold: int = 8
    target_factor: float = 2.5  # the delay target: base RTT x this
    md: float = 0.3
    max_bdps: float = 4.0  # the window's ceiling, in bandwidth-delay products
    init_bdps: float = 1.0
    ack_every: int = 4  # an ACK covers up to this many packets (echoing up to MAX_ECHO entropies)
    ack_delay_s: float = 0.001
    path_slack: float = 1.0  # a path is slow past the flow's least RTT + this x base RTT (0: off)

    @classmethod
    def scaled(cls, scale: Scale, **kw) -> UetConfig:
        kw.setdefault("rto_s", scale.rto_s)
        kw.setdefault("ack_delay_s", max(0.001, scale.base_rtt_s / 2))
        return cls(scale.mss, scale.rate_bps, scale.base_rtt_s, **kw)

    @property
    def bdp_bytes(self) -> int:
        return max(self.mss, int(self.line_rate_bps / 8 * self.base_rtt_s))

    def describe(self) -> str:
        """The constants at the emulated scale, for the run's output."""
        slack = (f" or an RTT {self.path_slack:g} base RTT "
                 f"({self.path_slack * self.base_rtt_s * 1e3:.0f} ms) over the flow's least"
                 if self.path_slack > 0 else "")
        paths = f"sprayed over {self.entropies} entropies" if self.spray else "one path"
        return (f"UET {paths}{', ordered (ROD)' if self.ordered else ''}; window from {self.init_bdps:g} "
                f"BDP ({self.bdp_bytes / 1024:.0f} KiB) up to {self.max_bdps:g} BDP, cut by "
                f"{self.md:g} when CE and delay > {self.target_factor:g} base RTTs "
                f"({self.base_rtt_s * self.target_factor * 1e3:.0f} ms); entropies not reused "
                f"after CE{slack}; ACK per {self.ack_every} "
                f"packets or {self.ack_delay_s * 1e3:.0f} ms; loss after {self.reorder_threshold} "
                f"later packets and a reordering window; RTO at least {self.rto_s:.2f} s")


class Reps:
    """Recycled entropies: a flow first explores (its first ``entropies`` packets each take a
    random entropy), then reuses those acknowledged without CE, oldest first (a rotation over
    every good path); with none in hand it explores again. An entropy whose ACK carried CE is
    not reused."""

    def __init__(self, entropies: int, rng: random.Random) -> None:
        self.entropies = entropies
        self.rng = rng
        self.good: deque[int] = deque(maxlen=entropies)
        self.reused = self.explored = 0

    def choose(self) -> int:
        if self.good and self.explored >= self.entropies:
            self.reused += 1
            return self.good.popleft()
        self.explored += 1
        return self.rng.randrange(self.entropies)

    def feedback(self, entropy: int, ce: bool) -> None:
        if not ce:
            self.good.append(entropy)


class Window:
    """The NSCC-like congestion window of one queue pair."""

    def __init__(self, cfg: UetConfig) -> None:
        self.cfg = cfg
        self.cwnd = max(cfg.mss, int(cfg.init_bdps * cfg.bdp_bytes))
        self.cut_until = 0.0
        self.cuts = 0

    @property
    def ceiling(self) -> int:
        return max(self.cfg.mss, int(self.cfg.max_bdps * self.cfg.bdp_bytes))

    def on_ack(self, acked_bytes: int, rtt_s: float, ce: bool, now: float) -> None:
        cfg = self.cfg
        high = rtt_s > cfg.base_rtt_s * cfg.target_factor
        if ce and high:
            if now >= self.cut_until:  # once per RTT
                self.cwnd = max(cfg.mss, int(self.cwnd * (1 - cfg.md)))
                self.cut_until = now + rtt_s
                self.cuts += 1
        elif not ce:  # no congestion signal from the switches: grow
            if not high:  # under the delay target: a packet per packet acknowledged
                self.cwnd += acked_bytes
            else:  # a delay without CE: queues that mark nothing (a slow host): gently
                self.cwnd += max(1, cfg.mss * acked_bytes // self.cwnd)
        self.cwnd = min(self.cwnd, self.ceiling)

    def on_trim(self, rtt_s: float, now: float) -> None:
        """A packet of ours was trimmed: a full queue on its path, as clear a signal as CE
        with a high delay (the same cut, once per RTT)."""
        if now >= self.cut_until:
            self.cwnd = max(self.cfg.mss, int(self.cwnd * (1 - self.cfg.md)))
            self.cut_until = now + rtt_s
            self.cuts += 1

    def on_timeout(self) -> None:
        self.cwnd = max(self.cfg.mss, self.cwnd // 2)
        self.cuts += 1
