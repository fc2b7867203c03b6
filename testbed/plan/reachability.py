"""Pure all-pairs reachability: the probe commands and the reading of their output (fping)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_FPING_LINE = re.compile(r"^(?P<ip>\d+\.\d+\.\d+\.\d+)\s*:\s*xmt/rcv/%loss\s*=\s*"
                         r"(?P<xmt>\d+)/(?P<rcv>\d+)/[^,]*"
                         r"(?:,\s*min/avg/max\s*=\s*(?P<min>[\d.]+)/(?P<avg>[\d.]+)/(?P<max>[\d.]+))?")


@dataclass
class Reachability:
    """Outcome of an all-pairs test: pairs are (source host, destination host)."""

    pairs: int = 0
    ok: int = 0
    sent: int = 0
    received: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    rtt_ms: list[float] = field(default_factory=list)  # the mean RTT of every answering pair

    @property
    def lost(self) -> int:
        return self.sent - self.received

    @property
    def complete(self) -> bool:
        return self.pairs > 0 and self.ok == self.pairs and self.lost == 0

    def to_dict(self) -> dict:
        """The outcome as JSON-ready numbers (RTTs: min, median, max over the pairs, ms)."""
        rtts = sorted(self.rtt_ms)
        return {"pairs": self.pairs, "ok": self.ok, "sent": self.sent,
                "received": self.received, "lost": self.lost, "complete": self.complete,
                "failed": [list(p) for p in self.failed],
                "rtt_ms": {"min": rtts[0], "median": rtts[len(rtts) // 2], "max": rtts[-1]}
                if rtts else None}

    def summary(self) -> str:
        text = f"reachability: {self.ok}/{self.pairs} pairs ({self.lost} of {self.sent} probes lost)"
        if self.rtt_ms:
            rtts = sorted(self.rtt_ms)
            text += (f"; RTT per pair min/median/max {rtts[0]:.2f}/{rtts[len(rtts) // 2]:.2f}/"
                     f"{rtts[-1]:.2f} ms")
        return text


UPCALL_BUDGET = 200_000  # probes/s x switches the userspace datapath absorbed here
MAX_PROBE_PPS = 10_000


def probe_interval_ms(hosts: int, switches: int = 1) -> int:
    """Per-host interval between probes, so that all hosts together stay within budget.

    The first probe of every pair is an upcall at each switch on its path, all handled by one
    vswitchd thread on the userspace datapath; too many at once drop probes that a gentler test
    delivers (k=8 lost 13,160 of 32,512 at 10,000 probes/s, none at 2,000). The aggregate rate
    is therefore scaled down with the number of switches.
    """
    aggregate_pps = min(MAX_PROBE_PPS, UPCALL_BUDGET / max(1, switches))
    return max(1, round(hosts * 1000 / aggregate_pps))


def fping_command(targets: list[str], count: int, interval_ms: int = 1,
                  period_ms: int = 100, timeout_ms: int = 2000) -> list[str]:
    """The fping command one host runs to probe ``targets`` ``count`` times each."""
    return ["fping", "-q", "-c", str(count), "-i", str(interval_ms), "-p", str(period_ms),
            "-t", str(timeout_ms), *targets]


def parse_fping(text: str) -> dict[str, tuple[int, int, float | None]]:
    """Map target IP -> (sent, received, mean RTT in ms or None) from ``fping -q -c`` output."""
    out = {}
    for line in text.splitlines():
        match = _FPING_LINE.match(line.strip())
        if match:
            avg = float(match["avg"]) if match["avg"] else None
            out[match["ip"]] = (int(match["xmt"]), int(match["rcv"]), avg)
    return out


def evaluate(expected: dict[str, dict[str, str]], outputs: dict[str, str]) -> Reachability:
    """Score the probes of every source.

    Args:
        expected: source host -> {destination IP: destination host}.
        outputs: source host -> fping output.

    Returns:
        The outcome; a pair whose line is missing counts as failed.
    """
    result = Reachability()
    for src, targets in sorted(expected.items()):
        seen = parse_fping(outputs.get(src, ""))
        for ip, dst in sorted(targets.items(), key=lambda kv: kv[1]):
            result.pairs += 1
            sent, rcv, avg = seen.get(ip, (0, 0, None))
            result.sent += sent
            result.received += rcv
            if avg is not None:
                result.rtt_ms.append(avg)
            if sent and rcv == sent:
                result.ok += 1
            else:
                result.failed.append((src, dst))
    return result
