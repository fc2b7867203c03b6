"""Pure metric definitions: what the exporters expose, built from one reading of each source.

Names follow Prometheus's conventions as node_exporter does: one prefix ``fabriclab_``, base
units (bytes, seconds; rates in bytes per second), ``_total`` for counters, ``_timestamp_seconds``
for times, help text on every metric, identifiers in labels and never in names, no per-flow
labels, and every series a feature could have present from the start (at 0 where the feature
is off), so a dashboard shows 0 rather than nothing. Every builder takes a snapshot (plain dicts, as the fabric,
the runner and ``/proc`` hand them out) and returns prometheus-client metric families, so a
scrape reads each source once and nothing goes stale between scrapes. The adapters
(:mod:`telemetry.exporter`) take the readings; this module only shapes them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from traffic.measure.rows import CollectiveRow

PREFIX = "fabriclab"
PORT_LABELS = ("switch", "port", "peer", "tier")
PRIO_LABELS = (*PORT_LABELS, "priority")
COLLECTIVE_LABELS = ("workload_job", "label", "op", "transport", "routing")
#: Collective durations from a 64 KiB all-reduce at 100 Mbit/s to a long all-to-all at 3 Mbit/s.
DURATION_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500)
#: Transport counters of a collective's row (``results.json``) -> metric name and help.
TRANSPORT_COUNTERS = {
    "tx_bytes": ("transport_sent_bytes_total", "Payload bytes the transport sent "
                                                "(retransmissions included; TCP: TCP_INFO)."),
    "tx_packets": ("transport_sent_packets_total", "Packets the UDP transport sent (0 for TCP, "
                                                   "which counts segments, not packets)."),
    "tx_retransmitted": ("transport_retransmitted_packets_total",
                         "Packets the transport sent again (go-back-N, selective; TCP's "
                         "MSS-sized retransmissions)."),
    "tx_retransmitted_bytes": ("transport_retransmitted_bytes_total",
                               "Payload bytes the transport sent again."),
    "rx_out_of_order": ("transport_out_of_order_packets_total",
                        "Data packets that arrived out of order."),
    "tx_cnps": ("transport_cnps_total", "Congestion notification packets the senders "
                                        "received (rocev2)."),
    "tx_rate_cuts": ("transport_rate_cuts_total", "Rate or window cuts the senders made (the "
                                                  "UDP transports; TCP's are not counted)."),
    "tx_timeouts": ("transport_timeouts_total", "Retransmission timeouts (the UDP "
                                                "transports)."),
}


def name(metric: str) -> str:
    """``fabriclab_<metric>``."""
    return f"{PREFIX}_{metric}"


@dataclass(frozen=True)
class PortLabels:
    """Who a switch port is: its switch, port number, the node at the other end and the
    directed tier (``edge->agg``), and its configured rate."""

    switch: str
    port: str
    peer: str
    tier: str
    rate_bps: float

    def values(self) -> list[str]:
        return [self.switch, self.port, self.peer, self.tier]


def port_labels(topo) -> dict[str, PortLabels]:
    """Every switch port's interface name -> its labels, from the topology model."""
    out = {}
    for link in topo.links:
        for end in (link.a, link.b):
            node = topo.nodes[end.node]
            if not node.is_switch:
                continue
            peer = link.other(end.node)
            out[end.ifname] = PortLabels(end.node, str(end.port), peer.node,
                                         f"{node.role}->{topo.nodes[peer.node].role}",
                                         link.rate_mbps * 1e6)
    return out


