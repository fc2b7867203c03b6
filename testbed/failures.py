"""Link and switch failures during a workload: the experiment file's ``failures`` section.

:func:`plan_failures` (pure) turns the section into :class:`FailureEvent` s checked against the
model: which links each event takes down or brings up. :class:`FailureInjector` (the adapter) is
a fabric service thread that applies them at their times, relative to the workload's start, by
setting both ends of each link down or up (the switches' ports go down, the controller sees
the port status and reroutes, the groups' watch ports drop dead buckets at once), and keeps a
log of what it applied and when, for ``results.json``.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from testbed.errors import ConfigError, TestbedError
from testbed.topology import Topology


@dataclass(frozen=True)
class FailureEvent:
    """One failure or repair: ``links`` (node pairs) go ``down`` or ``up`` at ``at_s``."""

    at_s: float
    action: str  # "down" or "up"
    target: str  # "link agg1_1-core1" or "switch core1"
    links: tuple[tuple[str, str], ...]


def plan_failures(topo: Topology, raw: list[dict]) -> tuple[FailureEvent, ...]:
    """The events of a (schema-checked) ``failures`` section, in time order.

    Raises:
        ConfigError: an unknown node, a pair that is no link, or a host given as a switch,
            naming the field.
    """
    events = []
    for i, item in enumerate(raw):
        where = f"failures[{i}]"
        if "link" in item:
            a, b = item["link"]
            for j, node in enumerate((a, b)):
                if node not in topo.nodes:
                    raise ConfigError(f"{where}.link[{j}]", f"no node {node!r} in the fabric")
            try:
                topo.find_link(a, b)
            except (KeyError, ValueError):
                raise ConfigError(f"{where}.link", f"{a} and {b} share no link") from None
            events.append(FailureEvent(float(item["at_s"]), item["action"], f"link {a}-{b}",
                                       ((a, b),)))
        else:
            name = item["switch"]
            node = topo.nodes.get(name)
            if node is None or not node.is_switch:
                raise ConfigError(f"{where}.switch", f"no switch {name!r} in the fabric")
            links = tuple((name, link.other(name).node) for link in topo.ports(name).values())
            events.append(FailureEvent(float(item["at_s"]), item["action"], f"switch {name}",
                                       links))
    return tuple(sorted(events, key=lambda e: e.at_s))


class FailureInjector:
    """Applies failure events at their times after :meth:`begin`; a fabric service thread."""

    def __init__(self, fabric, events: tuple[FailureEvent, ...]) -> None:
        self.fabric = fabric
        self.events = events
        self.began: float | None = None
        self._begin = threading.Event()
        self.applied: list[dict] = []

    def begin(self) -> None:
        """The workload starts now: event times count from here."""
        self.began = time.monotonic()
        self._begin.set()

    def __call__(self, stop: threading.Event) -> None:
        while not self._begin.wait(0.2):
            if stop.is_set():
                return
        for event in self.events:
            if stop.wait(max(0.0, self.began + event.at_s - time.monotonic())):
                return
            at = time.monotonic() - self.began
            errors = []
            for a, b in event.links:
                try:
                    self.fabric.set_link(a, b, event.action == "up")
                except (TestbedError, OSError) as err:
                    errors.append(f"{a}-{b}: {err}")
            took = time.monotonic() - self.began - at
            self.applied.append({"at_s": event.at_s, "applied_s": round(at, 4),
                                 "took_s": round(took, 4), "action": event.action,
                                 "target": event.target, "links": len(event.links),
                                 "errors": errors})

    def report(self) -> list[dict]:
        """What was applied so far (results.json's ``failures``)."""
        return list(self.applied)


def live_links(topo: Topology, target: list[str]) -> tuple[str, tuple[tuple[str, str], ...]]:
    """``[node, node]`` (a link) or ``[switch]`` (all its links) as a target and node pairs.

    Raises:
        ConfigError: naming ``target`` for an unknown node, no link, or a host alone.
    """
    if len(target) == 2:
        a, b = target
        for node in (a, b):
            if node not in topo.nodes:
                raise ConfigError("target", f"no node {node!r} in the running fabric")
        try:
            topo.find_link(a, b)
        except KeyError:
            raise ConfigError("target", f"{a} and {b} share no link") from None
        return f"link {a}-{b}", ((a, b),)
    if len(target) == 1:
        name = target[0]
        node = topo.nodes.get(name)
        if node is None or not node.is_switch:
            raise ConfigError("target", f"no switch {name!r} in the running fabric")
        return f"switch {name}", tuple((name, l.other(name).node)
                                       for l in topo.ports(name).values())
    raise ConfigError("target", "give two nodes (a link) or one switch")


def set_links_of_running_fabric(registry, target: list[str], up: bool,
                                run_id: str | None = None) -> str:
    """Take a link (or every link of a switch) of a fabric that ``fabriclab up`` keeps running
    down or up: both ends, by netlink (a host's end in its namespace). The controller sees the
    port status as with any failure. Returns what was done.

    Raises:
        TestbedError: no running fabric (or several and no ``run_id``).
        ConfigError: a bad target.
    """
    from testbed.netlink import Netlink  # an adapter: only when a running fabric is acted on
    from testbed.topology import from_dict

    record = registry.running(run_id)
    topo = from_dict(json.loads((Path(record.run_dir) / "topology.json").read_text()))
    what, links = live_links(topo, target)
    hosts = {p.role.removeprefix("host:"): p.pid for p in record.processes
             if p.role.startswith("host:")}
    netlink = Netlink()
    try:
        for a, b in links:
            link = topo.find_link(a, b)
            for end in (link.a, link.b):
                pid = None if topo.nodes[end.node].is_switch else hosts.get(end.node)
                netlink.set_state(end.ifname, up, pid=pid)
    finally:
        netlink.close()
    return f"{what} {'up' if up else 'down'} ({len(links)} link(s), run {record.run_id})"
