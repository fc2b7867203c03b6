"""What a fabric's switch ports do beyond forwarding, on this machine: the ECN marker (an eBPF
program at every switch port's egress: marking, steering into traffic classes, counting; at
host NICs, steering), the link-cut program a failure cuts a link with, and the PFC or CBFC
agent that makes priorities lossless; their counters read as one congestion document.

:class:`PortServices` is a part of :class:`testbed.fabric.fabric.Fabric`."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from testbed.errors import TestbedError
from testbed.fabric.cbfc import CbfcAgent
from testbed.fabric.ecn import Marker, PortMarking
from testbed.fabric.linkfail import End, LinkCut, set_links
from testbed.fabric.pfc import PfcAgent, PortAccess
from testbed.fabric.services import FabricRun
from testbed.fabric.switches import Switches
from testbed.linux import ovs, packages
from testbed.linux.netlink import Netlink
from testbed.model.congestion import frame_bytes
from testbed.model.share import LocalShare
from testbed.model.spec import TestbedSpec
from testbed.model.topology import Link
from testbed.plan.portplan import marker_thresholds


class PortServices:
    """The marker, the link cut and the lossless agent of the ports built here.

    Args:
        spec: the fabric's settings.
        share: what of the fabric is built here.
        run: the fabric's run (pins, services).
        netlink: the build's netlink socket.
        pid: a host's namespace (its process).
        shaping: a link end's tc plan, ``(link, host_end=False)``.
        switches: the switches here, told of a link's loss of signal.
        warnings: where what the build could not do as asked is said.
    """

    def __init__(self, spec: TestbedSpec, share: LocalShare, run: FabricRun, netlink: Netlink,
                 pid: Callable[[str], int], shaping: Callable, switches: Switches,
                 warnings: list[str]) -> None:
        self.spec, self.share, self.run = spec, share, run
        self.netlink = netlink
        self.pid = pid
        self.shaping = shaping
        self.rate_factors: dict[str, float] = {}  # a degraded link's switch port -> its factor
        self.switches = switches
        self.warnings = warnings
        self.marker: Marker | None = None
        self.cut: LinkCut | None = None
        self.pfc_agent: PfcAgent | None = None
        self._index: dict[str, int] = {}  # a root-namespace port's interface index

    # -- the build -----------------------------------------------------------------------------
    def attach_markers(self) -> None:
        """The eBPF marker at the egress of every switch port, with its link tier's marking,
        steering packets into per-priority classes where there are some (and at host NICs);
        with PFC, its arrival counter at every switch port's ingress."""
        self.marker = Marker(self.run.registry.state_dir, self.run.pin_dir())
        spec, fab = self.spec, self.spec.fabric
        table = tuple(fab.traffic_classes.table())
        pfc = spec.pfc is not None
        credits = spec.pfc.priorities if pfc and spec.pfc.mode == "cbfc" else ()
        for link in self.share.local_links():
            plan = self.shaping(link)
            limit = plan.queue_limit if plan.queue_kind == "bfifo" else 0  # bytes only
            loss = fab.link(link.tier).loss_percent
            impair = fab.link(link.tier).impair
            marking = PortMarking(
                link.rate_mbps, plan.burst_bytes, limit, table,
                marker_thresholds(spec, link, plan), classes=bool(plan.classes),
                loss_percent=loss, trim=spec.port_trim(link.tier), impair=impair,
                cbfc_priorities=credits)
            for ifname in self.share.root_ends(link):
                self.marker.attach(self.netlink, ifname, marking,
                                   count_rx=pfc or impair is not None)
            if link.tier == "host" and (plan.classes or loss or impair):
                host = link.a.node
                self.marker.classify_host(self.netlink, host, self.pid(host), link.a.ifname,
                                          table, bool(plan.classes), loss, impair)

    def load_cut(self, failable: bool) -> None:
        """Load the program a link failure cuts the link with (:mod:`testbed.fabric.linkfail`)
        when failures are planned or may be asked for (``failable``: ``fabriclab fail``), or
        the eBPF toolchain is here anyway; without it a failure takes the veths down alone,
        later to show."""
        if not (self.spec.plans_failures() or failable) and \
                packages.missing(packages.EBPF_TOOLCHAIN):
            self.run.log("link cuts: not loaded (no failure planned, no eBPF toolchain here)")
            return
        if not ovs.has_ovsdb_client():  # a failure tells the switches through it: imported now
            self.warnings.append("no Open vSwitch Python library (apt-get install "
                                 "python3-openvswitch): a failure tells the switches through "
                                 "ovs-vsctl, about 10 ms slower")
        try:
            self.cut = LinkCut(self.run.pin_dir() / "cut", self.run.registry.state_dir)
        except TestbedError as err:
            self.warnings.append(f"link failures take the veths down only, which the switches "
                                 f"see 10-80 ms late: {err}")

    def start_lossless(self, datapath: str) -> None:
        """The PFC agent (or CBFC's credits, on the eBPF switches) as a fabric service."""
        pfc = self.spec.pfc
        access = PortAccess(self.share.topo, self.pid, self.shaping, self.netlink, self.marker,
                            self.spec.fabric.mtu)
        if pfc.mode == "cbfc":
            if not datapath.startswith("ebpf"):
                raise TestbedError("fabric.traffic_classes.lossless.mode: cbfc needs the eBPF "
                                   "switches (emulator.datapath: ebpf): its credit accounting "
                                   "reads each packet's ingress port at the egress, which "
                                   "Open vSwitch's userspace datapath does not keep")
            self.pfc_agent = CbfcAgent(access, pfc)
        else:
            self.pfc_agent = PfcAgent(access, pfc)
        self.run.start_thread(self.pfc_agent, "pfc agent")

    # -- readings and failures -----------------------------------------------------------------
    def congestion(self, netlink: Netlink | None = None) -> dict[str, dict]:
        """Switch port -> its queue's counters and backlog now (summed over its priorities'
        leaves), per priority that leaf's, and with the marker its virtual queue and marking
        counters; with PFC, every paused port's (host NICs too) pause counters per priority.
        All cumulative since the build. Another thread passes its own ``netlink`` (pyroute2
        sockets are not shared across threads)."""
        ports: dict[str, dict] = {}
        nl = netlink or self.netlink
        for (name, prio), q in nl.leaf_queues(self.share.switch_ports()).items():
            port = ports.setdefault(name, {"queue": dict.fromkeys(q, 0)})
            for k, v in q.items():
                port["queue"][k] += v
            port.setdefault("priorities", {}).setdefault(prio, {})["queue"] = q
        if self.marker is not None:
            for name, (backlog, peak) in self.marker.queues().items():
                ports.setdefault(name, {})["virtual_queue"] = {"backlog_bytes": backlog,
                                                               "max_bytes": peak}
            for (name, prio), counts in self.marker.counters().items():
                ports.setdefault(name, {}).setdefault("priorities", {}).setdefault(
                    prio, {}).update(counts)
        if self.pfc_agent is not None:
            for (name, prio), counts in self.pfc_agent.counters().items():
                ports.setdefault(name, {}).setdefault("priorities", {}).setdefault(
                    prio, {})["pfc"] = counts
        return ports

    def link_ends(self, link: Link) -> tuple[End, ...]:
        """The ends of a link built here, as :mod:`testbed.fabric.linkfail` acts on them: both on
        one machine, on a cluster machine those of its part (one of a cut link)."""
        def end(e) -> End:
            if self.share.topo.nodes[e.node].is_switch:
                return End(e.ifname, None, True, self.switches.db(e.node))
            return End(e.ifname, self.pid(e.node), False)
        return tuple(end(e) for e in (link.a, link.b) if self.share.here(e.node))

    def set_links(self, pairs: list[tuple[str, str]], up: bool,
                  netlink: Netlink | None = None) -> dict[str, float]:
        """Fail links (cut, the switches told, the veths down: :mod:`testbed.fabric.linkfail`)
        or repair them, all at once; another thread passes its own ``netlink``. On a cluster
        machine, its ends of them (a cut link's other end is the other machine's). Returns
        each step's time after the call."""
        ends = [self.link_ends(self.share.topo.find_link(a, b)) for a, b in pairs]
        agent = self.switches.agent
        signal = None if agent is None else lambda ends, lost: [
            agent.signal(end.ifname, lost) for end in ends]
        return set_links(netlink or self.netlink, [e for e in ends if e], up, self.cut, signal)

    def set_rates(self, pairs: list[tuple[str, str]], factor: float,
                  netlink: Netlink | None = None) -> dict[str, float]:
        """Degrade links to ``factor`` of their rate (1: restored), both directions, at their
        ends built here: each end's HTB class (the shaper), the marker's virtual queue at a
        switch port (ECN, INT and trimming drain at the new rate) and the eBPF switches' load
        accounting (switch-local adaptive routing sees the port fill the sooner). Another
        thread passes its own ``netlink``. Returns when it was done, in seconds after the
        call."""
        if not 0 < factor:
            raise TestbedError(f"a link's rate factor must be above 0, got {factor}")
        nl = netlink or self.netlink
        start = time.monotonic()
        for a, b in pairs:
            link = self.share.topo.find_link(a, b)
            for end in self.link_ends(link):
                plan = self.shaping(link, host_end=not end.switch)
                rate_kbit = max(8, int(plan.rate_kbit * factor))
                nl.set_class_rate(end.ifname, rate_kbit, plan.burst_bytes, plan.quantum_bytes,
                                  end.pid)
                if end.switch:
                    rate_bytes_s = rate_kbit * 1000 / 8
                    if factor == 1:
                        self.rate_factors.pop(end.ifname, None)
                    else:
                        self.rate_factors[end.ifname] = factor
                    if self.marker is not None and end.ifname in self.marker.index:
                        self.marker.set_rate(end.ifname, rate_bytes_s)
                    self.switches.set_port_rate(end.ifname, int(rate_bytes_s))
        return {"rated_s": round(time.monotonic() - start, 4)}

    def offered_bytes(self, names: set[str]) -> dict[str, int] | None:
        """Switch port -> bytes offered to its egress so far: what an eBPF switch sent to it
        (and towards it while it was not live), else what reached the marker and what a cut
        dropped before it, as full frames; None with neither."""
        frame = frame_bytes(self.spec.fabric.mtu)
        counted = self.switches.offered_bytes(names, frame)
        if counted is not None:
            return counted
        if self.marker is None:
            return None
        # the priorities packets can have here: those of the DSCPs, and 0 (not IP)
        prios = {0, *self.spec.fabric.traffic_classes.table()}
        out = self.marker.offered({n for n in names if n in self.marker.index}, prios)
        if self.cut is not None:
            for name in out:
                if name not in self._index:
                    self._index[name] = socket.if_nametoindex(name)
                out[name] += self.cut.dropped_at(self._index[name]) * frame
        return out

    def cut_drops(self, pairs: list[tuple[str, str]],
                  netlink: Netlink | None = None) -> int | None:
        """Frames the cuts of these links dropped so far at their ends here (None without
        the cut program)."""
        if self.cut is None:
            return None
        return self.cut.dropped(netlink or self.netlink,
                                [e for a, b in pairs
                                 for e in self.link_ends(self.share.topo.find_link(a, b))])

    def close(self) -> None:
        """The marker's and the cut's descriptors closed (their pins go with the run)."""
        for service in ("marker", "cut"):
            if getattr(self, service) is not None:
                getattr(self, service).close()
                setattr(self, service, None)