#: every priority's series of a switch port: (family, name, help, where its value is: the sum
#: of (source, key) with source ``c`` the port priority's counters (the eBPF marker's), ``q``
#: its queue leaf's, ``p`` its flow-control agent's (PFC's pauses, or CBFC's credit stalls));
#: at 0 where its feature is off
PRIORITY_SERIES = {
    "drops": (CounterMetricFamily, "port_queue_dropped_packets", "Packets the port's egress "
              "queue dropped (tail drops of a full queue, by priority).", (("q", "drops"),)),
    "backlog": (GaugeMetricFamily, "port_queue_bytes", "Bytes queued at the port's egress "
                "now, by priority.", (("q", "backlog_bytes"),)),
    # the eBPF marker's marks, plus a RED leaf's where RED marks this priority
    "marked": (CounterMetricFamily, "port_ecn_marked_packets", "Packets the port marked CE, "
               "by priority.", (("c", "marked"), ("q", "marked"))),
    "loss": (CounterMetricFamily, "port_link_loss_dropped_packets", "Packets dropped by the "
             "link's configured random loss, by priority.", (("c", "loss_drops"),)),
    "trimmed": (CounterMetricFamily, "port_trimmed_packets", "Packets the port forwarded as "
                "their headers only (trimmed) instead of dropping or queueing them, by "
                "priority.", (("c", "trimmed"),)),
    "corrupted": (CounterMetricFamily, "port_corrupted_frames", "Frames the port sent "
                  "corrupted (the link's bit errors), by priority.", (("c", "corrupted"),)),
    "replayed": (CounterMetricFamily, "port_llr_replayed_frames", "Corrupted frames the port "
                 "replayed (link-level retry), by priority.", (("c", "llr_replays"),)),
    "bad_fcs": (CounterMetricFamily, "port_bad_fcs_dropped_packets", "Corrupted frames "
                "dropped on arrival at the port (a bad FCS), by priority.", (("c", "bad_fcs"),)),
    "pauses": (CounterMetricFamily, "port_pfc_pause_events", "PFC pauses the port received "
               "(its egress stopped), by priority.", (("p", "pause_events"),)),
    "paused": (CounterMetricFamily, "port_pfc_paused_seconds", "Time the port's egress was "
               "paused by PFC, by priority.", (("p", "paused_s"),)),
    "stalls": (CounterMetricFamily, "port_cbfc_stall_events", "Times the port ran out of "
               "credit (CBFC), by priority.", (("p", "stall_events"),)),
    "stalled": (CounterMetricFamily, "port_cbfc_stalled_seconds", "Time the port waited for "
                "credit (CBFC), by priority.", (("p", "stalled_s"),)),
}


def fabric_families(ports: dict[str, PortLabels], links: dict[str, dict],
                    congestion: dict[str, dict]) -> list[Metric]:
    """The switch ports' metrics from one reading.

    Args:
        ports: :func:`port_labels`.
        links: interface -> its kernel counters (``rx_bytes``, ``tx_packets``, ..., ``up``), one
            link dump.
        congestion: :meth:`testbed.fabric.fabric.Fabric.congestion` (the queues' leaves per priority,
            the marker's counters, the PFC agent's).
    """
    fam = {
        "tx_bytes": CounterMetricFamily(name("port_transmit_bytes"),
                                        "Bytes the switch port sent (kernel link counter).",
                                        labels=PORT_LABELS),
        "rx_bytes": CounterMetricFamily(name("port_receive_bytes"),
                                        "Bytes the switch port received (kernel link counter).",
                                        labels=PORT_LABELS),
        "tx_packets": CounterMetricFamily(name("port_transmit_packets"),
                                          "Packets the switch port sent.", labels=PORT_LABELS),
        "rx_packets": CounterMetricFamily(name("port_receive_packets"),
                                          "Packets the switch port received.",
                                          labels=PORT_LABELS),
    }
    up = GaugeMetricFamily(name("port_up"), "1 if the port's link is up (carrier), else 0.",
                           labels=PORT_LABELS)
    rate = GaugeMetricFamily(name("port_speed_bytes"), "The port's configured (shaped) rate, in "
                             "bytes per second.", labels=PORT_LABELS)
    per_prio = {key: cls(name(metric), text, labels=PRIO_LABELS)
                for key, (cls, metric, text, _) in PRIORITY_SERIES.items()}
    for ifname, who in sorted(ports.items()):
        labels = who.values()
        rate.add_metric(labels, who.rate_bps / 8)
        link = links.get(ifname)
        if link is not None:
            for key, family in fam.items():
                family.add_metric(labels, link[key])
            up.add_metric(labels, 1.0 if link.get("up", True) else 0.0)
        # every priority's series, at 0 where its feature (a marker, loss, PFC) is off
        priorities = congestion.get(ifname, {}).get("priorities") or {0: {}}
        for prio, counts in sorted(priorities.items()):
            plabels = [*labels, str(prio)]
            sources = {"c": counts, "q": counts.get("queue") or {}, "p": counts.get("pfc") or {}}
            for key, (*_, where) in PRIORITY_SERIES.items():
                per_prio[key].add_metric(plabels, sum(sources[src].get(k, 0) for src, k in where))
    return [*fam.values(), up, rate, *per_prio.values()]


