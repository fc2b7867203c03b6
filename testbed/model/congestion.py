"""Pure congestion settings: traffic classes (DSCP -> priority, lossless priorities), ECN marking
per priority with thresholds derived from the link, and the PFC headroom arithmetic.

Thresholds follow the references network engineers use:

* DCTCP (Alizadeh et al., SIGCOMM 2010): mark at a step ``K > C x RTT / 7``; at the emulated
  rates (10 Mbit/s, jumbo frames) that is less than a frame, so the default is at least
  ``MIN_K_FRAMES`` full frames: marking below a few frames marks every packet of a window.
* DCQCN (Zhu et al., SIGCOMM 2015): RED-like marking between ``kmin`` and ``kmax`` with
  probability rising to ``pmax``; defaults ``kmin = K``, ``kmax = 4 K``, ``pmax = 0.1`` (the paper's
  5 KB / 200 KB / 1 % at 40 Gbit/s do not scale to frames of 9 KB at 10 Mbit/s).
* PFC headroom: what still arrives after a pause is sent, ``rate x (2 x propagation + reaction)
  + 2 x MTU`` (IEEE 802.1Qbb's budget: the frame in flight each way, plus the round trip and the
  time the upstream device takes to act).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from testbed.errors import ConfigError

PRIORITIES = 8
DSCP_VALUES = 64
ETH_FRAME_OVERHEAD = 14  # Ethernet header; HTB and the marker count it, not preamble/FCS
ACK_BYTES = 66
MIN_K_FRAMES = 3
RED_KMAX_FACTOR = 4
RED_PMAX = 0.1


class EcnMode(StrEnum):
    """How a switch port marks ECN-capable packets of a priority."""

    OFF = "off"
    STEP = "step"  # CE above K (DCTCP)
    RED = "red"  # CE with probability rising from kmin to kmax (DCQCN)


@dataclass(frozen=True)
class EcnSpec:
    """The ``ecn`` setting of a link class, for some priorities (None: all of them).

    Thresholds left None are derived from the link (:func:`resolve_ecn`).
    """

    mode: EcnMode = EcnMode.OFF
    k_kb: float | None = None
    kmin_kb: float | None = None
    kmax_kb: float | None = None
    pmax: float | None = None
    priorities: tuple[int, ...] | None = None


@dataclass(frozen=True)
class EcnThresholds:
    """What a port's marker does for one priority, in bytes."""

    mode: EcnMode
    k_bytes: int = 0
    kmin_bytes: int = 0
    kmax_bytes: int = 0
    pmax: float = 0.0

    def describe(self) -> str:
        if self.mode == EcnMode.STEP:
            return f"step K={self.k_bytes / 1024:.1f} KiB"
        if self.mode == EcnMode.RED:
            return (f"red {self.kmin_bytes / 1024:.1f}-{self.kmax_bytes / 1024:.1f} KiB "
                    f"pmax {self.pmax:g}")
        return "off"


@dataclass(frozen=True)
class TrafficClasses:
    """Which DSCP values map to which priority. Unlisted DSCP values are priority 0; the default
    is one class. ``strict`` priorities are served before the others at every link end (as
    switches serve RoCE's CNPs, DSCP 48, from a strict-priority queue)."""

    dscp_to_priority: dict[int, int] = field(default_factory=dict)
    strict: tuple[int, ...] = ()

    def table(self) -> list[int]:
        """The priority of every DSCP value, 0..63."""
        return [self.dscp_to_priority.get(d, 0) for d in range(DSCP_VALUES)]

    def check(self, path: str = "fabric.traffic_classes") -> TrafficClasses:
        for dscp, prio in self.dscp_to_priority.items():
            if not 0 <= dscp < DSCP_VALUES:
                raise ConfigError(f"{path}.dscp_to_priority.{dscp}",
                                  f"DSCP is 0..{DSCP_VALUES - 1}, got {dscp}")
            if not 0 <= prio < PRIORITIES:
                raise ConfigError(f"{path}.dscp_to_priority.{dscp}",
                                  f"priority is 0..{PRIORITIES - 1}, got {prio}")
        mapped = set(self.dscp_to_priority.values())
        for i, prio in enumerate(self.strict):
            if prio not in mapped:
                raise ConfigError(f"{path}.strict[{i}]",
                                  f"priority {prio} has no DSCP mapped to it in dscp_to_priority")
        return self


def frame_bytes(mtu: int) -> int:
    """A full frame as HTB counts it."""
    return mtu + ETH_FRAME_OVERHEAD


