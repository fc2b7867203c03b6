"""Real units in, one time scale (pure): an experiment file that states the real fabric, and the
emulated fabric this machine builds from it.

A real AI fabric runs 400 Gbit/s links with about a microsecond per hop: a round trip holds
about a hundred 4 KiB packets, and its buffers, ECN thresholds and transport timers are sized
in those terms. This machine forwards a few thousand packets a second through Python agents.
Time-scaled emulation keeps the real fabric's regime instead of its speed: with one factor N
(``emulator.time_scale``),

* every rate is divided by N (links, scale-up links);
* every time is multiplied by N (per-hop latency, the workload's gaps, compute and start
  times, failure times, the controller's polling, PFC's polling and watchdog, queue sampling);
* every size stays as it is (MTU, queues, ECN and trimming thresholds, PFC headroom, messages),
  and so does every count of packets or bandwidth-delay products.

A file in real units gives rates in Gbit/s (``rate_gbps``) or Mbit/s, the latency of each link
(switch and cable, one way) in ns (``latency_ns``), and any buffer either in KiB or in
bandwidth-delay products of the fabric (``size_bdp``, ``k_bdp``, ``xoff_bdp``...: the host
link's rate times the longest path's unloaded round trip). Without ``time_scale`` nothing is
scaled (N = 1): the emulated-unit files of before read as they did.

``auto`` picks the smallest N at which this machine keeps up (:func:`choose`): the datapath's
measured budget of bits times switch hops, the agents' CPU per packet when a UDP transport runs
(by engine: the compiled one's is about a third of the Python one's), and the agents' timing
(their event loop wakes within about a millisecond: a packet time must be several of those). Wall-clock guards (timeouts, the controller's readiness) are not scaled.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

from testbed.errors import ConfigError
from testbed.model.congestion import PFC_POLL_MS, PFC_WATCHDOG_MS, frame_bytes
from testbed.model.spec import Backend, Datapath, TestbedSpec
from testbed.plan.fidelity import (
    HEADROOM,
    MEASURED_CORES,
    mean_switch_hops,
    saturation_mbit_hops,
    saturation_table,
)
from testbed.plan.delayline import quantile_us
from traffic.workloads.workload import Workload

#: times the file gives in real time, per section (any depth below it): multiplied by N
TIME_KEYS = {
    "fabric": ("delay_us", "poll_ms", "watchdog_ms"),
    "controller": ("poll_interval_s", "flowlet_gap_us"),
    "emulator": ("queue_sample_ms",),
    "workload": ("gap_s", "t_s", "start_s", "compute_ms"),
    "failures": ("at_s",),
}
#: rates the file gives in real units (``rate_gbps`` is made ``rate_mbps`` first): divided by N
RATE_KEYS = ("rate_mbps",)
#: buffers given in bandwidth-delay products, and the KiB field each stands for
BDP_KEYS = {"size_bdp": "size_kb", "k_bdp": "k_kb", "kmin_bdp": "kmin_kb",
            "kmax_bdp": "kmax_kb", "threshold_bdp": "threshold_kb", "xoff_bdp": "xoff_kb",
            "xon_bdp": "xon_kb", "headroom_bdp": "headroom_kb", "credit_bdp": "credit_kb"}
#: KiB fields that are integers in the schema (a BDP rounds up to the next KiB)
INTEGER_KB = ("size_kb",)


def real_units(data: dict) -> dict:
    """``rate_gbps`` as ``rate_mbps`` and ``latency_ns`` as ``delay_us`` throughout the file's
    ``fabric`` (a copy; the file's own units, nothing scaled yet).

    Raises:
        ConfigError: a link that gives a rate or a latency both ways, naming it.
    """
    out = copy.deepcopy(data)
    fabric = out.get("fabric")
    if isinstance(fabric, dict):
        _units(fabric, "fabric")
    return out


def _units(node: dict, path: str) -> None:
    for key, value in list(node.items()):
        if isinstance(value, dict):
            _units(value, f"{path}.{key}")
    pairs = (("rate_gbps", "rate_mbps", 1e3), ("latency_ns", "delay_us", 1e-3),
             ("latency_us", "delay_us", 1.0))
    for target in ("rate_mbps", "delay_us"):
        given = [k for k in (target, *(r for r, t, _ in pairs if t == target)) if k in node]
        if len(given) > 1:
            raise ConfigError(f"{path}.{given[-1]}", f"give one of {' and '.join(given)}, not "
                                                     "both")
    for real, emulated, factor in pairs:
        if real in node:
            node[emulated] = node.pop(real) * factor


def bdp_fields(data: dict) -> list[str]:
    """The field paths given in bandwidth-delay products (``fabric.queue.size_bdp``)."""
    out: list[str] = []
    _walk_bdp(data.get("fabric") or {}, "fabric", out, None)
    return out


def without_bdp(data: dict) -> dict:
    """A copy with every ``*_bdp`` field left out (to find the bandwidth-delay product)."""
    out = copy.deepcopy(data)
    _walk_bdp(out.get("fabric") or {}, "fabric", [], None, drop=True)
    return out


def resolve_bdp(data: dict, bdp_bytes: float) -> dict:
    """A copy with every ``*_bdp`` field made its KiB field (``size_bdp: 2`` -> ``size_kb``).

    Raises:
        ConfigError: a buffer given both ways, naming it.
    """
    out = copy.deepcopy(data)
    _walk_bdp(out.get("fabric") or {}, "fabric", [], bdp_bytes)
    return out


def _walk_bdp(node: object, path: str, found: list[str], bdp_bytes: float | None,
              drop: bool = False) -> None:
    if isinstance(node, list):
        for i, item in enumerate(node):
            _walk_bdp(item, f"{path}[{i}]", found, bdp_bytes, drop)
        return
    if not isinstance(node, dict):
        return
    for key, value in list(node.items()):
        if key in BDP_KEYS:
            found.append(f"{path}.{key}")
            kb = BDP_KEYS[key]
            if drop:
                node.pop(key)
            elif bdp_bytes is not None:
                if kb in node:
                    raise ConfigError(f"{path}.{key}", f"give {key} or {kb}, not both")
                size = node.pop(key) * bdp_bytes / 1024
                node[kb] = max(1, math.ceil(size)) if kb in INTEGER_KB else round(size, 3)
        else:
            _walk_bdp(value, f"{path}.{key}", found, bdp_bytes, drop)


def scaled(data: dict, n: float) -> dict:
    """The file's data (in real units, :func:`real_units` applied) in emulated units: rates
    divided by ``n``, times multiplied by it (a copy)."""
    out = copy.deepcopy(data)
    if n == 1:
        return out
    pfc = (out.get("fabric") or {}).get("pfc")
    if isinstance(pfc, dict):
        _pfc_defaults(pfc, out["fabric"], n)
    for section, keys in TIME_KEYS.items():
        if section in out:
            _scale(out[section], keys, n)
    if "fabric" in out:
        _scale(out["fabric"], RATE_KEYS, 1 / n)
    replay = (out.get("workload") or {}).get("replay")
    if isinstance(replay, dict):  # a trace's own start times are real too
        replay["time_scale"] = replay.get("time_scale", 1) * n
        if replay.get("size_scale") == "real":  # sizes are the real ones already
            replay["size_scale"] = 1
    return out


def _pfc_defaults(pfc: dict, fabric: dict, n: float) -> None:
    """PFC's times as a real fabric's where the file leaves them out (scaled with the rest):
    the storm watchdog's 500 ms (unscaled, a pause held some 100 packet times would be broken
    mid-incast, and the lossless class would drop), and the agent's polling, one packet time
    of the host link (a switch notices its queue cross XOFF within about a packet; with the
    machine's fixed 2 ms instead, the pause came a fraction of a packet time late at N and
    half that at 2N, and a lossless incast's completion moved with N), though never under
    the machine's 2 ms nor over the 100 ms its agent keeps up with (as emulated)."""
    pfc.setdefault("watchdog_ms", PFC_WATCHDOG_MS)
    rate = (fabric.get("host_link") or {}).get("rate_mbps")
    if "poll_ms" not in pfc and rate:
        packet_ms = frame_bytes(int(fabric.get("mtu", 1500))) * 8 / (rate * 1e3)
        most = EMULATED_BOUNDS["fabric.pfc.poll_ms"][1]
        pfc["poll_ms"] = min(max(packet_ms, PFC_POLL_MS / n), most / n)


def _scale(node: object, keys: tuple[str, ...], factor: float) -> None:
    if isinstance(node, list):
        for item in node:
            _scale(item, keys, factor)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key in keys and isinstance(value, (int, float)) and not isinstance(value, bool):
                node[key] = value * factor
            else:
                _scale(value, keys, factor)


#: times this machine's services take only within bounds, checked as emulated (the file's value
#: times N): field -> (least, most, unit, the value in the spec)
EMULATED_BOUNDS = {
    "controller.poll_interval_s": (0.1, 60.0, "s", lambda spec: spec.controller.poll_interval_s),
    "fabric.pfc.poll_ms": (0.5, 100.0, "ms", lambda spec: spec.fabric.pfc.poll_ms),
}


def check_emulated(spec: TestbedSpec, data: dict, n: float) -> None:
    """The times of :data:`EMULATED_BOUNDS` the file gives, as emulated, within their bounds.

    Raises:
        ConfigError: naming the field, its emulated value and what N made it.
    """
    for path, (least, most, unit, value) in EMULATED_BOUNDS.items():
        section, *rest = path.split(".")
        node = data.get(section) or {}
        for key in rest[:-1]:
            node = node.get(key) or {}
        if rest[-1] not in node:
            continue
        got = value(spec)
        if not least <= got <= most:
            how = f" (the file's {got / n:g} x emulator.time_scale {n:g})" if n != 1 else ""
            raise ConfigError(path, f"{got:g} {unit} as emulated{how}: must be {least:g} to "
                                    f"{most:g} {unit}, what this machine's services keep up with")


# -- the run's own verdict ---------------------------------------------------------------------

PPB_TOLERANCE = 0.10  # measured packets per BDP within this of the real fabric's
LATE_MEDIAN_OF_PACKET = 0.125  # the agents' median lateness, in packet times, at most
LATE_P99_OF_PACKET = 0.25  # ... and their 99th percentile (see PACKET_TIME_IN_WAKES)


def judge(scale: TimeScale, counters: list,
          relay: dict | None = None) -> tuple[dict, list[str]]:
    """What a time-scaled run kept of the real fabric's regime, from its collectives'
    transport counters (:class:`traffic.measure.rows.TransportCounters`; TCP's have neither
    figure) and the hosts' delay relay's figures (``relay``: :mod:`fabriclab.delayprobe`'s
    probe and ``lateness_us``): the packets per BDP on the least round trip the senders or
    the probe measured, against the real fabric's; the agents' and the relay's lateness
    against a packet time. Returns the figures and the reasons the verdict is degraded (none:
    kept)."""
    out: dict = {"n": scale.n}
    reasons = []
    excess = [c.probe_excess_max_us for c in counters
              if c is not None and c.probe_excess_max_us is not None]
    if relay is not None:
        out["delay_relay"] = relay
        if relay.get("probe_excess_max_us") is not None:
            excess.append(relay["probe_excess_max_us"])
        if relay.get("error"):
            reasons.append(f"the round trip through the hosts' delay relay could not be "
                           f"probed: {relay['error']}")
    if excess:
        added_s = max(excess) / 1e6
        base_s = scale.real_base_rtt_s * scale.n
        ratio = (base_s + added_s) / base_s
        measured = scale.bdp_packets * ratio
        out["packets_per_bdp"] = {"real": round(scale.bdp_packets, 2),
                                  "measured": round(measured, 2), "ratio": round(ratio, 4),
                                  "added_ms": round(added_s * 1e3, 3),
                                  "base_rtt_ms": round(base_s * 1e3, 3)}
        if abs(ratio - 1) > PPB_TOLERANCE:
            reasons.append(f"{measured:.1f} packets per BDP: the emulation added up to "
                           f"{added_s * 1e3:.2f} ms to an unloaded round trip of "
                           f"{base_s * 1e3:.1f} ms, {ratio - 1:+.0%} off the real fabric's "
                           f"{scale.bdp_packets:.1f} (beyond {PPB_TOLERANCE:.0%})")
    hist: dict[str, int] = dict((relay or {}).get("lateness_us") or {})
    for c in counters:
        for side in ((c.lateness_us or {}).values() if c is not None else ()):
            for bucket, count in side.items():
                hist[bucket] = hist.get(bucket, 0) + count
    total = sum(hist.values())
    if total:
        packet_us = scale.packet_time_s * 1e6
        p50, p99 = quantile_us(hist, 0.5), quantile_us(hist, 0.99)
        out["lateness"] = {"events": total, "p50_us_at_most": p50, "p99_us_at_most": p99,
                           "packet_time_us": round(packet_us, 1)}
        if p50 > LATE_MEDIAN_OF_PACKET * packet_us or p99 > LATE_P99_OF_PACKET * packet_us:
            who = "the agents and the delay relay" if relay else "the agents"
            reasons.append(f"{who} were up to {p50:g} us late (median) and {p99:g} us "
                           f"(p99) against their schedule, with a packet time of "
                           f"{packet_us:,.0f} us: over {LATE_MEDIAN_OF_PACKET:g} (median) or "
                           f"{LATE_P99_OF_PACKET:g} (p99) of it")
    return out, reasons


# -- choosing N ----------------------------------------------------------------------------

#: The agents' CPU per DATA packet by engine (transport.engine) and transport (all agents,
#: sending and receiving, the kernel's forwarding in their system calls included), at the
#: margin (the start-up left out), measured with bench/agents.py at 50 Mbit/s on a 2-core
#: machine of the CI kind, the larger of two runs (docs/measurements/transports.md,
#: 2026-12-06)
AGENT_CPU_S_PER_PACKET = {"python": {"uet": 283e-6, "rocev2": 286e-6},
                          "native": {"uet": 82e-6, "rocev2": 79e-6}}
AGENT_HEADROOM = 0.5  # the agents may take half the machine; the switches and hosts the rest
#: How late an agent's event loop may handle a packet or an ACK after its time, by engine: the
#: Python one sleeps in epoll, whose timeout counts whole milliseconds (p99 lateness 1-2 ms in
#: bench/agents.py). The compiled one waits to the nanosecond with 1 us of timer slack (p99 at
#: most 50-250 us with 4 agents), but with 16 agents on 2 cores its p99 was 2-4 ms all the
#: same (experiments/transports.yaml at N = 15,000: the wait for a core, not the timer), so
#: it is given the Python one's until it is scheduled ahead of the rest. The hosts' delay
#: relay is Python's. A packet time must be eight of those: at four (p99 lateness a quarter
#: packet) a lossy go-back-N incast's tail depended on N (docs/measurements/scaling.md)
LOOP_GRANULARITY_S = {"python": 1e-3, "native": 1e-3}
RELAY_GRANULARITY_S = LOOP_GRANULARITY_S["python"]
PACKET_TIME_IN_WAKES = 8
#: The hosts' delay relay's CPU per packet it holds (one read and one write on a TUN device,
#: a heap push and pop; testbed.linux.tunrelay), measured on a 2-core machine of the CI kind
#: (docs/measurements/scaling.md, 2026-12-06); the relay is one process: one core at most
RELAY_CPU_S_PER_PACKET = 70e-6
RELAY_HEADROOM = 0.5  # of its one core
RELAY_PACKETS_PER_DATA = 2  # a data packet and its acknowledgement, both held


@dataclass(frozen=True)
class Bound:
    """One constraint on N: the least N it allows, and why."""

    name: str
    least: float
    why: str


@dataclass(frozen=True)
class TimeScale:
    """The factor between the real fabric and the emulated one, and what it keeps.

    Args:
        n: the factor (emulated time = real time x n).
        auto: chosen by :func:`choose` (else given in the file).
        bounds: the constraints ``auto`` weighed (each one's least N).
        real_rate_gbps: the real host link's rate.
        real_base_rtt_s: the real fabric's unloaded round trip on its longest path.
        mtu: the MTU (a packet's size is not scaled).
    """

    n: float
    auto: bool
    bounds: tuple[Bound, ...]
    real_rate_gbps: float
    real_base_rtt_s: float
    mtu: int

    @property
    def bdp_bytes(self) -> float:
        return self.real_rate_gbps * 1e9 / 8 * self.real_base_rtt_s

    @property
    def bdp_packets(self) -> float:
        """Full frames per round trip: the same real and emulated."""
        return self.bdp_bytes / frame_bytes(self.mtu)

    @property
    def emulated_rate_mbps(self) -> float:
        return self.real_rate_gbps * 1e3 / self.n

    @property
    def packet_time_s(self) -> float:
        """A full frame's time on a host link, emulated."""
        return frame_bytes(self.mtu) * 8 / (self.emulated_rate_mbps * 1e6)

    def binding(self) -> Bound | None:
        """The constraint that set N (auto), the largest."""
        return max(self.bounds, key=lambda b: b.least, default=None)

    def describe(self) -> str:
        """One line: N, why, the regime."""
        why = "given" if not self.auto else (
            f"auto: {self.binding().why}" if self.binding() else "auto")
        return (f"time scale N = {self.n:,.0f} ({why}): {self.real_rate_gbps:g} Gbit/s hosts "
                f"run at {self.emulated_rate_mbps:.4g} Mbit/s, the {self.real_base_rtt_s * 1e6:.3g}"
                f" us base RTT takes {self.real_base_rtt_s * self.n * 1e3:.4g} ms; "
                f"{self.bdp_packets:.1f} packets per BDP")

    def to_json(self) -> dict:
        """For ``results.json`` (``time_scale``) and ``fabriclab validate --json``."""
        return {"n": self.n, "auto": self.auto,
                "bounds": [{"name": b.name, "least": round(b.least, 1), "why": b.why}
                           for b in self.bounds],
                "real": {"host_rate_gbps": self.real_rate_gbps,
                         "base_rtt_us": round(self.real_base_rtt_s * 1e6, 4),
                         "bdp_bytes": round(self.bdp_bytes),
                         "bdp_packets": round(self.bdp_packets, 2)},
                "emulated": {"host_rate_mbps": round(self.emulated_rate_mbps, 6),
                             "base_rtt_ms": round(self.real_base_rtt_s * self.n * 1e3, 4),
                             "packet_time_ms": round(self.packet_time_s * 1e3, 4)}}


NICE_STEPS = (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10)


def nice(n: float) -> float:
    """``n`` rounded up to one of :data:`NICE_STEPS` times a power of ten (a factor a reader
    can use, at most a third more than ``n``)."""
    if n <= 1:
        return 1.0
    power = 10 ** math.floor(math.log10(n))
    for step in NICE_STEPS:
        if n <= step * power * (1 + 1e-9):
            return float(step * power)
    return float(10 * power)


def choose(*, senders: int, real_rate_gbps: float, mean_hops: float, mtu: int,
           saturation_mbit_hops: float, cores: int, transports: set[str],
           headroom: float, measured_cores: int, relay: bool = False,
           engines: frozenset[str] = frozenset({"native"})) -> tuple[float, tuple[Bound, ...]]:
    """The smallest N (rounded by :func:`nice`) at which this machine keeps up with
    ``senders`` hosts sending at their real line rate at once.

    Args:
        senders: hosts that send at once (the workload's senders; all hosts at most).
        real_rate_gbps: the real host link rate.
        mean_hops: mean switch hops between hosts.
        mtu: the MTU.
        saturation_mbit_hops: the datapath's measured saturation point at this MTU.
        cores: this machine's cores.
        transports: the workload's transports (``tcp``, ``rocev2``, ``uet``).
        headroom: the share of the datapath's saturation a run may use.
        measured_cores: the cores of the machine the saturation point was measured on.
        relay: the hosts' delay relay holds every packet (``emulator.delay_line: hosts``).
        engines: the agents' engines the UDP transports' jobs run (``native``, ``python``).
    """
    rate_mbps = real_rate_gbps * 1e3
    budget = headroom * saturation_mbit_hops * max(1, cores) / measured_cores
    offered = senders * rate_mbps * max(mean_hops, 1.0)
    bounds = [Bound("datapath", offered / budget,
                    f"{senders} senders x {real_rate_gbps:g} Gbit/s x {mean_hops:.2f} switch "
                    f"hops against the datapath's {budget:,.0f} Mbit-hop/s with headroom")]
    packets = senders * rate_mbps * 1e6 / 8 / frame_bytes(mtu)
    real_packet_s = frame_bytes(mtu) * 8 / (rate_mbps * 1e6)
    udp = sorted(t for t in transports if t in AGENT_CPU_S_PER_PACKET["python"])
    engines = sorted(engines or {"native"})
    granularity = max(([LOOP_GRANULARITY_S[e] for e in engines] if udp else [])
                      + ([RELAY_GRANULARITY_S] if relay else []), default=0.0)
    least_packet_s = PACKET_TIME_IN_WAKES * granularity
    if udp:
        cost = max(AGENT_CPU_S_PER_PACKET[e][t] for t in udp for e in engines)
        bounds.append(Bound("agents' CPU", packets * cost / (AGENT_HEADROOM * max(1, cores)),
                            f"{senders} senders' {packets:,.0f} packets/s at the real rate x "
                            f"{cost * 1e6:.0f} us of the agents' CPU each ({'/'.join(udp)}, "
                            f"{'/'.join(engines)} engine) against {AGENT_HEADROOM:.0%} of "
                            f"{cores} cores"))
    if udp or relay:
        who = "agents'" if udp else "delay relay's"
        bounds.append(Bound(f"{who} timing", least_packet_s / real_packet_s,
                            f"a packet's {real_packet_s * 1e9:.0f} ns on a host link made at "
                            f"least {least_packet_s * 1e3:g} ms ({PACKET_TIME_IN_WAKES} of the "
                            f"{who} event-loop wake-ups)"))
    if relay:
        held = packets * RELAY_PACKETS_PER_DATA
        bounds.append(Bound("delay relay's CPU", held * RELAY_CPU_S_PER_PACKET / RELAY_HEADROOM,
                            f"{held:,.0f} packets/s held (data and acknowledgements of "
                            f"{senders} senders at the real rate) x "
                            f"{RELAY_CPU_S_PER_PACKET * 1e6:.0f} us of the relay's CPU each "
                            f"against {RELAY_HEADROOM:.0%} of its one core"))
    return nice(max(b.least for b in bounds)), tuple(bounds)


def auto(real: TestbedSpec, workload: Workload | None, cores: int,
         native_built: bool = True) -> tuple[float, tuple[Bound, ...]]:
    """``auto``'s N for a testbed (and its workload) parsed at its real rates, on a machine of
    ``cores`` cores (without the compiled engine built, the Python one's costs count)."""
    jobs, engine = workload.jobs if workload else (), None if native_built else "python"
    transports = {j.transport for j in jobs}
    engines = frozenset(engine or j.transport_options.engine for j in jobs if j.transport != "tcp")
    senders = 0
    for batch in (workload.batches() if workload else []):
        senders = max(senders, sum(max((len({t.src for t in c.schedule.transfers})
                                        for c in job.collectives), default=0)
                                   for job in batch))
    if workload is not None and workload.program is not None:
        senders, transports = len(real.topology.hosts), transports | {"tcp"}
    datapath = "ovs" if (real.emulator.datapath == Datapath.OVS
                         or real.emulator.backend == Backend.VM) else "ebpf"
    return choose(
        senders=min(max(senders, 1), len(real.topology.hosts)),
        real_rate_gbps=real.fabric.host_link.rate_mbps / 1e3,
        mean_hops=mean_switch_hops(real.topology), mtu=real.fabric.mtu,
        saturation_mbit_hops=saturation_mbit_hops(real.fabric.mtu, saturation_table(datapath)),
        cores=cores, transports=transports, headroom=HEADROOM,
        measured_cores=MEASURED_CORES, relay=real.fabric.delay_line == "hosts",
        engines=engines or frozenset({"native"}))


def delay_line(spec: TestbedSpec, workload: Workload | None, emulator: dict) -> str:
    """Where the links' delay is added (``emulator.delay_line``): ``agents``, ``hosts`` (the
    relay of :mod:`testbed.plan.hostdelay`) or ``link`` (netem)."""
    asked = emulator.get("delay_line", "auto")
    if not any(spec.fabric.link(t).delay_us for t in ("host", "fabric")):
        return "link"
    jobs = workload.jobs if workload else ()
    tcp = [j for j in jobs if j.transport == "tcp"]
    udp_only = bool(jobs) and not tcp and (workload is None or workload.program is None)
    if asked == "agents" and not udp_only:
        what = (f"job {tcp[0].index} runs tcp" if tcp else "the workload's program runs"
                if workload is not None and workload.program is not None else "no job runs")
        raise ConfigError("emulator.delay_line", f"agents: the agents' delay line carries the "
                          f"UDP transports' packets (rocev2, uet) only, and {what}; kernel TCP's "
                          "latency needs netem (the vm backend has it) or the hosts' relay "
                          "(emulator.delay_line: hosts)")
    if asked == "hosts":
        return "hosts"
    return "agents" if asked == "agents" or (asked == "auto" and udp_only) else "link"
