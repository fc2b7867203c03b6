"""The run's monitor (adapter), one thread with one netlink dump per tick while a workload runs:

- every ``queue_interval_s`` (``emulator.queue_sample_ms``, 50 ms), every switch port's real
  backlog (summed over its priority classes) and, with the ECN marker, its virtual backlog at
  the same instant: the run's queue max and p99 and the virtual queue's drift from the real
  one (:meth:`RunMonitor.snapshot`);
- every ``interval_s`` (1 s), also the machine's CPU, each vswitchd's CPU and every switch
  port's counters (bytes sent, backlog, drops, ECN marks, PFC pauses):
  :func:`testbed.plan.fidelity.judge_fidelity` gives the fidelity verdict; :meth:`RunMonitor.timeline`
  is the run directory's ``timeline.json`` (the report's heatmaps and queue timelines).
"""

from __future__ import annotations

import threading
import time

from testbed.linux import cpu
from testbed.model.congestion import frame_bytes
from testbed.plan.fidelity import FidelitySample, judge_fidelity
from testbed.linux.netlink import Netlink

DEFAULT_INTERVAL_S = 1.0
DEFAULT_QUEUE_INTERVAL_S = 0.05
PORT_FIELDS = ("sent_bytes", "backlog_bytes", "drops", "ecn_marked", "pfc_pauses")


class RunMonitor:
    """Runs as :meth:`testbed.fabric.fabric.Fabric.start_thread`'s target.

    Args:
        fabric: the running fabric.
        interval_s: time between CPU and counter samples.
        queue_interval_s: time between backlog samples (0: none).
    """

    def __init__(self, fabric, interval_s: float = DEFAULT_INTERVAL_S,
                 queue_interval_s: float = DEFAULT_QUEUE_INTERVAL_S) -> None:
        self.fabric = fabric
        self.interval_s = interval_s
        self.queue_interval_s = queue_interval_s
        self.samples: list[FidelitySample] = []
        self.rows: list[dict] = []  # the timeline's samples
        self.lock = threading.Lock()
        self.started = time.monotonic()
        self.started_unix_s = time.time()  # the samples' t_s = 0 on the wall clock
        self.vswitchds = fabric.vswitchd_pids()
        ports = fabric.switch_ports()
        self.ports: dict[str, dict] = {}
        topo = fabric.topo
        role = lambda name: topo.nodes[name].role if name in topo.nodes else "nvswitch"  # noqa
        for link in (*topo.links, *topo.scale_up):
            for end in (link.a, link.b):
                if end.ifname in ports:
                    peer = link.other(end.node).node
                    self.ports[end.ifname] = {"node": end.node, "peer": peer,
                                              "link": link.name,
                                              "tier": f"{role(end.node)}->{role(peer)}",
                                              "rate_bps": link.rate_mbps * 1e6}
        self.queues: dict[str, list[tuple[int, int | None]]] = {p: [] for p in self.ports}
        self._port_names = set(self.ports)
        self._names = {pid: name for name, pid in self.vswitchds.items()}
        self._least: dict[str, int] = {}  # per port, the least backlog since the last reading
        self._last_cpu = None

    def __call__(self, stop: threading.Event) -> None:
        tick = min(self.interval_s, self.queue_interval_s or self.interval_s)
        with Netlink() as nl:  # its own socket: pyroute2 sockets are not shared across threads
            self._sample(nl)
            due = time.monotonic() + self.interval_s
            while not stop.wait(tick):
                if time.monotonic() >= due - tick / 2:
                    self._sample(nl)
                    due = max(due + self.interval_s, time.monotonic() + self.interval_s / 2)
                elif self.queue_interval_s:
                    self._sample_queues(nl)

    def _sample_queues(self, nl: Netlink) -> None:
        real: dict[str, int] = {}
        for (name, _prio), q in nl.leaf_queues(self._port_names).items():
            real[name] = real.get(name, 0) + q["backlog_bytes"]
        marker = self.fabric.marker
        self._add_queues(real, marker.queues() if marker is not None else {})

    def _add_queues(self, real: dict[str, int], virtual: dict) -> None:
        with self.lock:
            for name, backlog in real.items():
                vq = virtual.get(name)
                self.queues[name].append((backlog, vq[0] if vq is not None else None))
                self._least[name] = min(backlog, self._least.get(name, backlog))

    def _sample(self, nl: Netlink) -> None:
        """CPU and counters, and the backlogs from the same dump."""
        counters, paused, real, virtual = {}, {}, {}, {}
        for name, port in self.fabric.congestion(nl).items():
            if name not in self.ports:
                continue
            q = port.get("queue", {})
            prios = (port.get("priorities") or {}).values()
            counters[name] = (q.get("bytes", 0), q.get("backlog_bytes", 0), q.get("drops", 0),
                              sum(p.get("marked", 0) for p in prios),
                              sum((p.get("pfc") or {}).get("pause_events", 0) for p in prios))
            # told to stop: paused by PFC, or stalled on credit (CBFC)
            paused[name] = sum((p.get("pfc") or {}).get("paused_s", 0.0)
                               + (p.get("pfc") or {}).get("stalled_s", 0.0) for p in prios)
            if "queue" in port:
                real[name] = q.get("backlog_bytes", 0)
            if "virtual_queue" in port:
                virtual[name] = (port["virtual_queue"]["backlog_bytes"], None)
        if self.queue_interval_s:
            self._add_queues(real, virtual)
        now = cpu.sample(list(self._names))
        use = cpu.usage(self._last_cpu, now) if self._last_cpu is not None else None
        self._last_cpu = now
        t = time.monotonic()
        vsw = {self._names[pid]: pct for pid, pct in (use.proc_pct if use else {}).items()}
        with self.lock:
            self.samples.append(FidelitySample(
                t, use.idle_pct if use else None, vsw,
                {n: (c[0], c[1]) for n, c in counters.items()}, paused, self._least,
                self.fabric.rate_factors()))
            self._least = {}
            self.rows.append({"t_s": round(t - self.started, 3),
                              "idle_pct": None if use is None else round(use.idle_pct, 1),
                              "vswitchd_pct": {k: round(v, 1) for k, v in vsw.items()},
                              "ports": {n: list(c) for n, c in counters.items()}})

    def snapshot(self) -> dict[str, list[tuple[int, int | None]]]:
        """Every port's backlog samples so far: (real bytes, virtual bytes or None)."""
        with self.lock:
            return {port: list(values) for port, values in self.queues.items()}

    def report(self) -> dict:
        """The verdict so far (``results.json``'s ``fidelity``)."""
        with self.lock:
            samples = list(self.samples)
        rates = {name: p["rate_bps"] for name, p in self.ports.items()}
        return judge_fidelity(samples, rates, frame_bytes(self.fabric.spec.fabric.mtu))

    def timeline(self) -> dict:
        """Every sample so far, cumulative port counters as :data:`PORT_FIELDS`."""
        with self.lock:
            rows = list(self.rows)
        return {"interval_s": self.interval_s, "fields": list(PORT_FIELDS),
                "started_unix_s": round(self.started_unix_s, 6), "ports": self.ports,
                "samples": rows}