def base_rtt_s(link_rates_mbps: list[float], delays_us: list[float], mtu: int) -> float:
    """The round trip of an unloaded path: a full frame out and an ACK back over each link, each
    serialized at the link's rate, plus every link's delay both ways.

    Args:
        link_rates_mbps: the rate of each link on the path (one direction's order).
        delays_us: the one-way delay of each link.
        mtu: the MTU.
    """
    ser = sum((frame_bytes(mtu) + ACK_BYTES) * 8 / (r * 1e6) for r in link_rates_mbps)
    return ser + 2 * sum(delays_us) / 1e6


def default_k_bytes(rate_mbps: float, rtt_s: float, mtu: int) -> int:
    """DCTCP's marking threshold for a port: ``C x RTT / 7``, at least a few frames."""
    return max(math.ceil(rate_mbps * 1e6 / 8 * rtt_s / 7), MIN_K_FRAMES * frame_bytes(mtu))


def resolve_ecn(specs: tuple[EcnSpec, ...], rate_mbps: float, rtt_s: float, mtu: int,
                path: str) -> list[EcnThresholds]:
    """The marking of each priority on a port of this link class.

    Args:
        specs: the link class's ``ecn`` entries (a later entry overrides an earlier one's
            priorities).
        rate_mbps: the port's rate.
        rtt_s: the base RTT the defaults scale with (:func:`base_rtt_s` of the longest path).
        mtu: the MTU.
        path: the field path named in errors (``fabric.fabric_link.ecn``).

    Raises:
        ConfigError: for thresholds out of order or a priority out of range.
    """
    out = [EcnThresholds(EcnMode.OFF)] * PRIORITIES
    k_default = default_k_bytes(rate_mbps, rtt_s, mtu)
    for i, spec in enumerate(specs):
        where = f"{path}[{i}]" if len(specs) > 1 else path
        for prio in spec.priorities or ():
            if not 0 <= prio < PRIORITIES:
                raise ConfigError(f"{where}.priorities", f"priority is 0..{PRIORITIES - 1}, "
                                                         f"got {prio}")
        if spec.mode == EcnMode.STEP:
            th = EcnThresholds(EcnMode.STEP, k_bytes=_kb(spec.k_kb, k_default))
        elif spec.mode == EcnMode.RED:
            kmin = _kb(spec.kmin_kb, k_default)
            kmax = _kb(spec.kmax_kb, RED_KMAX_FACTOR * kmin)
            if kmax <= kmin:
                raise ConfigError(f"{where}.kmax_kb", f"must be above kmin_kb "
                                                      f"({kmin / 1024:g}), got {kmax / 1024:g}")
            th = EcnThresholds(EcnMode.RED, kmin_bytes=kmin, kmax_bytes=kmax,
                               pmax=RED_PMAX if spec.pmax is None else spec.pmax)
        else:
            th = EcnThresholds(EcnMode.OFF)
        for prio in spec.priorities if spec.priorities is not None else range(PRIORITIES):
            out[prio] = th
    return out


def _kb(value: float | None, default_bytes: int) -> int:
    return default_bytes if value is None else int(value * 1024)


#: The PFC agent's reaction beyond its poll interval, measured here: from the sample before the
#: one that sees a queue over XOFF until the upstream TBF change has returned. Over the incast
#: experiment's PFC variants (345-1,775 pauses each, 2 ms poll, TCP and UDP): median 3.4-4.2 ms,
#: p99 8.2-12.0 ms, on 2 busy cores. The p99, less the poll, rounded up: 10 ms.
PFC_ACTUATION_S = 0.010
PFC_POLL_MS = 2.0
PFC_WATCHDOG_MS = 500.0
PFC_XON_FRAMES = 2  # XON sits this many frames under XOFF by default
PFC_HEADROOM_FRAMES = 3  # a frame in flight each way, and the one the paused TBF still lets go


def pfc_headroom_bytes(rate_mbps: float, propagation_us: float, reaction_s: float,
                       mtu: int) -> int:
    """The buffer a lossless priority needs above XOFF for one upstream link: what the upstream
    device still sends between the crossing and its stop (``rate x (2 x propagation +
    reaction)``), a full frame in flight each way, and the one frame the paused actuator (a TBF
    whose bucket resets to one frame) may still let go."""
    in_flight = rate_mbps * 1e6 / 8 * (2 * propagation_us / 1e6 + reaction_s)
    return math.ceil(in_flight) + PFC_HEADROOM_FRAMES * frame_bytes(mtu)


def pfc_reaction_s(poll_ms: float) -> float:
    """From a queue crossing XOFF to its upstream stopping: up to one poll interval until the
    agent sees it, then the measured actuation."""
    return poll_ms / 1000 + PFC_ACTUATION_S


