"""Queue sampler: a fabric service that reads every switch port's real backlog (one netlink
dump; summed over the port's priority classes) and, with the ECN marker, its virtual backlog at the same instant, every ``interval_s``.
The samples give a run's queue max and p99 and the virtual queue's drift from the real one.
"""

from __future__ import annotations

import threading

from testbed.netlink import Netlink

DEFAULT_INTERVAL_S = 0.05


class QueueSampler:
    """Samples while running as :meth:`testbed.fabric.Fabric.start_thread`'s target.

    Args:
        fabric: the running fabric.
        interval_s: time between samples.
    """

    def __init__(self, fabric, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.fabric = fabric
        self.interval_s = interval_s
        self.ports = fabric.switch_ports()
        self.samples: dict[str, list[tuple[int, int | None]]] = {p: [] for p in self.ports}
        self.lock = threading.Lock()

    def __call__(self, stop: threading.Event) -> None:
        with Netlink() as nl:  # its own socket: pyroute2 sockets are not shared across threads
            while not stop.wait(self.interval_s):
                real: dict[str, int] = {}
                for (name, _prio), q in nl.leaf_queues(self.ports).items():
                    real[name] = real.get(name, 0) + q["backlog_bytes"]
                marker = self.fabric.marker
                virtual = marker.queues() if marker is not None else {}
                with self.lock:
                    for name, backlog in real.items():
                        vq = virtual.get(name)
                        self.samples[name].append((backlog, vq[0] if vq is not None else None))

    def snapshot(self) -> dict[str, list[tuple[int, int | None]]]:
        """A copy of every sample so far."""
        with self.lock:
            return {port: list(values) for port, values in self.samples.items()}
