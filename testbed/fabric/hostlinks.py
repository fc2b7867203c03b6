"""A fabric's hosts and links on this machine: every host a network namespace (Mininet's
``Host``), named in ``/run/netns``; every link a veth pair shaped at both ends (HTB and a
byte or packet FIFO); on a cluster machine its ends of the cut links as VXLAN devices; every
server's scale-up domain (veths between its GPUs, or to the server's Linux bridge) with the
routes that keep traffic inside a server off the scale-out fabric.

:class:`HostsAndLinks` is a part of :class:`testbed.fabric.fabric.Fabric`."""

from __future__ import annotations


from testbed.fabric.services import FabricRun
from testbed.linux import netns, procfs
from testbed.linux.hosts import Hosts
from testbed.linux.netlink import Netlink
from testbed.linux.rawnl import LinkDump
from testbed.model.servers import scale_up_routes
from testbed.model.share import LocalShare
from testbed.model.spec import TestbedSpec
from testbed.model.topology import HOST_PREFIX_LEN, PLANE_PREFIX_LEN, Link
from testbed.plan.portplan import link_plan, scale_up_mac, scale_up_plan
from testbed.runs.registry import Role

#: the warning when a host NIC cannot send TCP's acknowledgements ahead of its data
NO_ACK_CLASS = ("this kernel has no bpf classifier (cls_bpf): host NICs send TCP's "
                "acknowledgements behind their queued data, which slows BBR senders whose "
                "hosts also receive")


