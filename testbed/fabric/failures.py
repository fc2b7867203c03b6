"""Link and switch failures, the adapter: :class:`FailureInjector` is a fabric service thread
that applies the planned events (:mod:`testbed.plan.failplan`) at their times, relative to the
workload's start, failing or repairing each link as :mod:`testbed.fabric.linkfail` does (the
link is cut, its switches see the loss of signal at once: the groups' watch ports drop dead
buckets, the controller gets the port status and reroutes; then the veths go down), or
degrading it to a share of its rate (its shapers, the marker's and the eBPF switches' drain
rates). It samples the throughput the fabric delivers to the hosts meanwhile, and for two
seconds after a failure or a degradation the bytes offered to the link's switch ports every
millisecond, and keeps a log of what it applied and when, with the throughput before, during
and after and how long the traffic took to move off, for ``results.json``.
:func:`set_links_of_running_fabric` is ``fabriclab fail`` / ``restore``.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from testbed.contract import FailureFabric
from testbed.linux import ovs
from testbed.errors import TestbedError
from testbed.model.congestion import frame_bytes
from testbed.paths import SWITCH_MGMT_DIR
from testbed.plan.failplan import (
    FINE_SAMPLE_S,
    FINE_SPAN_S,
    MOVE_SETTLE_S,
    MOVE_WINDOW_S,
    SAMPLE_S,
    FailureEvent,
    alternatives,
    live_links,
    move_off_unmeasured,
    move_window_s,
    throughput_around,
    time_to_fit_on_average,
    time_to_move_off,
)
from testbed.fabric.linkfail import End, LinkCut, set_links
from testbed.linux.netlink import Netlink


class FailureInjector:
    """Applies failure events at their times after :meth:`begin`, sampling the throughput the
    fabric delivers to the hosts (its ports toward them) every ``SAMPLE_S`` until
    :meth:`finish`; a fabric service thread."""

    def __init__(self, fabric: FailureFabric, events: tuple[FailureEvent, ...],
                 time_scale: float = 1.0) -> None:
        self.fabric = fabric
        self.events = events
        self.time_scale = time_scale  # N: a time-scaled fabric's real time is its time / N
        self.began: float | None = None
        self.ended_s: float | None = None
        self._begin = threading.Event()
        self.applied: list[dict] = []
        self.samples: list[tuple[float, int]] = []  # (s since begin, bytes to the hosts)
        self._cut_base: dict[str, int | None] = {}  # a failed target -> cut drops before
        # the event being watched (its index in applied), its ports' rates now, until when
        self._watch: tuple[int, dict[str, float], float] | None = None
        self._fine: dict[int, list[tuple[float, dict[str, int]]]] = {}  # index -> samples
        self._rates: dict[int, dict[str, float]] = {}  # index -> watched port -> bytes/s
        self._groups: dict[int, dict[str, list[str]]] = {}  # index -> port -> alternatives
        self._windows: dict[int, dict[str, float]] = {}  # index -> port -> its window, s
        self._packets: dict[int, dict[str, int]] = {}  # index -> port -> its packets' size
        self._notices: dict[int, list[dict]] = {}  # index -> the switches' notices after it
        self.host_ports = {l.end(sw.name).ifname for sw in fabric.topo.switches
                           for l in fabric.topo.ports(sw.name).values()
                           if not fabric.topo.nodes[l.other(sw.name).node].is_switch}

    def begin(self, at: float | None = None) -> None:
        """The workload starts at ``at`` (monotonic; None: now), where its traffic does:
        event times count from there."""
        self.began = time.monotonic() if at is None else at
        self._begin.set()

    def finish(self) -> None:
        """The workload is over: later samples do not count."""
        if self.began is not None:
            self.ended_s = time.monotonic() - self.began

    def __call__(self, stop: threading.Event) -> None:
        while not self._begin.wait(0.2):
            if stop.is_set():
                return
        pending = list(self.events)
        next_sample = self.began
        netlink = Netlink()  # this thread's own sockets
        try:
            while True:
                now = time.monotonic()
                if now >= next_sample and self.ended_s is None:
                    self._sample(netlink, now - self.began)
                    next_sample = max(next_sample + SAMPLE_S, now)
                while pending and now >= self.began + pending[0].at_s:
                    self._apply(pending.pop(0), netlink)
                    now = time.monotonic()
                fine = self._watch_ports(now)
                due = min([next_sample] + [self.began + e.at_s for e in pending[:1]]
                          + ([fine] if fine is not None else []))
                if stop.wait(max(0.0, due - time.monotonic())):
                    return
        finally:
            self._stop_watch()
            netlink.close()

    def _sample(self, netlink: Netlink, at: float) -> None:
        counters = self.fabric.link_counters(self.host_ports, netlink)
        self.samples.append((round(at, 4), sum(c["tx_bytes"] for c in counters.values())))

    def _apply(self, event: FailureEvent, netlink: Netlink) -> None:
        self._stop_watch()  # the event before's: what follows is this one's
        at = time.monotonic() - self.began
        errors, steps = [], {}
        try:  # all of the event's links at once (a switch's: its every link)
            if event.action == "degrade":
                steps = self.fabric.set_rates(list(event.links), event.rate_factor, netlink)
            else:
                steps = self.fabric.set_links(list(event.links), event.action == "up", netlink)
        except (TestbedError, OSError) as err:
            errors.append(f"{event.target}: {err}")
        took = time.monotonic() - self.began - at
        self.applied.append({"at_s": event.at_s, "applied_s": round(at, 4),
                             "took_s": round(took, 4), "steps_s": steps,
                             "action": event.action, "target": event.target,
                             "links": len(event.links), "errors": errors})
        if event.action == "degrade":
            self.applied[-1]["rate_factor"] = event.rate_factor
        if event.action != "up" and not errors:
            self._start_watch(event, at)
        dropped = self._cut_drops(event, netlink)
        if event.action == "down":
            self._cut_base[event.target] = dropped
        elif dropped is not None and self._cut_base.get(event.target) is not None:
            self.applied[-1]["cut_drops"] = dropped - self._cut_base.pop(event.target)

    def _start_watch(self, event: FailureEvent, at: float) -> None:
        """Watch the bytes offered to the event's switch ports (each link's ends at switches:
        one per direction) from now, each against the rate its link has now (0: failed), and
        to the ports their switches could use instead (:func:`alternatives`)."""
        topo, rates, groups, ends, sizing = self.fabric.topo, {}, {}, [], {}
        factor = 0.0 if event.action == "down" else (event.rate_factor or 1.0)
        changed = {topo.find_link(a, b).name for a, b in event.links}
        for a, b in event.links:
            link = topo.find_link(a, b)
            for end in (link.a, link.b):
                if not topo.nodes[end.node].is_switch:
                    continue
                ends.append(end.ifname)
                rates[end.ifname] = link.rate_mbps * 1e6 / 8 * factor
                # a failed link's window sized by its rate as built: one packet per window
                # is then a quarter of what it carried, not more than all of it
                sizing[end.ifname] = rates[end.ifname] or link.rate_mbps * 1e6 / 8
                others = alternatives(topo, link, end.node)
                if others:
                    groups[end.ifname] = [o.ifname for o in others]
                    for o in others:
                        other = topo.link_at(o.node, o.port)
                        rates.setdefault(o.ifname, other.rate_mbps * 1e6 / 8 * (
                            factor if other.name in changed else 1.0))
        index = len(self.applied) - 1
        self._watch = (index, rates, at + FINE_SPAN_S)
        self._fine[index] = []
        self._groups[index] = groups
        # the largest packet offered so far to each port or its alternatives (kernel TCP's
        # segmentation-offload units pass the switches whole), at least a frame
        frame, largest = frame_bytes(self.fabric.spec.fabric.mtu), self._largest(set(rates))
        packet = {p: max([frame] + [largest.get(o, 0) for o in [p, *groups.get(p, [])]])
                  for p in ends}
        self._windows[index] = {p: move_window_s(sizing[p], packet[p]) for p in ends}
        self._packets[index] = packet
        self.applied[index]["move_off"] = {"rates_mbps": {p: round(rates[p] * 8 / 1e6, 3)
                                                          for p in sorted(ends)}}
        self._rates[index] = rates

    def _watch_ports(self, now: float) -> float | None:
        """One sample of the watched ports' offered bytes; when the next is due (None:
        nothing watched, or the span or the workload is over)."""
        if self._watch is None:
            return None
        index, rates, until = self._watch
        at = now - self.began
        if at > until or self.ended_s is not None:
            self._stop_watch()
            return None
        counts = self.fabric.offered_bytes(set(rates))
        if counts is None:  # no marker on this fabric: nothing to measure with
            self._stop_watch()
            return None
        self._fine[index].append((at, counts))
        return now + FINE_SAMPLE_S

    def _stop_watch(self) -> None:
        """The watch over: what the switches' fault notices did in its span, kept for the
        event (``notices``: ms after it, switch, group, the ports taken out; none: back)."""
        if self._watch is None:
            return
        index, _rates, until = self._watch
        self._watch = None
        try:
            found = self.fabric.switch_notices()
        except (TestbedError, OSError):
            return
        now, at = time.monotonic() - self.began, self.applied[index]["applied_s"]
        self._notices[index] = [
            {"ms": round((now - ago - at) * 1000, 1), "switch": name, "group": gid,
             "ports_out": list(ports)}
            for ago, name, gid, ports in sorted(found, key=lambda n: -n[0])
            if at <= now - ago <= until]

    def _move_off(self, index: int, item: dict) -> dict:
        """The event's time to move off per watched port (:func:`time_to_move_off`), in ms:
        by its share of its alternatives' traffic where it has some; over windows of at
        least four of its largest packets at the port's rate (``window_ms``, the resolution;
        ``packet_bytes``, that packet, at least a frame); and on average over 50 ms
        (``averaged_ms``, :func:`time_to_fit_on_average`)."""
        samples = self._fine.get(index) or []
        rates, groups = self._rates.get(index, {}), self._groups.get(index, {})
        doc = dict(item["move_off"])
        window = self._windows.get(index, {})
        doc["ms"], doc["window_ms"] = {}, {p: round(w * 1000, 1) for p, w in window.items()}
        doc["packet_bytes"] = self._packets.get(index, {})
        why = move_off_unmeasured([t for t, _ in samples], item["applied_s"],
                                  max(window.values(), default=MOVE_WINDOW_S))
        if why:
            doc["unmeasured"] = why
        for port in doc["rates_mbps"] if not why else ():
            series = [(t, c[port]) for t, c in samples if port in c]
            others = groups.get(port)
            sibling = None if not others else [
                (t, sum(c.get(o, 0) for o in others)) for t, c in samples]
            fit = (series, item["applied_s"], rates[port], doc["packet_bytes"][port])
            around = {"siblings": sibling,
                      "sibling_rate_bytes_s": sum(rates[o] for o in others or ())}
            for key, took in (("ms", time_to_move_off(*fit, window[port], **around)),
                              ("averaged_ms", time_to_fit_on_average(*fit, **around))):
                doc.setdefault(key, {})[port] = None if took is None else round(took * 1000, 1)
        for key in ("ms", "averaged_ms"):
            doc.setdefault(key, {}).update(
                {port: None for port in doc["rates_mbps"] if port not in doc[key]})
        doc["averaged_window_ms"] = round(MOVE_SETTLE_S * 1000, 1)
        if self.time_scale != 1:  # the real fabric's: its time and rates
            for key in ("ms", "averaged_ms"):
                doc[f"real_{key}"] = {p: None if v is None else round(v / self.time_scale, 4)
                                      for p, v in doc[key].items()}
            doc["real_rates_mbps"] = {p: round(v * self.time_scale, 3)
                                      for p, v in doc["rates_mbps"].items()}
            doc["real_window_ms"] = {p: round(v / self.time_scale, 4)
                                     for p, v in doc["window_ms"].items()}
        if groups:
            doc["alternatives"] = {p: list(o) for p, o in groups.items()}
        doc["samples"] = len(samples)
        return doc

    def _largest(self, names: set[str]) -> dict[str, int]:
        """Port -> the largest packet offered to it so far ({} where nothing says)."""
        try:
            return self.fabric.largest_packets(names)
        except (TestbedError, OSError):
            return {}

    def _cut_drops(self, event: FailureEvent, netlink: Netlink) -> int | None:
        """Frames the cuts of the event's links dropped so far, None without the cut
        program: a repair reports those of the outage it ends."""
        try:
            return self.fabric.cut_drops(list(event.links), netlink)
        except (TestbedError, OSError):
            return None

    def report(self) -> list[dict]:
        """What was applied so far (results.json's ``failures``), each with the delivered
        throughput before, during and after it (:func:`~testbed.plan.failplan.throughput_around`)."""
        samples = [s for s in self.samples if self.ended_s is None or s[0] <= self.ended_s]
        out = []
        for index, item in enumerate(self.applied):
            row = {**item, "throughput": throughput_around(samples, item["applied_s"])}
            if "move_off" in item:
                row["move_off"] = self._move_off(index, item)
            if self._notices.get(index):
                row["notices"] = self._notices[index]
            out.append(row)
        return out

    def port_samples(self) -> list[tuple[int, float, str, int]]:
        """Every sample of the watched ports' offered bytes, in event and time order:
        ``(event index, s since the workload began, port, cumulative bytes offered)``
        (``ports.csv``: what ``move_off`` was worked out from)."""
        return [(index, at, port, counts[port])
                for index in sorted(self._fine)
                for at, counts in self._fine[index] for port in sorted(counts)]


def set_links_of_running_fabric(registry, target: list[str], up: bool,
                                run_id: str | None = None, timings: dict | None = None) -> str:
    """Take a link (or every link of a switch) of a fabric that ``fabriclab up`` keeps running
    down or up: both ends, by netlink (a host's end in its namespace). The controller sees the
    port status as with any failure. Returns what was done; ``timings``, if given, gets the
    wall clock when the links' first step began (``began``) and each step's time after it
    (:func:`testbed.fabric.linkfail.set_links`).

    Raises:
        TestbedError: no running fabric (or several and no ``run_id``).
        ConfigError: a bad target.
    """
    record = registry.running(run_id)
    topo = record.topology()
    what, links = live_links(topo, target)
    done = f"{what} {'up' if up else 'down'} ({len(links)} link(s), run {record.run_id}"
    from testbed.cluster.remote import CLUSTER_FILE, set_links_of_running_cluster

    if (Path(record.run_dir) / CLUSTER_FILE).is_file():  # built by the machines of a cluster
        set_links_of_running_cluster(Path(record.run_dir), topo, list(links), up)
        return done + ", on its cluster's machines)"
    hosts = {p.kind.which: p.pid for p in record.processes if p.kind.is_host}
    def end(e) -> End:
        if topo.nodes[e.node].is_switch:
            return End(e.ifname, None, True, ovs.instance_db(record.run_dir, e.node))
        return End(e.ifname, hosts.get(topo.nic_owner(e.node)), False)

    pins = [Path(p) / "cut" for p in record.bpf_pins if (Path(p) / "cut").is_dir()]
    switches = [Path(p) / "switch" for p in record.bpf_pins if (Path(p) / "switch").is_dir()]
    cut = LinkCut(pins[0]) if pins else None
    netlink = Netlink()
    signal = None
    if switches:  # eBPF switches: not live in their maps at once, and their agent told
        from testbed.linux.ebpfswitch import set_live_pinned
        from testbed.switch.agent import tell_lost_signal

        def signal(ends: list[End], lost: bool) -> None:
            """The agent first (a datagram per end: it marks the ports, tells the controller
            and the switches' neighbours), then the maps, in case the agent is slow."""
            if not lost:
                return
            for e in ends:
                tell_lost_signal(Path(record.run_dir) / SWITCH_MGMT_DIR, e.ifname)
            for e in ends:
                set_live_pinned(switches[0], socket.if_nametoindex(e.ifname), False)
    try:
        pairs = [(end(topo.find_link(a, b).a), end(topo.find_link(a, b).b)) for a, b in links]
        began = time.time()
        steps = set_links(netlink, pairs, up, cut, signal)
        if timings is not None:
            timings.update(steps, began=began)
    finally:
        netlink.close()
        if cut is not None:
            cut.close()
    return done + ")"