@dataclass(frozen=True)
class PfcSpec:
    """The ``fabric.pfc`` setting: which priorities are lossless and their thresholds (None:
    derived, :func:`resolve_pfc`)."""

    priorities: tuple[int, ...] = ()
    xoff_kb: float | None = None
    xon_kb: float | None = None
    headroom_kb: float | None = None
    watchdog_ms: float = PFC_WATCHDOG_MS
    poll_ms: float = PFC_POLL_MS
    mode: str = "pfc"  # or "cbfc": credit-based flow control (fabric.traffic_classes.lossless)
    credit_kb: float | None = None  # cbfc: each link's buffer (None: derived)


@dataclass(frozen=True)
class PfcThresholds:
    """What the PFC agent does for every lossless priority, in bytes and seconds."""

    priorities: tuple[int, ...]
    xoff_bytes: int
    xon_bytes: int
    headroom_bytes: int
    needed_bytes: int  # the headroom the worst switch port needs
    worst_port: str  # that port
    reaction_s: float
    watchdog_s: float
    poll_s: float
    mode: str = "pfc"
    credit_bytes: int = 0  # cbfc: each link's buffer per lossless priority

    @property
    def limit_bytes(self) -> int:
        """A lossless leaf's limit: XOFF plus the headroom above it."""
        return self.xoff_bytes + self.headroom_bytes

    def describe(self) -> str:
        kib = lambda b: f"{b / 1024:.1f}"  # noqa: E731
        return (f"priorities {', '.join(map(str, self.priorities))}: XOFF {kib(self.xoff_bytes)} "
                f"KiB, XON {kib(self.xon_bytes)} KiB, headroom {kib(self.headroom_bytes)} KiB "
                f"(needs {kib(self.needed_bytes)} at {self.worst_port}, reaction "
                f"{self.reaction_s * 1000:.1f} ms), watchdog {self.watchdog_s * 1000:g} ms")