class HostsAndLinks:
    """The hosts and links built here.

    Args:
        spec: the fabric's settings.
        share: what of the fabric is built here.
        run: the fabric's run (its record names every link before it is made).
        netlink: the build's netlink socket.
        red_marking: whether the switch ports mark ECN with the kernel's RED qdisc.
        warnings: where what the build could not do as asked is said.
    """

    def __init__(self, spec: TestbedSpec, share: LocalShare, run: FabricRun, netlink: Netlink,
                 red_marking: bool, warnings: list[str]) -> None:
        self.spec, self.share, self.run = spec, share, run
        self.topo = share.topo
        self.netlink = netlink
        self.red_marking = red_marking
        self.warnings = warnings
        self.hosts: Hosts | None = None
        self.sysctls: dict[str, str] = {}  # each host's, as applied

    def pid(self, host: str) -> int:
        """The process that holds ``host``'s network namespace."""
        return self.hosts.pid(host)

    def shaping(self, link: Link, host_end: bool = False):
        """The tc plan of a link's switch ends, or of its host NIC (:func:`link_plan`)."""
        return link_plan(self.spec, link, host_end, self.red_marking)

    # -- the build -----------------------------------------------------------------------------
    def start_hosts(self) -> None:
        """Every host here a namespace with the fabric's sysctls, named in /run/netns."""
        record, registry = self.run.record, self.run.registry

        def track(name: str, pid: int) -> None:
            registry.track_process(record, pid, Role.host(name))

        sysctls = self.spec.fabric.host_sysctls(procfs.read_sysctl("net.ipv4.tcp_rmem"))
        if self.topo.servers or self.spec.fabric.delay_line == "hosts":
            # a GPU's scale-up peers answer on other interfaces than its NIC; the delay
            # relay's device hands back packets whose source is reached through the NIC
            sysctls |= {"net.ipv4.conf.all.rp_filter": "0",
                        "net.ipv4.conf.default.rp_filter": "0"}
            if any(s.scale_up == "cube_mesh" for s in self.topo.servers):
                sysctls["net.ipv4.ip_forward"] = "1"  # a GPU relays for its cube-mesh pairs
        self.sysctls = dict(sysctls)  # as applied (the run's provenance)
        topo, here = self.topo, self.share.here
        nics = {h.name: topo.nic_owner(h.name) for h in topo.hosts
                if topo.nic_owner(h.name) != h.name and here(h.name)}  # planes' NICs
        hosts_file = self.run.write_file("hosts", topo.etc_hosts())  # each host's /etc/hosts
        self.hosts = Hosts([h.name for h in topo.hosts if h.name not in nics and here(h.name)],
                           on_spawn=track, sysctls=sysctls, aliases=nics,
                           hosts_file=hosts_file)
        self.run.host_popen = self.hosts.popen
        self._name_hosts()

    def _name_hosts(self) -> None:
        """Each host's namespace under the host's name in /run/netns (``ip netns exec``); a
        name someone else holds stays theirs, with a warning."""
        taken = netns.named()
        record, registry = self.run.record, self.run.registry
        for host in self.hosts.nodes:
            if host not in taken:
                registry.track_netns_name(record, host)
                try:
                    netns.name(host, self.hosts.pid(host))
                    registry.netns_named(record, host, netns.inode(host))
                    continue
                except netns.NameTaken:  # taken since the look (another fabric naming it)
                    registry.untrack_netns_name(record, host)
            self.warnings.append(f"network namespace name {host} is taken: 'ip netns exec "
                                 f"{host}' is not this fabric's host ('fabriclab exec' is)")

    def _note_acks(self, classified: bool) -> None:
        """Warn once when the host NICs cannot send TCP's acknowledgements first."""
        if not classified and NO_ACK_CLASS not in self.warnings:
            self.warnings.append(NO_ACK_CLASS)

    def create_links(self) -> None:
        """Every link here a shaped veth pair (a host's end in its namespace); every host's
        NIC addressed, on-link with its plane's hosts, their neighbours static."""
        share, nl, mtu = self.share, self.netlink, self.spec.fabric.mtu
        record = self.run.record
        record.links = [n for l in share.local_links() for n in share.root_ends(l)]
        self.run.save()
        for link in share.links():
            plan = self.shaping(link)
            if link.tier == "host":
                host = self.topo.nodes[link.a.node]
                pid = self.hosts.pid(host.name)
                nl.create_veth(link.b.ifname, link.a.ifname, peer_pid=pid, peer_mac=host.mac,
                               mtu=mtu, group=record.link_group,
                               peer_segments=self.spec.fabric.host_offload_segments)
                self._note_acks(nl.shape(link.a.ifname, self.shaping(link, host_end=True),
                                         pid=pid))
            else:
                nl.create_veth(link.b.ifname, link.a.ifname, mtu=mtu, group=record.link_group)
                nl.shape(link.a.ifname, plan)
                nl.set_state(link.a.ifname, True)
            nl.shape(link.b.ifname, plan)
            nl.set_state(link.b.ifname, True)
        topo = self.topo
        for host in topo.hosts:  # each NIC on-link with its plane's, as ARP resolved
            if not share.here(host.name):
                continue
            plane = topo.plane_of(host.name)
            nl.configure_host(self.hosts.pid(host.name), topo.host_link(host.name).a.ifname,
                              host.ip, HOST_PREFIX_LEN if plane == 1 else PLANE_PREFIX_LEN,
                              [(h.ip, h.mac) for h in topo.hosts if h is not host
                               and topo.plane_of(h.name) == plane])

    def create_tunnels(self) -> None:
        """This machine's ends of the cut links: VXLAN devices on the underlay, named and
        shaped as the link's veth end would be (recorded with the links, so teardown and
        ``fabriclab clean`` remove them)."""
        nl, mtu, part = self.netlink, self.spec.fabric.mtu, self.share.part
        for cut, _node in part.tunnels:
            ifname, local, remote = cut.end(part.machine)
            nl.create_vxlan(ifname, cut.vni, local, remote, mtu,
                            group=self.run.record.link_group)
            nl.shape(ifname, self.shaping(cut.link))
            nl.set_state(ifname, True)

    def create_scale_up(self) -> None:
        """Every server's scale-up domain: veths between its GPUs' namespaces (meshes) or from
        each GPU to the server's Linux bridge (switch), shaped at both ends, and in every GPU
        /32 routes to its server's other GPUs through them, so that traffic inside a server
        never meets the scale-out fabric."""
        topo, nl, mtu, record = self.topo, self.netlink, self.spec.fabric.mtu, self.run.record
        bridges = self.share.bridges()
        scale_up = [l for l in topo.scale_up if self.share.here(l.a.node)]
        record.links += bridges + [e.ifname for l in scale_up for e in (l.a, l.b)
                                   if e.node in bridges]
        self.run.save()
        for bridge in bridges:
            nl.create_bridge(bridge, mtu, group=record.link_group)
        mac = {}  # a GPU's scale-up interface -> its MAC
        for link in scale_up:
            plan = scale_up_plan(self.spec, link)
            gpu_plan = scale_up_plan(self.spec, link, gpu_end=True)
            a = topo.nodes[link.a.node]
            mac[link.a.ifname] = scale_up_mac(a.ip, link.a.port)
            nl.create_veth(link.b.ifname, link.a.ifname, peer_pid=self.hosts.pid(a.name),
                           peer_mac=mac[link.a.ifname], mtu=mtu, group=record.link_group)
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
        self._scale_up_routes(scale_up, set(bridges), mac)

    def _scale_up_routes(self, scale_up: list[Link], bridges: set[str],
                         mac: dict[str, str]) -> None:
        """Each GPU's routes to its server's other GPUs: over a mesh link to its one
        neighbour, or over the bridge to every GPU of the server."""
        topo, nl = self.topo, self.netlink
        ends: dict[str, str] = {}  # a GPU's interface -> the peer GPU's interface on that link
        for link in scale_up:
            if link.b.node not in bridges:
                ends[link.a.ifname], ends[link.b.ifname] = link.b.ifname, link.a.ifname
        owner = {e.ifname: e.node for l in topo.scale_up for e in (l.a, l.b)}
        for gpu, table in scale_up_routes(topo).items():
            if not self.share.here(gpu):
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

    # -- readings and operations ---------------------------------------------------------------
    def run_parallel(self, commands: dict[str, list[str]],
                     timeout_s: float) -> dict[str, tuple[int, str, str]]:
        """One command per host here, all at once: host -> (exit code, stdout, stderr)."""
        return self.hosts.run_parallel(commands, timeout_s)

    def port_states(self) -> dict[str, bool]:
        """Every switch port here: whether it is up (one netlink dump, its own socket)."""
        dump = LinkDump()
        try:
            return {name: stats["up"] for name, stats in
                    dump.read(self.share.port_names()).items()}
        finally:
            dump.close()

    def close(self) -> None:
        """The hosts' namespaces ended (their interfaces go with them)."""
        if self.hosts is not None:
            self.hosts.stop()
            self.hosts = None
