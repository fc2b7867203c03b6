"""Real-equivalent units (pure): what an emulated run's figures mean on the fabric it stands for.

This machine emulates links of a few Mbit/s; the fabrics people buy run 400-800 Gbit/s. An
experiment that states the real link rate (``scale: {real_rate_gbps: 400}``, optionally the
real fabric's base RTT, ``real_rtt_us``, 10 us by default as in the DCQCN paper) gets
real-equivalent figures next to the emulated ones, under one rule: keep the bandwidth-delay
regime. With ``R/r`` the rate ratio and ``T/t`` the RTT ratio (real over emulated):

* bandwidths scale by ``R/r`` (busbw, algbw);
* times scale by ``T/t`` (durations, flow completions): everything that is a number of RTTs
  or of serialization times stays the same number;
* sizes scale by ``(R x T) / (r x t)``, the bandwidth-delay product ratio: an emulated 4 MiB
  message that spans 75 emulated RTTs stands for the real message that spans 75 real ones.

What does not scale: the emulated RTT is mostly serialization of jumbo frames at a few Mbit/s,
the real one mostly switch and NIC latency; queue sizes and ECN thresholds are set in bytes
for the emulated rate (ratios to the BDP carry over, absolute bytes do not); the host stack's
and the agents' CPU costs per packet, which at real rates are a NIC's job; and packet counts
(a real message is many more, smaller-in-time packets).
"""

from __future__ import annotations

from dataclasses import dataclass

from traffic.measure.rows import CollectiveRow

DEFAULT_REAL_RTT_US = 10.0

WHAT_SCALES = ("bandwidths (busbw, algbw) by the rate ratio; durations and flow completion "
               "times by the RTT ratio; message sizes by the bandwidth-delay product ratio")
WHAT_DOES_NOT = ("propagation and switch latency (the emulated RTT is mostly serialization of "
                 "jumbo frames), absolute queue and ECN threshold bytes, host stack and agent "
                 "CPU per packet, packet counts")

# with emulator.time_scale the fabric is built to scale (fabriclab.model.timescale)
TIME_SCALED = ("rates divided by N and times multiplied by N when built (latencies, gaps, "
               "timers), so results' times divide by N and bandwidths multiply by N; sizes, "
               "packets per bandwidth-delay product and queues in bytes are the real fabric's")
TIME_SCALED_NOT = ("the host stack's and the agents' CPU per packet and their timing (judged by "
                   "the fidelity verdict), kernel TCP's own timers (minimum RTO, delayed ACKs)")


@dataclass(frozen=True)
class RealScale:
    """The ratios between the real fabric and the emulated one."""

    real_rate_gbps: float
    emulated_rate_mbps: float
    emulated_rtt_s: float
    real_rtt_us: float = DEFAULT_REAL_RTT_US
    time_scaled: bool = False  # emulator.time_scale: built to scale, not relabelled

    @property
    def rate_ratio(self) -> float:
        return self.real_rate_gbps * 1e3 / self.emulated_rate_mbps

    @property
    def time_ratio(self) -> float:
        return self.real_rtt_us * 1e-6 / self.emulated_rtt_s

    @property
    def size_ratio(self) -> float:
        return self.rate_ratio * self.time_ratio

    def factors(self) -> dict:
        """For ``results.json``: the rates, RTTs, ratios and what scales."""
        return {"real_rate_gbps": self.real_rate_gbps, "real_rtt_us": self.real_rtt_us,
                "emulated_rate_mbps": self.emulated_rate_mbps,
                "emulated_rtt_ms": round(self.emulated_rtt_s * 1e3, 3),
                "rate_ratio": self.rate_ratio, "time_ratio": self.time_ratio,
                "size_ratio": self.size_ratio,
                "scales": TIME_SCALED if self.time_scaled else WHAT_SCALES,
                "does_not_scale": TIME_SCALED_NOT if self.time_scaled else WHAT_DOES_NOT}

    def collective(self, row: CollectiveRow) -> dict:
        """A results row's real-equivalent figures."""
        return {"bytes": round(row.bytes * self.size_ratio),
                "time_us": row.time_us * self.time_ratio,
                "algbw_GBps": row.algbw_GBps * self.rate_ratio,
                "busbw_GBps": row.busbw_GBps * self.rate_ratio,
                **{name: {q: v * self.time_ratio for q, v in figure.to_json().items()
                          if v is not None}
                   for name, figure in (("flow_end_s", row.flow_end_s), ("fct_s", row.fct_s))}}

    def describe(self) -> str:
        """One line for the run's output."""
        return (f"real-equivalent: {self.real_rate_gbps:g} Gbit/s links, {self.real_rtt_us:g} us "
                f"base RTT (emulated {self.emulated_rate_mbps:g} Mbit/s, "
                f"{self.emulated_rtt_s * 1e3:.1f} ms): bandwidth x{self.rate_ratio:,.0f}, time "
                f"x{self.time_ratio:.2e}, size x{self.size_ratio:.3g}")
