"""How a fabric is built on this machine, step by step: the machine checked (Open vSwitch,
capabilities, the fidelity budget), the run recorded, then hosts, links, tunnels, scale-up
domains, the ECN marker, the link-cut program, the switches' send buffer and the switches
themselves; the sysctls raised for the build put back; the PFC agent started."""

from __future__ import annotations

import os
import platform
from dataclasses import replace
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from testbed.errors import ConfigError, TestbedError
from testbed.fabric.ecn import Marker, PortMarking
from testbed.fabric.linkfail import LinkCut
from testbed.fabric.cbfc import CbfcAgent
from testbed.fabric.pfc import PfcAgent
from testbed.linux import bpf, capabilities, netns, ovs, packages, procfs
from testbed.linux.hosts import Hosts
from testbed.linux.ebpfswitch import EbpfSwitches
from testbed.linux.netlink import Netlink
from testbed.linux.rawnl import LinkEvents
from testbed.model.servers import scale_up_routes
from testbed.model.spec import Datapath, EcnMarker, Fidelity, TestbedSpec
from testbed.model.topology import HOST_PREFIX_LEN, PLANE_PREFIX_LEN, Link, shard_switches
from testbed.plan import datapaths
from testbed.plan.fidelity import assess, saturation_table
from testbed.plan.portplan import (
    link_plan,
    marker_thresholds,
    scale_up_mac,
    scale_up_plan,
    send_buffer_bytes,
    switch_queue_bytes,
)
from testbed.poll import wait_for
from testbed.runs import cleanup
from testbed.runs.registry import Role
from testbed.switch.agent import SwitchAgent, SwitchSpec
from testbed.switch.session import Port


#: private vswitchds started at once (each sleeps half a second calibrating its TSC)
STARTUP_WORKERS = 16


