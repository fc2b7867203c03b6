"""The run's fidelity monitor (adapter): samples the machine's CPU, each vswitchd's CPU and every
switch port's counters while a workload runs; :func:`testbed.fidelity.judge_fidelity` gives the
verdict."""

from __future__ import annotations

import threading
import time

from testbed import cpu, ovs
from testbed.fidelity import FidelitySample, judge_fidelity
from testbed.netlink import Netlink
from testbed.congestion import frame_bytes

DEFAULT_INTERVAL_S = 1.0


class FidelityMonitor:
    """Runs as :meth:`testbed.fabric.Fabric.start_thread`'s target.

    Args:
        fabric: the running fabric.
        interval_s: time between samples.
    """

    def __init__(self, fabric, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.fabric = fabric
        self.interval_s = interval_s
        self.ports = fabric.switch_ports()
        self.samples: list[FidelitySample] = []
        self.lock = threading.Lock()
        if fabric.instances:
            self.vswitchds = {inst.name: inst.pids["ovs-vswitchd"] for inst in fabric.instances}
        else:
            self.vswitchds = {f"system{i}": pid for i, pid in enumerate(ovs.vswitchd_pids())}
        self.rates = {}
        for link in fabric.topo.links:
            for end in (link.a, link.b):
                if end.ifname in self.ports:
                    self.rates[end.ifname] = link.rate_mbps * 1e6

    def __call__(self, stop: threading.Event) -> None:
        names = {pid: name for name, pid in self.vswitchds.items()}
        with Netlink() as nl:  # its own socket: pyroute2 sockets are not shared across threads
            last = cpu.sample(list(names))
            while True:
                ports: dict[str, list[int]] = {}
                for (name, _prio), q in nl.leaf_queues(self.ports).items():
                    port = ports.setdefault(name, [0, 0])
                    port[0] += q["bytes"]
                    port[1] += q["backlog_bytes"]
                now = cpu.sample(list(names))
                use = cpu.usage(last, now) if self.samples else None
                last = now
                with self.lock:
                    self.samples.append(FidelitySample(
                        time.monotonic(), use.idle_pct if use else None,
                        {names[pid]: pct for pid, pct in (use.proc_pct if use else {}).items()},
                        {n: (v[0], v[1]) for n, v in ports.items()}))
                if stop.wait(self.interval_s):
                    return

    def report(self) -> dict:
        """The verdict so far (``results.json``'s ``fidelity``)."""
        with self.lock:
            samples = list(self.samples)
        return judge_fidelity(samples, self.rates, frame_bytes(self.fabric.spec.fabric.mtu))