def collective_families(rows: list[CollectiveRow], routing: str, running: Iterable[dict] = ()
                        ) -> list[Metric]:
    """The workload's metrics from the collectives measured so far (``results.json`` rows).

    Args:
        rows: every measured collective (cumulative: counters only grow).
        routing: the controller's routing mode (a label, for comparing runs).
        running: the collectives in progress (``job``, ``label``, ``op``, ``transport``,
            ``started_s`` on the epoch clock).
    """
    duration = Histogram(name("collective_duration_seconds"),
                          "Time from a collective's start to its last rank's end.",
                          COLLECTIVE_LABELS, DURATION_BUCKETS_S)
    busbw = GaugeMetricFamily(name("collective_busbw_bytes_per_second"),
                              "Bus bandwidth of the latest collective (NCCL-tests definition), "
                              "in bytes per second.", labels=COLLECTIVE_LABELS)
    algbw = GaugeMetricFamily(name("collective_algbw_bytes_per_second"),
                              "Algorithm bandwidth of the latest collective (bytes / time), in "
                              "bytes per second.", labels=COLLECTIVE_LABELS)
    efficiency = GaugeMetricFamily(name("collective_efficiency_ratio"),
                                   "Bus bandwidth of the latest collective over the link rate.",
                                   labels=COLLECTIVE_LABELS)
    transport = {key: CounterMetricFamily(name(metric.removesuffix("_total")), text,
                                          labels=COLLECTIVE_LABELS)
                 for key, (metric, text) in TRANSPORT_COUNTERS.items()}
    totals: dict[tuple, dict[str, float]] = {}
    latest: dict[tuple, dict] = {}
    running = list(running)
    for item in running:  # a transport's counters exist (at 0) from its start: rates then
        key = _running_key(item, routing)  # see the step when it ends
        totals.setdefault(key, dict.fromkeys(TRANSPORT_COUNTERS, 0))
    for row in rows:
        key = _collective_key(row, routing)
        duration.observe(key, row.time_us / 1e6)
        latest[key] = row
        sums = totals.setdefault(key, dict.fromkeys(TRANSPORT_COUNTERS, 0))
        for field in TRANSPORT_COUNTERS:
            if row.transport is not None:
                sums[field] = sums.get(field, 0) + row.transport.counter(field)
    for key, row in latest.items():
        busbw.add_metric(list(key), row.busbw_GBps * 1e9)
        algbw.add_metric(list(key), row.algbw_GBps * 1e9)
        efficiency.add_metric(list(key), row.efficiency or 0.0)
    for key, sums in totals.items():
        for field, value in sums.items():
            transport[field].add_metric(list(key), value)
    started = GaugeMetricFamily(name("collective_started_timestamp_seconds"),
                                "Start (Unix time) of each collective in progress.",
                                labels=COLLECTIVE_LABELS)
    for item in running:
        started.add_metric(list(_running_key(item, routing)), item["started_s"])
    return [duration.family(), busbw, algbw, efficiency, *transport.values(), started]


def _collective_key(row: CollectiveRow, routing: str) -> tuple[str, ...]:
    transport = row.transport.transport if row.transport else "tcp"  # TCP rows have none
    return (str(row.job), row.name, row.op, transport, routing)


def _running_key(item: dict, routing: str) -> tuple[str, ...]:
    """A collective in progress (:meth:`telemetry.exporter.WorkloadState.started`'s)."""
    return (str(item["job"]), item["label"] or item["op"], item["op"],
            str(item.get("transport") or "tcp"), routing)


class Histogram:
    """Observations kept as cumulative bucket counts per label set, as a histogram family."""

    def __init__(self, metric: str, text: str, labels: tuple[str, ...],
                 buckets: tuple[float, ...]) -> None:
        self.metric, self.text, self.labels, self.buckets = metric, text, labels, buckets
        self.series: dict[tuple, tuple[list[int], float]] = {}

    def observe(self, key: tuple, value: float) -> None:
        counts, total = self.series.setdefault(key, ([0] * (len(self.buckets) + 1), 0.0))
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                counts[i] += 1
        counts[-1] += 1
        self.series[key] = (counts, total + value)

    def family(self) -> HistogramMetricFamily:
        fam = HistogramMetricFamily(self.metric, self.text, labels=self.labels)
        series = self.series or ({(): ([0] * (len(self.buckets) + 1), 0.0)} if not self.labels
                                 else {})  # an unlabelled histogram exists from the start
        for key, (counts, total) in series.items():
            bounds = [*(f"{b:g}" for b in self.buckets), "+Inf"]
            fam.add_metric(list(key), list(zip(bounds, counts)), total)
        return fam


