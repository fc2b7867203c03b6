"""The run's monitor (adapter): every second, the machine's CPU, each vswitchd's CPU and every
switch port's counters (bytes sent, backlog, drops, ECN marks, PFC pauses) while a workload
runs. :func:`testbed.fidelity.judge_fidelity` gives the fidelity verdict; :meth:`timeline` is
the run directory's ``timeline.json`` (the report's heatmaps and queue timelines)."""

from __future__ import annotations

import threading
import time

from testbed import cpu
from testbed.congestion import frame_bytes
from testbed.fidelity import FidelitySample, judge_fidelity
from testbed.netlink import Netlink

DEFAULT_INTERVAL_S = 1.0
PORT_FIELDS = ("sent_bytes", "backlog_bytes", "drops", "ecn_marked", "pfc_pauses")


class FidelityMonitor:
    """Runs as :meth:`testbed.fabric.Fabric.start_thread`'s target.

    Args:
        fabric: the running fabric.
        interval_s: time between samples.
    """

    def __init__(self, fabric, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.fabric = fabric
        self.interval_s = interval_s
        self.samples: list[FidelitySample] = []
        self.rows: list[dict] = []  # the timeline's samples
        self.lock = threading.Lock()
        self.started = time.monotonic()
        self.vswitchds = fabric.vswitchd_pids()
        ports = fabric.switch_ports()
        self.ports: dict[str, dict] = {}
        for link in fabric.topo.links:
            for end in (link.a, link.b):
                if end.ifname in ports:
                    node, peer = fabric.topo.nodes[end.node], fabric.topo.nodes[link.other(
                        end.node).node]
                    self.ports[end.ifname] = {"node": node.name, "peer": peer.name,
                                              "link": link.name,
                                              "tier": f"{node.role}->{peer.role}",
                                              "rate_bps": link.rate_mbps * 1e6}

    def __call__(self, stop: threading.Event) -> None:
        names = {pid: name for name, pid in self.vswitchds.items()}
        with Netlink() as nl:  # its own socket: pyroute2 sockets are not shared across threads
            last = cpu.sample(list(names))
            while True:
                counters, paused = {}, {}
                for name, port in self.fabric.congestion(nl).items():
                    if name not in self.ports:
                        continue
                    q = port.get("queue", {})
                    prios = (port.get("priorities") or {}).values()
                    counters[name] = (q.get("bytes", 0), q.get("backlog_bytes", 0),
                                      q.get("drops", 0),
                                      sum(p.get("marked", 0) for p in prios),
                                      sum((p.get("pfc") or {}).get("pause_events", 0)
                                          for p in prios))
                    paused[name] = sum((p.get("pfc") or {}).get("paused_s", 0.0) for p in prios)
                now = cpu.sample(list(names))
                use = cpu.usage(last, now) if self.samples else None
                last = now
                t = time.monotonic()
                vsw = {names[pid]: pct for pid, pct in (use.proc_pct if use else {}).items()}
                with self.lock:
                    self.samples.append(FidelitySample(
                        t, use.idle_pct if use else None, vsw,
                        {n: (c[0], c[1]) for n, c in counters.items()}, paused))
                    self.rows.append({"t_s": round(t - self.started, 3),
                                      "idle_pct": None if use is None else round(use.idle_pct, 1),
                                      "vswitchd_pct": {k: round(v, 1) for k, v in vsw.items()},
                                      "ports": {n: list(c) for n, c in counters.items()}})
                if stop.wait(self.interval_s):
                    return

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
                "ports": self.ports, "samples": rows}
