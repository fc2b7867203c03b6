"""The PFC agent: a fabric service that makes priorities lossless on a kernel without 802.1Qbb.

Every ``poll_s`` it reads the backlog of every switch port's lossless queues (one qdisc dump)
and, while some queue is over XOFF, the marker's per-priority arrival counters at the switch
ports' ingress; :class:`testbed.plan.pause.PauseState` decides, and the agent acts on the upstream
ports' lossless TBF leaves (:meth:`testbed.linux.netlink.Netlink.set_tbf`). After a resume it sends one
kick frame through the port: a qdisc only dequeues when something is enqueued or its timer
fires, and a paused TBF's timer is seconds away while the senders behind it are blocked. The
kick is a PFC frame with no priority enabled (a no-op to any receiver; the switches' table-miss
drops it), queued in HTB's direct queue (``SO_PRIORITY`` = the qdisc's handle) so it never waits.

The feeders of a queue are its switch's other ports, less those the controller's up-down
routing never forwards from into it (a packet that came down from a higher tier never goes back
up): a queue pauses only the ingress links whose packets can be in it.

What it measured (its reaction per pause, its CPU) and counted (pauses, paused time, watchdog
events, deadlocks) is read by :meth:`report` and by
:meth:`testbed.fabric.fabric.Fabric.congestion`.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from testbed.model.congestion import PfcThresholds
from testbed.linux.netlink import HTB_HANDLE, Netlink
from testbed.linux.rawnl import RawTc, in_netns
from testbed.plan.pause import Action, Feeder, PauseState
from testbed.plan.tcplan import ClassPlan, Shaping
from testbed.model.topology import Topology
from testbed.model.topology import feeds as can_feed

ETH_P_ALL = 0x0003
#: 802.1Qbb frame: MAC control (0x8808), opcode 0x0101, class-enable vector 0, eight times 0.
KICK_FRAME = (bytes.fromhex("0180c2000001") + bytes(6)
              + struct.pack("!HHH", 0x8808, 0x0101, 0) + bytes(16)).ljust(60, b"\0")
REACTIONS_KEPT = 10_000
KICK_TRIES = 3
MAX_ERRORS = 20


@dataclass(frozen=True)
class PortAccess:
    """What an agent of the switch ports reads and acts on: the model, each host's namespace,
    each link end's shaping plan, netlink, and the marker's counters."""

    topo: Topology
    pid: Callable[[str], int]  # a host's namespace (its process)
    shaping: Callable[..., Shaping]  # (link, host_end=False) -> the link end's plan
    netlink: Netlink
    marker: object  # testbed.fabric.ecn.Marker
    mtu: int


class PfcAgent:
    """Runs as :meth:`testbed.fabric.services.FabricRun.start_thread`'s target.

    Args:
        access: the ports it watches and pauses.
        thresholds: the resolved PFC settings.
    """

    def __init__(self, access: PortAccess, thresholds: PfcThresholds) -> None:
        self.access = access
        self.th = thresholds
        topo = access.topo
        feeders: dict[str, tuple[Feeder, ...]] = {}
        self.upstream: dict[str, tuple[int | None, Shaping]] = {}  # port -> (host pid, plan)
        for node in topo.switches:
            links = list(topo.ports(node.name).values())
            for link in links:
                feeds = []
                for other in links:
                    if not can_feed(topo, node.name, other, link):
                        continue
                    up = other.other(node.name)
                    host = up.node if not topo.nodes[up.node].is_switch else None
                    feeds.append(Feeder(other.end(node.name).ifname, up.ifname, host))
                    pid = access.pid(host) if host else None
                    self.upstream[up.ifname] = (pid, access.shaping(other, host_end=bool(host)))
                feeders[link.end(node.name).ifname] = tuple(feeds)
        self.ports = set(feeders)
        self.feeders = feeders
        self.state = PauseState(thresholds, feeders)
        # (upstream port, priority) -> (its namespace's pid, pause request, resume request)
        self.requests: dict[tuple[str, int], tuple[int | None, bytes, bytes]] = {}
        for port, (pid, plan) in self.upstream.items():
            index = access.netlink.index(port, pid)
            for prio in thresholds.priorities:
                cls = _class(plan, prio)
                self.requests[(port, prio)] = (
                    pid, RawTc.request(index, prio, plan.paused(cls)),
                    RawTc.request(index, prio, plan.running(cls)))
        self.lock = threading.Lock()
        self.reactions_s: list[float] = []  # per pause: previous sample -> change applied
        self.apply_s: list[float] = []  # per pause or resume: the netlink change alone
        self.samples = 0
        self.cpu_s = 0.0
        self.errors: list[str] = []
        self._kick: dict[str, socket.socket] = {}
        self.kicks_lost = 0
        self.started = time.monotonic()
        self._last_rx: dict[tuple[str, int], int] = {}

    # -- the loop -------------------------------------------------------------------------------
    def __call__(self, stop: threading.Event) -> None:
        cpu0 = time.thread_time()
        prev = time.monotonic()
        changer = RawTc()
        with Netlink() as nl:  # its own sockets: pyroute2 sockets are not shared across threads
            try:
                while not stop.wait(max(0.0, self.th.poll_s - (time.monotonic() - prev))):
                    now = time.monotonic()
                    backlog = {key: q["backlog_bytes"] for key, q in
                               nl.leaf_queues(self.ports, self.th.priorities).items()}
                    actions = self._decide(now, backlog)
                    with self.lock:
                        self.samples += 1
                        self.cpu_s = time.thread_time() - cpu0
                    for action in actions:
                        self._apply(changer, action, prev)
                    prev = now
            finally:
                with self.lock:
                    actions = self.state.close(time.monotonic())
                for action in actions:
                    try:
                        self._apply(changer, action, prev)
                    except Exception as err:  # the fabric is going down: its links may be gone
                        self.errors.append(f"releasing {action.port}: {err}")
                for sock in self._kick.values():
                    sock.close()
                self._kick.clear()
                changer.close()
                self.cpu_s = time.thread_time() - cpu0

    def _decide(self, now: float, backlog: dict[tuple[str, int], int]) -> list:
        """This sample's actions: pauses and resumes (with the arrival counters of the
        ingress ports that feed a queue over XOFF)."""
        arrived: set[tuple[str, int]] = set()
        hot = [k for k, v in backlog.items() if v >= self.th.xoff_bytes or k in self.state.xoff]
        if hot:  # the ingress counters of the ports that feed them
            rx = self.access.marker.arrivals({(f.ingress, prio) for port, prio in hot
                                              for f in self.feeders[port]})
            arrived = {k for k, n in rx.items() if n > self._last_rx.get(k, 0)}
            self._last_rx.update(rx)
        with self.lock:
            return self.state.step(now, backlog, arrived)

    def _apply(self, changer: RawTc, action: Action, sampled_at: float) -> None:
        pid, pause, resume = self.requests[(action.port, action.priority)]
        t0 = time.monotonic()
        changer.send(pid, pause if action.pause else resume,
                     f"{'pause' if action.pause else 'resume'} of {action.port} priority "
                     f"{action.priority}")
        if not action.pause:
            self._kick_port(action.port, pid)
        t1 = time.monotonic()
        with self.lock:
            if len(self.apply_s) < REACTIONS_KEPT:
                self.apply_s.append(t1 - t0)
            if action.pause and len(self.reactions_s) < REACTIONS_KEPT:
                self.reactions_s.append(t1 - sampled_at)

    def _kick_port(self, port: str, pid: int | None, frame: bytes = KICK_FRAME) -> None:
        sock = self._kick.get(port)
        if sock is None:
            if pid is None:
                sock = _kick_socket(port)
            else:
                with in_netns(f"/proc/{pid}/ns/net"):
                    sock = _kick_socket(port)
            self._kick[port] = sock
        for _ in range(KICK_TRIES):
            try:
                sock.send(frame)
                return
            except OSError as err:  # ENOBUFS: the port's egress dropped it (a full queue)
                failure = err
        with self.lock:
            self.kicks_lost += 1
            if len(self.errors) < MAX_ERRORS:
                self.errors.append(f"kick of {port} after a resume: {failure} ({KICK_TRIES} "
                                   "tries); the queue dequeues at its TBF's next timer")

    # -- what it saw ------------------------------------------------------------------------
    def counters(self) -> dict[tuple[str, int], dict]:
        """(port, priority) -> pause events, paused seconds, watchdog events, paused now."""
        with self.lock:
            return self.state.counters(time.monotonic())

    def report(self) -> dict:
        """The agent's own figures: thresholds, reaction (median, p99), CPU, and the deadlocks
        it saw (each cycle of ports with its priority, and when it was first seen, in seconds
        since the agent started)."""
        with self.lock:
            reactions, apply_s = sorted(self.reactions_s), sorted(self.apply_s)
            deadlocks = [{"priority": d["priority"], "ports": d["ports"],
                          "first_seen_s": round(d["first_seen"] - self.started, 3)}
                         for d in self.state.deadlocks()]
            samples = self.samples
        reaction = _quantiles(reactions)
        budget_ms = round(self.th.reaction_s * 1000, 3)
        warnings = []
        if reaction and reaction["p99"] > budget_ms:
            warnings.append(f"the agent's reaction p99 {reaction['p99']:.1f} ms exceeded the "
                            f"{budget_ms:g} ms the headroom was sized for: lossless only while "
                            "the feeders' in-flight data fit anyway (a slower machine or guest "
                            "needs a larger fabric.pfc.headroom_kb or poll_ms)")
        return {"thresholds": self.th.describe(),
                "samples": samples,
                "reaction_ms": reaction,
                "reaction_budget_ms": budget_ms,
                "warnings": warnings,
                "change_ms": _quantiles(apply_s),
                "cpu_s": round(self.cpu_s, 3),
                "kicks_lost": self.kicks_lost,
                "deadlocks": deadlocks,
                "errors": list(self.errors)}


def _class(plan: Shaping, priority: int) -> ClassPlan:
    for cls in plan.classes:
        if cls.priority == priority:
            return cls
    raise KeyError(f"no class for priority {priority}")


def _kick_socket(port: str) -> socket.socket:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY, HTB_HANDLE)  # HTB's direct queue
    sock.bind((port, 0))
    return sock


def _quantiles(values: list[float]) -> dict | None:
    if not values:
        return None
    at = lambda q: values[min(len(values) - 1, max(0, int(round(q * len(values))) - 1))]  # noqa
    return {"count": len(values), "median": round(at(0.5) * 1000, 3),
            "p99": round(at(0.99) * 1000, 3), "max": round(values[-1] * 1000, 3)}