def resolve_pfc(spec: PfcSpec, fan_in: dict[str, list[tuple[float, float]]], queue_bytes: int,
                mtu: int, path: str = "fabric.pfc") -> PfcThresholds | None:
    """The PFC thresholds of a fabric, or None without lossless priorities.

    The agent accounts a lossless priority's buffer at each switch's egress queue (the only
    occupancy this kernel exposes), and a queue over XOFF pauses every port that feeds it; so
    the headroom above XOFF must hold what all of them still send: the sum over the switch's
    other ports of :func:`pfc_headroom_bytes`, at the worst port.

    Args:
        spec: the setting.
        fan_in: switch port -> (rate, one-way delay) of each of its switch's other links.
        queue_bytes: the fabric's queue size, XOFF's default.
        mtu: the MTU.
        path: the field path named in errors.

    Raises:
        ConfigError: for a priority out of range, XON not under XOFF, or a headroom smaller
            than the worst port needs (naming the number it needs).
    """
    if not spec.priorities:
        return None
    for prio in spec.priorities:
        if not 0 <= prio < PRIORITIES:
            raise ConfigError(f"{path}.priorities", f"priority is 0..{PRIORITIES - 1}, got {prio}")
    reaction = pfc_reaction_s(spec.poll_ms)
    need, worst = 0, ""
    for port, links in sorted(fan_in.items()):
        n = sum(pfc_headroom_bytes(rate, delay, reaction, mtu) for rate, delay in links)
        if n > need:
            need, worst = n, port
    headroom = need if spec.headroom_kb is None else int(spec.headroom_kb * 1024)
    if headroom < need:
        raise ConfigError(f"{path}.headroom_kb",
                          f"{spec.headroom_kb:g} KiB cannot keep the class lossless: {worst} "
                          f"needs at least {math.ceil(need / 1024)} KiB (what its "
                          f"{len(fan_in[worst])} feeding links still send in "
                          f"{reaction * 1000:.1f} ms of reaction, plus "
                          f"{PFC_HEADROOM_FRAMES} frames each)")
    xoff = queue_bytes if spec.xoff_kb is None else int(spec.xoff_kb * 1024)
    if xoff < frame_bytes(mtu):
        raise ConfigError(f"{path}.xoff_kb", f"must hold at least one frame "
                                             f"({frame_bytes(mtu) / 1024:.1f} KiB)")
    xon = (max(0, xoff - PFC_XON_FRAMES * frame_bytes(mtu)) if spec.xon_kb is None
           else int(spec.xon_kb * 1024))
    if xon >= xoff:
        raise ConfigError(f"{path}.xon_kb", f"must be under xoff_kb ({xoff / 1024:g}), got "
                                            f"{xon / 1024:g}")
    credit = 0
    if spec.mode == "cbfc":  # each feeder's share of XOFF (the headroom above takes what a
        # link sends between a sample and its new credit), at least two frames
        fan = max((len(v) for v in fan_in.values()), default=1)
        credit = (int(spec.credit_kb * 1024) if spec.credit_kb is not None
                  else max(2 * frame_bytes(mtu), xoff // max(1, fan)))
        if credit < frame_bytes(mtu):
            raise ConfigError("fabric.traffic_classes.lossless.credit_kb",
                              f"{credit / 1024:g} KiB is less than a frame "
                              f"({frame_bytes(mtu)} bytes): no link could ever send")
    return PfcThresholds(tuple(sorted(set(spec.priorities))), xoff, xon, headroom, need, worst,
                         reaction, spec.watchdog_ms / 1000, spec.poll_ms / 1000, spec.mode,
                         credit)


# -- what a run's switch queues did ------------------------------------------------------------

def _percentile(values: list[int], q: float) -> int:
    if not values:
        return 0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def summarize_congestion(before: dict[str, dict], after: dict[str, dict],
                         samples: dict[str, list[tuple[int, int | None]]],
                         lossless: tuple[int, ...] = ()) -> dict:
    """The ``congestion`` section of a results document.

    Args:
        before: :meth:`testbed.fabric.fabric.Fabric.congestion` when the workload started.
        after: the same when it ended.
        samples: port -> (real backlog, virtual backlog or None) sampled during the workload.
        lossless: the lossless priorities (their drops are ``lossless_drops``).

    Returns:
        Totals over the ports (drops, ECN-capable packets, CE marks, PFC pauses, paused time
        and watchdog events, drops of lossless priorities, queue max and p99 from the samples,
        the virtual queue's drift from the real backlog) and the same per port and priority
        under ``ports`` (ports that neither carried anything nor were paused are left out).
    """
    ports, all_samples, drift = {}, [], []
    totals = {"drops": 0, "ect": 0, "ecn_marked": 0, "pfc_pause_events": 0, "pfc_paused_s": 0.0,
              "pfc_watchdog_events": 0, "lossless_drops": 0, "link_loss_drops": 0, "trimmed": 0,
              "corrupted": 0, "llr_replays": 0, "bad_fcs_drops": 0,
              "credit_stall_events": 0, "credit_stalled_s": 0.0}
    for name, now in sorted(after.items()):
        then = before.get(name, {})
        q0, q1 = then.get("queue", {}), now.get("queue", {})
        sent = q1.get("packets", 0) - q0.get("packets", 0)
        real = [r for r, _ in samples.get(name, [])]
        port = {"packets": sent, "drops": q1.get("drops", 0) - q0.get("drops", 0),
                "queue_max_bytes": max(real, default=0),
                "queue_p99_bytes": _percentile(real, 99), "priorities": {}}
        for prio, c1 in now.get("priorities", {}).items():
            row = _priority_row(then.get("priorities", {}).get(prio, {}), c1,
                                prio in lossless, totals)
            if row:
                port["priorities"][str(prio)] = row
        if not sent and not port["priorities"]:
            continue
        totals["drops"] += port["drops"]
        all_samples += real
        drift += [abs(v - r) for r, v in samples.get(name, []) if v is not None and (r or v)]
        ports[name] = port
    totals["pfc_paused_s"] = round(totals["pfc_paused_s"], 4)
    totals["credit_stalled_s"] = round(totals["credit_stalled_s"], 4)
    return {**totals, "queue_max_bytes": max(all_samples, default=0),
            "queue_p99_bytes": _percentile(all_samples, 99),
            "samples": len(all_samples),
            "virtual_queue_drift_bytes": {"mean": sum(drift) / len(drift) if drift else 0.0,
                                          "p99": _percentile(drift, 99)} if drift else None,
            "ports": ports}


def _priority_row(c0: dict, c1: dict, lossless: bool, totals: dict) -> dict:
    """One port priority's counters between two readings (added to ``totals``)."""
    row: dict = {}
    for key, total in (("loss_drops", "link_loss_drops"), ("trimmed", "trimmed"),
                       ("corrupted", "corrupted"), ("llr_replays", "llr_replays"),
                       ("bad_fcs", "bad_fcs_drops")):
        n = c1.get(key, 0) - c0.get(key, 0)
        if n:  # the link's random loss dropped, packets trimmed, by the eBPF program
            row[total] = n
            totals[total] += n
    delta = {k: c1.get(k, 0) - c0.get(k, 0) for k in ("packets", "ect", "marked")}
    if delta["packets"]:
        row.update(packets=delta["packets"], ect=delta["ect"],
                   ecn_marked=delta["marked"])
        totals["ect"] += delta["ect"]
        totals["ecn_marked"] += delta["marked"]
    if "queue" in c1:
        red = c1["queue"].get("marked", 0) - c0.get("queue", {}).get("marked", 0)
        if red:  # marked by a RED leaf (the marker, off there, only counted ECT)
            row["ecn_marked"] = row.get("ecn_marked", 0) + red
            totals["ecn_marked"] += red
        drops = c1["queue"].get("drops", 0) - c0.get("queue", {}).get("drops", 0)
        if drops or row:
            row["drops"] = drops
        if lossless:
            totals["lossless_drops"] += drops
    p1, p0 = c1.get("pfc"), c0.get("pfc", {})
    if p1 is not None and "stall_events" in p1:  # credit-based flow control's stalls
        events = p1["stall_events"] - p0.get("stall_events", 0)
        stalled = round(p1["stalled_s"] - p0.get("stalled_s", 0.0), 4)
        if events or stalled:
            row["cbfc"] = {"stall_events": events, "stalled_s": stalled}
            totals["credit_stall_events"] += events
            totals["credit_stalled_s"] += stalled
    elif p1 is not None:
        pfc = {"pause_events": p1["pause_events"] - p0.get("pause_events", 0),
               "paused_s": round(p1["paused_s"] - p0.get("paused_s", 0.0), 4),
               "watchdog_events": p1["watchdog_events"] - p0.get("watchdog_events", 0),
               "xoff_events": p1.get("xoff_events", 0) - p0.get("xoff_events", 0)}
        if pfc["pause_events"] or pfc["paused_s"] or pfc["xoff_events"]:
            row["pfc"] = pfc
            totals["pfc_pause_events"] += pfc["pause_events"]
            totals["pfc_paused_s"] += pfc["paused_s"]
            totals["pfc_watchdog_events"] += pfc["watchdog_events"]
    return row


# -- PFC deadlock: a cycle of pauses -------------------------------------------------------------

def pause_cycles(paused_by: dict[str, set[str]]) -> list[list[str]]:
    """The cyclic pause dependencies of a pause graph: each port in a cycle is paused by the
    next one (it cannot send until that one drains, which waits for the one after, and so on
    back to the first): a PFC deadlock, which only a watchdog breaks.

    Args:
        paused_by: port -> the ports whose XOFF currently pauses it (for one priority).

    Returns:
        Every elementary cycle once, each rotated to start at its smallest port, sorted.
    """
    cycles: set[tuple[str, ...]] = set()
    nodes = sorted(set(paused_by) | {p for targets in paused_by.values() for p in targets})
    index = {n: i for i, n in enumerate(nodes)}
    for start in nodes:  # cycles whose smallest node is ``start`` (Johnson-style restriction)
        stack = [(start, [start], {start})]
        while stack:
            node, path, seen = stack.pop()
            for nxt in sorted(paused_by.get(node, ())):
                if nxt == start:
                    cycles.add(tuple(path))
                elif index[nxt] > index[start] and nxt not in seen:
                    stack.append((nxt, path + [nxt], seen | {nxt}))
    return [list(c) for c in sorted(cycles)]


def link_utilization(topo, before: dict[str, dict], after: dict[str, dict],
                     seconds: float) -> dict[str, dict[str, float]]:
    """Per tier of directed links (``edge->agg``, ``agg->core``, ``core->agg``, ...), the
    max and mean share of the link rate the switch ports sent between two
    :meth:`testbed.fabric.fabric.Fabric.congestion` readings ``seconds`` apart."""
    ends = {}
    for link in topo.links:
        for end in (link.a, link.b):
            if topo.nodes[end.node].is_switch:
                ends[end.ifname] = (end.node, link)
    tiers: dict[str, list[float]] = {}
    for name, (node, link) in ends.items():
        if name not in after or seconds <= 0:
            continue
        sent = (after[name].get("queue", {}).get("bytes", 0)
                - before.get(name, {}).get("queue", {}).get("bytes", 0))
        peer = topo.nodes[link.other(node).node]
        tier = f"{topo.nodes[node].role}->{peer.role}"
        tiers.setdefault(tier, []).append(sent * 8 / seconds / (link.rate_mbps * 1e6))
    return {tier: {"max": round(max(v), 4), "mean": round(sum(v) / len(v), 4)}
            for tier, v in sorted(tiers.items())}