def build_info(version: str, python: str) -> Metric:
    """``fabriclab_build_info``: which fabriclab (and Python) an exporter runs, always 1."""
    info = GaugeMetricFamily(name("build_info"), "The fabriclab version and the Python running "
                             "this exporter (the value is always 1).",
                             labels=("version", "python_version"))
    info.add_metric([version, python], 1.0)
    return info


def fidelity_families(machines: dict[str, dict]) -> list[Metric]:
    """The emulator's own load: is a machine, not the network, deciding the result?

    Args:
        machines: per machine (one, or each of a cluster), ``cpu``: its CPU seconds by mode
            (``/proc/stat``: ``user``, ``system``, ``idle``, ...) summed over its cores,
            ``cores``, ``vswitchd``: each of its Open vSwitch daemons' CPU seconds, and
            ``vswitchd_switches``: the switches each serves (comma-separated names).
    """
    machine = CounterMetricFamily(name("machine_cpu_seconds"), "The machine's CPU time by "
                                  "mode, over all cores (/proc/stat).",
                                  labels=("machine", "mode"))
    count = GaugeMetricFamily(name("machine_cpu_cores"), "The machine's cores.",
                              labels=("machine",))
    vswitchd = CounterMetricFamily(name("vswitchd_cpu_seconds"), "CPU time of each Open "
                                   "vSwitch daemon (user and system), with the switches it "
                                   "serves.", labels=("machine", "vswitchd", "switches"))
    for host, data in sorted(machines.items()):
        for mode, seconds in sorted(data["cpu"].items()):
            machine.add_metric([host, mode], seconds)
        count.add_metric([host], data["cores"])
        serving = data.get("vswitchd_switches", {})
        for instance, seconds in sorted(data["vswitchd"].items()):
            vswitchd.add_metric([host, instance, serving.get(instance, "")], seconds)
    return [machine, count, vswitchd]


#: Stats-poll round times: from a few milliseconds to several poll intervals.
POLL_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


def poll_histogram() -> Histogram:
    """The controller's statistics-round times (it observes each completed round)."""
    return Histogram(name("controller_stats_poll_seconds"), "Time of a statistics round, from "
                     "the requests to the last flow-stats reply (adaptive routing).", (),
                     POLL_BUCKETS_S)


def controller_families(stats: dict, poll: Histogram) -> list[Metric]:
    """The controller's activity from its counters.

    Args:
        stats: ``switches_expected``, ``connected`` and ``programmed`` (counts), ``ops`` (kind
            -> OpenFlow operations sent: ``flow_add``, ``group_mod``, ...), ``port_events``,
            ``reroutes`` (port events that changed forwarding), ``links_down``,
            ``placements`` and ``moves`` (adaptive elephants). The process's CPU is the
            standard ``process_cpu_seconds_total`` every exporter serves.
        poll: :func:`poll_histogram`, observed by the controller.
    """
    switches = GaugeMetricFamily(name("controller_switches"), "Switches by state (expected, "
                                 "connected, programmed).", labels=("state",))
    for state in ("expected", "connected", "programmed"):
        switches.add_metric([state], stats.get(f"switches_{state}", stats.get(state, 0)))
    ops = CounterMetricFamily(name("controller_openflow_operations"), "OpenFlow operations "
                              "sent to the switches, by kind.", labels=("kind",))
    for kind, count in sorted(stats.get("ops", {}).items()):
        ops.add_metric([kind], count)
    events = CounterMetricFamily(name("controller_port_events"), "Port status events from the "
                                 "switches (link down or up).", value=stats.get("port_events", 0))
    reroutes = CounterMetricFamily(name("controller_reroutes"), "Port events that changed "
                                   "forwarding (paths recomputed around a failure or back).",
                                   value=stats.get("reroutes", 0))
    down = GaugeMetricFamily(name("controller_links_down"), "Fabric links the controller sees "
                             "down.", value=stats.get("links_down", 0))
    placed = CounterMetricFamily(name("controller_elephants_placed"), "Elephant flows placed "
                                 "on a path (adaptive routing).", value=stats.get("placements", 0))
    moved = CounterMetricFamily(name("controller_elephants_moved"), "Placed elephants moved to "
                                "another path (adaptive routing).", value=stats.get("moves", 0))
    return [switches, ops, events, reroutes, down, poll.family(), placed, moved]