class BuildSteps:
    """The build steps of :class:`testbed.fabric.fabric.Fabric` (a mixin: they read and record the
    fabric's state; :meth:`Fabric.up` runs them in order)."""

    def _check_machine(self) -> capabilities.Capabilities:
        caps = capabilities.probe(self.registry.state_dir)
        self._check_requirements(caps)
        return caps

    def _check_requirements(self, caps: capabilities.Capabilities,
                            spec: TestbedSpec | None = None) -> None:
        for need in (spec or self.spec).requirements():
            if not caps.has(need):
                raise ConfigError(need.field, caps.explain_missing(need))

    def _choose_datapath(self) -> None:
        """``emulator.datapath: auto`` resolved here (:func:`testbed.plan.datapaths.choose`);
        the spec says the datapath chosen from now on, ``datapath_choice`` why."""
        caps = self.caps
        chosen, self.datapath_choice = datapaths.choose(
            self.spec, caps is None or caps.has_qdisc("clsact"),
            caps is not None and caps.ovs_kernel_datapath,
            caps.machine if caps is not None else platform.machine())
        if chosen != self.spec.emulator.datapath:
            self.spec = replace(self.spec, emulator=replace(self.spec.emulator, datapath=chosen))
            self.log(f"datapath {self.datapath_choice}")
        if caps is not None and chosen != "ebpf":  # the eBPF switches need no Open vSwitch
            ovs.check_running()

    def _check_fidelity(self) -> None:
        """Refuse (or warn about) a fabric whose full load exceeds this machine's budget, as
        measured for its datapath (the kernel datapath of Open vSwitch has none measured)."""
        mode = self.spec.emulator.fidelity
        ebpf = self.spec.emulator.datapath == Datapath.EBPF
        if (self.caps.datapath_type != "netdev" and not ebpf) or mode == Fidelity.OFF:
            return
        self.fidelity = verdict = assess(self.topo, self.spec.fabric.mtu,
                                         saturation_table(self.spec.emulator.datapath))
        if verdict.overloaded and mode == Fidelity.STRICT:
            raise ConfigError("fabric.host_link.rate_mbps",
                              f"too fast for this machine: {verdict.explain()}. Lower the rates, "
                              "or set emulator.fidelity: warn to measure the emulator anyway")
        if not verdict.fits:
            self.warnings.append(f"fidelity: {verdict.explain()}; measured numbers may describe "
                                 "the emulator rather than the fabric")

    def _prepare_run(self) -> None:
        # runs killed with SIGKILL (a cluster machine's registry knows only its own runs)
        report = cleanup.clean(self.registry, orphans=self.part is None)
        if report.runs:
            self.log(f"cleaned {len(report.runs)} stale run(s)")
        if report.errors:
            raise TestbedError("cannot clean what earlier runs left behind (see 'fabriclab "
                               "clean'):\n  " + "\n  ".join(report.errors))
        live = [r for r in self.registry.runs() if r.owner_alive()]
        if live:
            raise TestbedError(f"another fabric is up (run {live[0].run_id}, pid "
                               f"{live[0].owner_pid}); 'fabriclab down' tears it down")
        run_dir = self.registry.state_dir / "work"
        self.record = self.registry.new_run(run_dir)
        self.record.run_dir = str(run_dir / self.record.run_id)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir.chmod(0o700)  # job specs, sockets, logs: the run's own, nobody else's
        self.registry.save(self.record)
        self.netlink = Netlink()

    def _start_hosts(self) -> None:
        def track(name: str, pid: int) -> None:
            self.registry.track_process(self.record, pid, Role.host(name))

        sysctls = self.spec.fabric.host_sysctls(procfs.read_sysctl("net.ipv4.tcp_rmem"))
        if self.topo.servers:  # a GPU's scale-up peers answer on other interfaces than its NIC
            sysctls |= {"net.ipv4.conf.all.rp_filter": "0",
                        "net.ipv4.conf.default.rp_filter": "0"}
            if any(s.scale_up == "cube_mesh" for s in self.topo.servers):
                sysctls["net.ipv4.ip_forward"] = "1"  # a GPU relays for its cube-mesh pairs
        topo = self.topo
        nics = {h.name: topo.nic_owner(h.name) for h in topo.hosts
                if topo.nic_owner(h.name) != h.name and self.here(h.name)}  # planes' NICs
        self.hosts = Hosts([h.name for h in topo.hosts if h.name not in nics
                            and self.here(h.name)], on_spawn=track, sysctls=sysctls,
                           aliases=nics)
        self._name_hosts()

    def _name_hosts(self) -> None:
        """Each host's namespace under the host's name in /run/netns (``ip netns exec``); a
        name someone else holds stays theirs, with a warning."""
        taken = netns.named()
        for host in self.hosts.nodes:
            if host not in taken:
                self.registry.track_netns_name(self.record, host)
                try:
                    netns.name(host, self.hosts.pid(host))
                    continue
                except netns.NameTaken:  # taken since the look (another fabric naming it)
                    self.registry.untrack_netns_name(self.record, host)
            self.warnings.append(f"network namespace name {host} is taken: 'ip netns exec "
                                 f"{host}' is not this fabric's host ('fabriclab exec' is)")

    def _root_ends(self, link: Link) -> list[str]:
        return [e.ifname for e in (link.a, link.b)
                if self.topo.nodes[e.node].is_switch and self.here(e.node)]

    def shaping(self, link: Link, host_end: bool = False):
        """The tc plan of a link's switch ends, or of its host NIC (:func:`link_plan`)."""
        return link_plan(self.spec, link, host_end, self.red_marking)

    @property
    def red_marking(self) -> bool:
        """Whether the switch ports' lossy classes mark ECN with the kernel's RED qdisc (the
        experiment's ``emulator.ecn_marker``; ``auto``: where the kernel has RED)."""
        choice = self.spec.emulator.ecn_marker
        if not self.spec.fabric.marks_ecn or choice == EcnMarker.EBPF:
            return False
        return choice == EcnMarker.RED or bool(self.caps and self.caps.has_qdisc("red"))

    def _create_links(self) -> None:
        fab = self.spec.fabric
        links = self.topo.links if self.part is None else self.part.links
        self.record.links = [n for l in self.local_links() for n in self._root_ends(l)]
        self.registry.save(self.record)
        nl, mtu = self.netlink, fab.mtu
        for link in links:
            plan = self.shaping(link)
            if link.tier == "host":
                host = self.topo.nodes[link.a.node]
                pid = self.hosts.pid(host.name)
                nl.create_veth(link.b.ifname, link.a.ifname, peer_pid=pid, peer_mac=host.mac,
                               mtu=mtu, group=self.record.link_group)
                self._note_acks(nl.shape(link.a.ifname, self.shaping(link, host_end=True),
                                         pid=pid))
            else:
                nl.create_veth(link.b.ifname, link.a.ifname, mtu=mtu,
                               group=self.record.link_group)
                nl.shape(link.a.ifname, plan)
                nl.set_state(link.a.ifname, True)
            nl.shape(link.b.ifname, plan)
            nl.set_state(link.b.ifname, True)
        for host in self.topo.hosts:  # each NIC on-link with its plane's, as ARP resolved
            if not self.here(host.name):
                continue
            plane = self.topo.plane_of(host.name)
            nl.configure_host(self.hosts.pid(host.name), self.topo.host_link(host.name).a.ifname,
                              host.ip, HOST_PREFIX_LEN if plane == 1 else PLANE_PREFIX_LEN,
                              [(h.ip, h.mac) for h in self.topo.hosts if h is not host
                               and self.topo.plane_of(h.name) == plane])

    def _create_tunnels(self) -> None:
        """This machine's ends of the cut links: VXLAN devices on the underlay, named and
        shaped as the link's veth end would be (recorded with the links, so teardown and
        ``fabriclab clean`` remove them)."""
        nl, mtu = self.netlink, self.spec.fabric.mtu
        for cut, _node in self.part.tunnels:
            ifname, local, remote = cut.end(self.part.machine)
            nl.create_vxlan(ifname, cut.vni, local, remote, mtu, group=self.record.link_group)
            nl.shape(ifname, self.shaping(cut.link))
            nl.set_state(ifname, True)

    def _note_acks(self, classified: bool) -> None:
        """Warn once when the host NICs cannot send TCP's acknowledgements first."""
        warning = ("this kernel has no bpf classifier (cls_bpf): host NICs send TCP's "
                   "acknowledgements behind their queued data, which slows BBR senders "
                   "whose hosts also receive")
        if not classified and warning not in self.warnings:
            self.warnings.append(warning)

    def _create_scale_up(self) -> None:
        """Every server's scale-up domain: veths between its GPUs' namespaces (meshes) or from
        each GPU to the server's Linux bridge (switch), shaped at both ends, and in every GPU
        /32 routes to its server's other GPUs through them, so that traffic inside a server
        never meets the scale-out fabric."""
        topo, nl, mtu = self.topo, self.netlink, self.spec.fabric.mtu
        bridges = [s.switch for s in topo.servers if s.switch and self.here(s.switch)]
        scale_up = [l for l in topo.scale_up if self.here(l.a.node)]
        self.record.links += bridges + [e.ifname for l in scale_up for e in (l.a, l.b)
                                        if e.node in bridges]
        self.registry.save(self.record)
        for bridge in bridges:
            nl.create_bridge(bridge, mtu, group=self.record.link_group)
        mac = {}  # a GPU's scale-up interface -> its MAC
        for link in scale_up:
            plan = scale_up_plan(self.spec, link)
            gpu_plan = scale_up_plan(self.spec, link, gpu_end=True)
            a = topo.nodes[link.a.node]
            mac[link.a.ifname] = scale_up_mac(a.ip, link.a.port)
            nl.create_veth(link.b.ifname, link.a.ifname, peer_pid=self.hosts.pid(a.name),
                           peer_mac=mac[link.a.ifname], mtu=mtu, group=self.record.link_group)
            self._note_acks(nl.shape(link.a.ifname, gpu_plan, pid=self.hosts.pid(a.name)))
            if link.b.node in bridges:
                nl.shape(link.b.ifname, plan)
                nl.set_master(link.b.ifname, link.b.node)
                nl.set_state(link.b.ifname, True)
                continue
            b = topo.nodes[link.b.node]
            mac[link.b.ifname] = scale_up_mac(b.ip, link.b.port)
            nl.move(link.b.ifname, self.hosts.pid(b.name), mac[link.b.ifname])
            self._note_acks(nl.shape(link.b.ifname, gpu_plan, pid=self.hosts.pid(b.name)))
        # where each GPU's scale-up interfaces lead: the peer GPU (mesh) or the bridge
        ends: dict[str, str] = {}  # a GPU's interface -> the peer GPU's interface on that link
        for link in scale_up:
            if link.b.node not in bridges:
                ends[link.a.ifname], ends[link.b.ifname] = link.b.ifname, link.a.ifname
        owner = {e.ifname: e.node for l in topo.scale_up for e in (l.a, l.b)}
        for gpu, table in scale_up_routes(topo).items():
            if not self.here(gpu):
                continue
            by_if: dict[str, list[tuple[str, str | None]]] = {}
            for peer, hop in table.items():
                via = topo.nodes[hop.via].ip if hop.via else None
                by_if.setdefault(hop.ifname, []).append((topo.nodes[peer].ip, via))
            for ifname, routes in by_if.items():
                if ifname in ends:  # a mesh link: its one neighbour
                    peer_if = ends[ifname]
                    neighbours = [(topo.nodes[owner[peer_if]].ip, mac[peer_if])]
                else:  # the bridge: every GPU of the server
                    server = topo.server_of(gpu)
                    neighbours = [(topo.nodes[g].ip, mac[topo.scale_up_ports(g)[1].end(g).ifname])
                                  for g in server.gpus if g != gpu]
                nl.host_routes(self.hosts.pid(gpu), ifname, routes, neighbours)

    def _pin_dir(self) -> Path:
        """The run's BPF pins, recorded for teardown and ``fabriclab clean``."""
        pins = bpf.PIN_ROOT / self.record.run_id
        if str(pins) not in self.record.bpf_pins:
            self.record.bpf_pins.append(str(pins))
            self.registry.save(self.record)
        return pins

    def _load_cut(self) -> None:
        """Load the program a link failure cuts the link with (:mod:`testbed.fabric.linkfail`)
        when failures are planned or may be asked for (``fabriclab fail``), or the eBPF
        toolchain is here anyway; without it a failure takes the veths down alone, later to
        show."""
        if not (self.spec.plans_failures() or self.failable) and \
                packages.missing(packages.EBPF_TOOLCHAIN):
            self.log("link cuts: not loaded (no failure planned, no eBPF toolchain here)")
            return
        if not ovs.has_ovsdb_client():  # a failure tells the switches through it: imported now
            self.warnings.append("no Open vSwitch Python library (apt-get install "
                                 "python3-openvswitch): a failure tells the switches through "
                                 "ovs-vsctl, about 10 ms slower")
        try:
            self.cut = LinkCut(self._pin_dir() / "cut", self.registry.state_dir)
        except TestbedError as err:
            self.warnings.append(f"link failures take the veths down only, which the switches "
                                 f"see 10-80 ms late: {err}")

    def _attach_markers(self) -> None:
        """The eBPF marker at the egress of every switch port, with its link tier's marking,
        steering packets into per-priority classes where there are some (and at host NICs);
        with PFC, its arrival counter at every switch port's ingress."""
        self.marker = Marker(self.registry.state_dir, self._pin_dir())
        fab = self.spec.fabric
        table = tuple(fab.traffic_classes.table())
        pfc = self.spec.pfc is not None
        for link in self.local_links():
            plan = self.shaping(link)
            limit = plan.queue_limit if plan.queue_kind == "bfifo" else 0  # bytes only
            marking = marker_thresholds(self.spec, link, plan)
            loss = fab.link(link.tier).loss_percent
            impair = fab.link(link.tier).impair
            credits = self.spec.pfc.priorities if pfc and self.spec.pfc.mode == "cbfc" else ()
            for ifname in self._root_ends(link):
                self.marker.attach(self.netlink, ifname, PortMarking(
                    link.rate_mbps, plan.burst_bytes, limit, table, marking,
                    classes=bool(plan.classes), loss_percent=loss,
                    trim=self.spec.port_trim(link.tier), impair=impair,
                    cbfc_priorities=credits),
                    count_rx=pfc or impair is not None)
            if link.tier == "host" and (plan.classes or loss or impair):
                host = link.a.node
                self.marker.classify_host(self.netlink, host, self.hosts.pid(host),
                                          link.a.ifname, table, bool(plan.classes), loss,
                                          impair)

    def _raise_send_buffer(self) -> None:
        """Let the switches' sockets hold every queue full at once, while they are created.

        The userspace datapath sends every packet of a vswitchd through one AF_PACKET socket,
        and a packet in a port's queue counts against that socket's send buffer until it
        leaves. With the kernel's default buffer (net.core.wmem_default, 208 KiB) the queues of
        an instance together hold about 110 KiB of jumbo frames; beyond that the switch drops
        in silence (no qdisc or interface counter sees it). The socket takes the default when it
        is created, during the build (the controller's first LLDP probes): raise it until the
        fabric is programmed, then restore it (the run record keeps the old value until then).
        """
        want = send_buffer_bytes(switch_queue_bytes(self.spec, self.red_marking))
        name = "net.core.wmem_default"
        old = procfs.read_sysctl(name)
        if want <= int(old):
            return
        if not os.access(procfs.sysctl_path(name), os.W_OK):
            # the machine's own setting, read-only in a namespace machine (its host sets it:
            # testbed.cluster.nscluster does)
            self.warnings.append(f"{name} is {old} here and cannot be raised from this network "
                                 f"namespace: the switches' queues may drop in silence beyond "
                                 f"about half of it; raise it to {want} on the host")
            return
        self.record.sysctls[name] = old
        self.registry.save(self.record)
        procfs.write_sysctl(name, str(want))

    def _restore_sysctls(self, wait: bool = True) -> None:
        """Put back the sysctls raised for the build, once every switch has sent (its LLDP
        probes: its socket exists). A cluster's coordinator always waits for the probes (its
        machines put theirs back after, :meth:`settle`); a machine's part waits for nothing."""
        if wait and self.spec.controller.own and (self.record.sysctls or self.part is not None):
            def probed() -> bool:
                status = self.controller_status()
                return status.get("wiring_verified", 0) >= status.get("wiring_expected", 0)

            wait_for(probed, self.spec.controller.ready_timeout_s,
                     "the controller's LLDP probes through every switch")
        for name, value in self.record.sysctls.items():
            procfs.write_sysctl(name, value)
        if self.record.sysctls:
            self.record.sysctls = {}
            self.registry.save(self.record)

    def _start_pfc(self) -> None:
        if self.spec.pfc.mode == "cbfc":
            if not (self.datapath_type or "").startswith("ebpf"):
                raise TestbedError("fabric.traffic_classes.lossless.mode: cbfc needs the eBPF "
                                   "switches (emulator.datapath: ebpf): its credit accounting "
                                   "reads each packet's ingress port at the egress, which "
                                   "Open vSwitch's userspace datapath does not keep")
            self.pfc_agent = CbfcAgent(self, self.spec.pfc)
        else:
            self.pfc_agent = PfcAgent(self, self.spec.pfc)
        self.start_thread(self.pfc_agent, "pfc agent")

    def _create_switches(self) -> None:
        if self.controller_at is None:
            self._wait_listening()
        if self.spec.controller.tls and self.pki is None:
            raise TestbedError("controller.tls: the switches of a fabric over a cluster have "
                               "no certificates of the run (OpenFlow over TLS runs on one "
                               "machine); leave it false for a cluster")
        if self.spec.emulator.datapath == Datapath.EBPF:
            self._create_ebpf_switches()
            return
        specs = {sw.name: ovs.BridgeSpec(sw.name, sw.dpid_hex,
                                         tuple((l.end(sw.name).ifname, p)
                                               for p, l in self.topo.ports(sw.name).items()))
                 for sw in self._switches()}
        self.record.bridges = sorted(specs)
        self.registry.save(self.record)
        address, port = self.controller_at or (self.listen, self.of_port)
        target = f"{'ssl' if self.pki is not None else 'tcp'}:{address}:{port}"
        mtu = self.spec.fabric.mtu
        # a controller of the user's may speak any version (os-ken's LLDP discovery: to 1.4)
        protocols = ("OpenFlow15" if self.spec.controller.own
                     else "OpenFlow10,OpenFlow13,OpenFlow14,OpenFlow15")
        if self.caps.datapath_type != "netdev":
            if self.pki is not None:
                raise TestbedError("controller.tls: the machine's Open vSwitch (kernel "
                                   "datapath) keeps one SSL setting for all its bridges, which "
                                   "fabriclab does not change; use emulator.datapath ebpf, or "
                                   "leave controller.tls false")
            ovs.create_bridges(list(specs.values()), self.record.run_id, self.caps.datapath_type,
                               target, mtu, protocols)
            return
        wanted = self.spec.emulator.vswitchd_instances
        shards = shard_switches(self.topo, len(specs) if wanted == "auto" else int(wanted),
                                frozenset(specs))
        instances = [ovs.Instance(self.run_dir / f"ovs{i}", f"ovs{i}")
                     for i in range(len(shards))]
        self.instances = instances
        self.switch_instance = {n: inst for inst, names in zip(instances, shards) for n in names}

        def start(inst: ovs.Instance, names: list[str]) -> None:
            inst.start_db({"userspace-tso-enable": "true",
                           **self.spec.emulator.ovs_other_config})
            self.registry.track_process(self.record, inst.pids["ovsdb-server"],
                                        Role.ovs(inst.name, "ovsdb-server"))
            inst.start_switch()
            self.registry.track_process(self.record, inst.pids["ovs-vswitchd"],
                                        Role.ovs(inst.name, "ovs-vswitchd"))
            if self.pki is not None:
                ovs.set_ssl(self.pki.switch_key, self.pki.switch_cert, self.pki.ca, inst.db)
            ovs.create_bridges([specs[n] for n in names], self.record.run_id,
                               ovs.PRIVATE_DATAPATH_TYPE, target, mtu, protocols, db=inst.db)

        # daemons start mostly asleep (vswitchd calibrates its TSC for 0.5 s): in parallel
        with ThreadPoolExecutor(max_workers=STARTUP_WORKERS) as pool:
            for future in [pool.submit(start, i, n) for i, n in zip(instances, shards)]:
                future.result()
        self.registry.save(self.record)

    def _create_ebpf_switches(self) -> None:
        """The switches here as eBPF switches: the program on every switch port, one switch
        index each in the maps, and their agent connected to the controller (it installs what
        the controller sets; :meth:`wait_ready` waits for every switch to be programmed)."""
        address, port = self.controller_at or (self.listen, self.of_port)
        self.ebpf = EbpfSwitches(self._pin_dir() / "switch", self.registry.state_dir)
        specs = {}
        for index, sw in enumerate(self._switches(), start=1):
            ports = []
            for number, link in sorted(self.topo.ports(sw.name).items()):
                ifname = link.end(sw.name).ifname
                self.ebpf.add_port(self.netlink, index, number, ifname)
                mac = f"02:fb:00:{index >> 8 & 0xFF:02x}:{index & 0xFF:02x}:{number & 0xFF:02x}"
                ports.append(Port(number, ifname, mac, speed_kbps=int(link.rate_mbps * 1000)))
            specs[sw.name] = SwitchSpec(index, sw.dpid, ports)
        self.switch_agent = SwitchAgent(self.ebpf, specs, (address, port), LinkEvents(),
                                        tls=self.client_tls())
        self.switch_agent.start()
