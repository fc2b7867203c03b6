"""Per-transfer records (pure): each transfer's start and end, its flow completion time, the
time it would take alone on the idle fabric, and its slowdown, the figure congestion-control
papers plot by flow size.

A transfer's **FCT** runs from its sender handing the first byte to its connections to its
receiver reading the last (one machine, one clock). Two times stand for it alone:

- the **line-rate FCT** (:func:`line_rate_fct_s`), as ns-3 and htsim studies take it: its
  bytes on the wire (headers included: the goodput share of a full frame) at the rate of its
  path's narrowest link, every other link's store-and-forward of one frame, and every link's
  propagation delay,

      line = wire / r_min + sum_l share_l * frame / r_l - frame / r_min + sum_l share_l * d_l

  where ``share_l`` is the share of its bytes on link ``l`` (1 on a single path; 1/k on each
  of k equal-cost links, so a sum over them is the mean path's; the planes of a multi-plane
  fabric share the bytes) and ``r_min`` the least of ``r_l / share_l``;
- the **ideal FCT** (:func:`ideal_fct_s`), alone on the idle fabric *as emulated*: an emulated
  link is a token bucket (HTB), and an idle one sends its burst at once, and one packet more
  (a class sends while its tokens are not negative: a TCP super-packet of up to 64 KiB), so
  by a time ``t`` link ``l`` has passed at most ``A_l + r_l * t`` of the transfer's
  ``wire * share_l`` bytes (a sender that paces itself at line rate, as the UDP transports'
  agents do, gets only as far ahead as it runs ahead of the wire, and a frame):

      ideal = max(0, max_l (wire * share_l - A_l) / r_l) + sum_l share_l * d_l

  It is a lower bound: **slowdown**, FCT over ideal FCT, is at least 1. A transfer far
  longer than the allowance ``A`` (TCP at 100 Mbit/s with jumbo frames: 74 KiB + 64 KiB,
  11 ms) has the two within ``A / r_min``; one shorter than it crosses an idle emulated
  fabric at the hosts' speed, which the bound leaves out: on links without delay its ideal is
  0 and its slowdown is not given.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from testbed.model.congestion import frame_bytes
from testbed.model.topology import Topology
from testbed.plan.tcplan import GSO_MAX_BYTES, htb_burst_bytes
from traffic.measure import metrics
from traffic.predict.ideal import FluidModel

#: the size bins of the slowdown tables and CDFs: upper bounds in bytes (the last: the rest)
SIZE_BINS = (10 * 1024, 100 * 1024, 1024 * 1024, 10 * 1024 * 1024)
#: a link a transfer crosses: (rate in Mbit/s, share of its bytes, one-way delay in us, the
#: bytes an idle one passes at once: its burst and one packet)
PathLink = tuple[float, float, float, float]


def line_rate_fct_s(nbytes: int, links: Iterable[PathLink], mtu: int,
                    goodput: float) -> float:
    """A transfer of ``nbytes`` (payload) alone on an idle path at line rate (the module's
    ``line``); ``goodput``: payload bytes per byte on the wire for full-size packets."""
    links = [(rate * 1e6 / 8, share, delay) for rate, share, delay, _a in links if share > 0]
    if not links or nbytes <= 0:
        return sum(share * delay for _r, share, delay in links) / 1e6
    wire = nbytes / goodput
    frame = min(float(frame_bytes(mtu)), wire)
    narrowest = min(rate / share for rate, share, _d in links)
    forward = sum(share * frame / rate for rate, share, _d in links) - frame / narrowest
    return wire / narrowest + max(0.0, forward) + sum(s * d for _r, s, d in links) / 1e6


def ideal_fct_s(nbytes: int, links: Iterable[PathLink], goodput: float) -> float:
    """A transfer of ``nbytes`` (payload) alone on the idle emulated path (the module's
    ``ideal``): a lower bound of its FCT there."""
    links = [link for link in links if link[1] > 0]
    wire = max(0, nbytes) / goodput
    serial = max((wire * share - allowance) / (rate * 1e6 / 8)
                 for rate, share, _d, allowance in links) if links else 0.0
    return max(0.0, serial) + sum(share * delay for _r, share, delay, _a in links) / 1e6


@dataclass(frozen=True)
class FlowResult:
    """One transfer of a collective: hosts, step and size, its start and end in seconds from
    the collective's start, its ideal FCT, the retransmissions on its connections (None where
    not known) and its line-rate FCT."""

    src: str
    dst: str
    step: int
    bytes: int
    start_s: float
    end_s: float
    ideal_fct_s: float | None = None
    retransmitted: int | None = None
    line_rate_fct_s: float | None = None

    @property
    def fct_s(self) -> float:
        return max(0.0, self.end_s - self.start_s)

    @property
    def slowdown(self) -> float | None:
        if not self.ideal_fct_s:
            return None
        return self.fct_s / self.ideal_fct_s


def quantiles(values: list[float]) -> dict[str, float]:
    """p50, p99 and max of ``values`` (none for no values)."""
    if not values:
        return {}
    return {"p50": metrics.percentile(values, 50), "p99": metrics.percentile(values, 99),
            "max": max(values)}


def size_bin(nbytes: int) -> str:
    """The label of the size bin ``nbytes`` falls in (:data:`SIZE_BINS`): ``<=10KiB``,
    ``<=100KiB``, ``<=1MiB``, ``<=10MiB``, ``>10MiB``."""
    for bound in SIZE_BINS:
        if nbytes <= bound:
            return f"<={_size(bound)}"
    return f">{_size(SIZE_BINS[-1])}"


def _size(n: int) -> str:
    return f"{n // (1 << 20)}MiB" if n >= 1 << 20 else f"{n // 1024}KiB"


def slowdown_by_size(flows: Iterable[tuple[int, float]]) -> dict[str, dict[str, float]]:
    """(bytes, slowdown) pairs -> per size bin (in :data:`SIZE_BINS` order, bins without
    flows left out): the count and the p50, p99 and max slowdown."""
    bins: dict[str, list[float]] = {}
    for nbytes, slowdown in flows:
        bins.setdefault(size_bin(nbytes), []).append(slowdown)
    order = [f"<={_size(b)}" for b in SIZE_BINS] + [f">{_size(SIZE_BINS[-1])}"]
    return {label: {"flows": len(bins[label]), **quantiles(bins[label])}
            for label in order if label in bins}


class IdealFct:
    """A fabric's transfers alone: (source host, destination host, bytes) -> (ideal FCT,
    line-rate FCT) in seconds, over the links :class:`~traffic.predict.ideal.FluidModel` puts
    the pair's bytes on, with each link tier's one-way delay (``delays_us``: tier -> us).
    ``ahead_bytes``: how far the sender may run ahead of its line rate (the UDP transports'
    agents pace at the NIC's rate, a few frames ahead), None for a sender that does not pace
    (TCP without fq): then each idle link passes its burst and a super-packet at once."""

    def __init__(self, topo: Topology, delays_us: dict[str, float], mtu: int,
                 goodput: float, ahead_bytes: float | None = None) -> None:
        self.fluid = FluidModel(topo)
        self.tier = {(l.a.node, l.b.node): l.tier for l in (*topo.links, *topo.scale_up)}
        self.delays_us, self.mtu, self.goodput = delays_us, mtu, goodput
        self.ahead_bytes = ahead_bytes
        self.links: dict[tuple[str, str], list[PathLink]] = {}

    def _links(self, src: str, dst: str) -> list[PathLink]:
        if (src, dst) not in self.links:
            out = []
            for (a, b), share in self.fluid.shares(src, dst):
                tier = self.tier.get((a, b)) or self.tier.get((b, a), "")
                rate = self.fluid.rate[(a, b)]
                allowance = htb_burst_bytes(rate, self.mtu) + GSO_MAX_BYTES
                if self.ahead_bytes is not None:
                    allowance = min(allowance, self.ahead_bytes + frame_bytes(self.mtu))
                out.append((rate, share, self.delays_us.get(tier, 0.0), allowance))
            self.links[(src, dst)] = out
        return self.links[(src, dst)]

    def __call__(self, src: str, dst: str, nbytes: int) -> tuple[float, float]:
        links = self._links(src, dst)
        return (ideal_fct_s(nbytes, links, self.goodput),
                line_rate_fct_s(nbytes, links, self.mtu, self.goodput))
