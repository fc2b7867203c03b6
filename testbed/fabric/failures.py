"""Link and switch failures, the adapter: :class:`FailureInjector` is a fabric service thread
that applies the planned events (:mod:`testbed.plan.failplan`) at their times, relative to the
workload's start, failing or repairing each link as :mod:`testbed.fabric.linkfail` does (the link is
cut, its switches see the loss of signal at once: the groups' watch ports drop dead buckets, the
controller gets the port status and reroutes; then the veths go down). It samples the throughput the fabric delivers to the hosts meanwhile and keeps a log of
what it applied and when, with the throughput before, during and after, for ``results.json``.
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
from testbed.plan.failplan import SAMPLE_S, FailureEvent, live_links, throughput_around
from testbed.fabric.linkfail import End, LinkCut, set_links
from testbed.linux.netlink import Netlink


class FailureInjector:
    """Applies failure events at their times after :meth:`begin`, sampling the throughput the
    fabric delivers to the hosts (its ports toward them) every ``SAMPLE_S`` until
    :meth:`finish`; a fabric service thread."""

    def __init__(self, fabric: FailureFabric, events: tuple[FailureEvent, ...]) -> None:
        self.fabric = fabric
        self.events = events
        self.began: float | None = None
        self.ended_s: float | None = None
        self._begin = threading.Event()
        self.applied: list[dict] = []
        self.samples: list[tuple[float, int]] = []  # (s since begin, bytes to the hosts)
        self._cut_base: dict[str, int | None] = {}  # a failed target -> cut drops before
        self.host_ports = {l.end(sw.name).ifname for sw in fabric.topo.switches
                           for l in fabric.topo.ports(sw.name).values()
                           if not fabric.topo.nodes[l.other(sw.name).node].is_switch}

    def begin(self) -> None:
        """The workload starts now: event times count from here."""
        self.began = time.monotonic()
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
                due = min([next_sample] + [self.began + e.at_s for e in pending[:1]])
                if stop.wait(max(0.0, due - time.monotonic())):
                    return
        finally:
            netlink.close()

    def _sample(self, netlink: Netlink, at: float) -> None:
        counters = self.fabric.link_counters(self.host_ports, netlink)
        self.samples.append((round(at, 4), sum(c["tx_bytes"] for c in counters.values())))

    def _apply(self, event: FailureEvent, netlink: Netlink) -> None:
        at = time.monotonic() - self.began
        errors, steps = [], {}
        try:  # all of the event's links at once (a switch's: its every link)
            steps = self.fabric.set_links(list(event.links), event.action == "up", netlink)
        except (TestbedError, OSError) as err:
            errors.append(f"{event.target}: {err}")
        took = time.monotonic() - self.began - at
        self.applied.append({"at_s": event.at_s, "applied_s": round(at, 4),
                             "took_s": round(took, 4), "steps_s": steps,
                             "action": event.action, "target": event.target,
                             "links": len(event.links), "errors": errors})
        dropped = self._cut_drops(event, netlink)
        if event.action == "down":
            self._cut_base[event.target] = dropped
        elif dropped is not None and self._cut_base.get(event.target) is not None:
            self.applied[-1]["cut_drops"] = dropped - self._cut_base.pop(event.target)

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
        return [{**item, "throughput": throughput_around(samples, item["applied_s"])}
                for item in self.applied]


def set_links_of_running_fabric(registry, target: list[str], up: bool,
                                run_id: str | None = None) -> str:
    """Take a link (or every link of a switch) of a fabric that ``fabriclab up`` keeps running
    down or up: both ends, by netlink (a host's end in its namespace). The controller sees the
    port status as with any failure. Returns what was done.

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
    if switches:  # eBPF switches: not live in their maps at once; the carrier tells their agent
        from testbed.linux.ebpfswitch import set_live_pinned

        def signal(end: End, lost: bool) -> None:
            if lost:
                set_live_pinned(switches[0], socket.if_nametoindex(end.ifname), False)
    try:
        set_links(netlink, [(end(topo.find_link(a, b).a), end(topo.find_link(a, b).b))
                            for a, b in links], up, cut, signal)
    finally:
        netlink.close()
        if cut is not None:
            cut.close()
    return done + ")"
