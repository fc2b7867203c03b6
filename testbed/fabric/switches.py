"""A fabric's switches on this machine, on the datapath chosen: eBPF switches (the program on
every switch port, their tables and groups in maps, one OpenFlow agent connecting them to the
controller), or Open vSwitch bridges (the machine's, on its kernel datapath, or private
``ovsdb-server`` and ``ovs-vswitchd`` pairs on the userspace datapath, started in parallel);
and the send buffer the userspace datapath needs while they start.

:class:`Switches` is a part of :class:`testbed.fabric.fabric.Fabric`."""

from __future__ import annotations

import os
import ssl
import time
from pathlib import Path
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from testbed.errors import TestbedError
from testbed.fabric.services import FabricRun
from testbed.linux import ovs, procfs
from testbed.linux.ebpfswitch import EbpfSwitches
from testbed.linux.netlink import Netlink
from testbed.linux.pki import RunPki
from testbed.linux.rawnl import LinkEvents
from testbed.model.share import LocalShare
from testbed.model.spec import Datapath, TestbedSpec
from testbed.model.topology import shard_switches
from testbed.paths import SWITCH_MGMT_DIR
from testbed.plan.portplan import send_buffer_bytes, switch_queue_bytes
from testbed.runs.registry import Role
from testbed.switch.agent import SwitchAgent, SwitchSpec
from testbed.openflow.session import Port

#: private vswitchds started at once (each sleeps half a second calibrating its TSC)
STARTUP_WORKERS = 16
SEND_BUFFER = "net.core.wmem_default"


class Switches:
    """The switches built here.

    Args:
        spec: the fabric's settings (its datapath resolved).
        share: what of the fabric is built here.
        run: the fabric's run (its record names the bridges and daemons before they start).
        netlink: the build's netlink socket.
        ovs_datapath: Open vSwitch's datapath type here (``system`` or ``netdev``).
        warnings: where what the build could not do as asked is said.
    """

    def __init__(self, spec: TestbedSpec, share: LocalShare, run: FabricRun, netlink: Netlink,
                 ovs_datapath: str, warnings: list[str]) -> None:
        self.spec, self.share, self.run = spec, share, run
        self.netlink = netlink
        self.ovs_datapath = ovs_datapath
        self.warnings = warnings
        self.instances: list[ovs.Instance] = []
        self.switch_instance: dict[str, ovs.Instance] = {}
        self.agent: SwitchAgent | None = None  # the eBPF switches' OpenFlow agent
        self.ebpf: EbpfSwitches | None = None  # their program and maps
        self.ebpf_ports: dict[str, tuple[int, int]] = {}  # port -> (switch index, number)

    @property
    def ebpf_datapath(self) -> bool:
        return self.spec.emulator.datapath == Datapath.EBPF

    # -- the send buffer -----------------------------------------------------------------------
    def raise_send_buffer(self, red_marking: bool) -> None:
        """Let the userspace switches' sockets hold every queue full at once, while they are
        created.

        The userspace datapath sends every packet of a vswitchd through one AF_PACKET socket,
        and a packet in a port's queue counts against that socket's send buffer until it
        leaves. With the kernel's default buffer (net.core.wmem_default, 208 KiB) the queues of
        an instance together hold about 110 KiB of jumbo frames; beyond that the switch drops
        in silence (no qdisc or interface counter sees it). The socket takes the default when it
        is created, during the build (the controller's first LLDP probes): raise it until the
        fabric is programmed, then restore it (the run record keeps the old value until then).
        """
        if self.ebpf_datapath:  # no switch sends through a socket there
            return
        want = send_buffer_bytes(switch_queue_bytes(self.spec, red_marking))
        old = procfs.read_sysctl(SEND_BUFFER)
        if want <= int(old):
            return
        if not os.access(procfs.sysctl_path(SEND_BUFFER), os.W_OK):
            # the machine's own setting, read-only in a namespace machine (its host sets it:
            # testbed.cluster.nscluster does)
            self.warnings.append(f"{SEND_BUFFER} is {old} here and cannot be raised from this "
                                 "network namespace: the switches' queues may drop in silence "
                                 f"beyond about half of it; raise it to {want} on the host")
            return
        self.run.record.sysctls[SEND_BUFFER] = old
        self.run.save()
        procfs.write_sysctl(SEND_BUFFER, str(want))

    def restore_sysctls(self) -> None:
        """Put back the sysctls raised for the build (their sockets exist by now)."""
        record = self.run.record
        for name, value in record.sysctls.items():
            procfs.write_sysctl(name, value)
        if record.sysctls:
            record.sysctls = {}
            self.run.save()

    # -- the build -----------------------------------------------------------------------------
    @property
    def kernel_ovs(self) -> bool:
        """Whether the switches here are bridges of the machine's own Open vSwitch (kernel
        datapath: one SSL setting for all its bridges)."""
        return not self.ebpf_datapath and self.ovs_datapath != "netdev"

    @property
    def socket_dir(self) -> Path:
        """Where a unix socket for the controller may be: Open vSwitch connects only to one
        in its own run directory (the machine's, for the kernel datapath; root's, 0755)."""
        return Path(ovs.SYSTEM_RUNDIR)

    def create(self, controller: tuple[str, int], pki: RunPki | None,
               tls: Callable[[], ssl.SSLContext | None], target: str | None = None) -> None:
        """Every switch here, connecting to the controller at ``controller`` (over TLS with
        the run's certificates ``pki``; ``tls`` makes the eBPF agent's client context), or at
        the Open vSwitch ``target`` the controller here gives (``unix:PATH``)."""
        if self.spec.controller.tls and pki is None:
            raise TestbedError("controller.tls: no certificate of the run reached this "
                               "machine's switches (its coordinator speaks plain TCP)")
        if self.ebpf_datapath:
            self._create_ebpf(controller, tls())
            return
        topo = self.share.topo
        specs = {sw.name: ovs.BridgeSpec(sw.name, sw.dpid_hex,
                                         tuple((l.end(sw.name).ifname, p)
                                               for p, l in topo.ports(sw.name).items()))
                 for sw in self.share.switches()}
        self.run.record.bridges = sorted(specs)
        self.run.save()
        address, port = controller
        target = target or f"{'ssl' if pki is not None else 'tcp'}:{address}:{port}"
        # a controller of the user's may speak any version (os-ken's LLDP discovery: to 1.4)
        protocols = ("OpenFlow15" if self.spec.controller.own
                     else "OpenFlow10,OpenFlow13,OpenFlow14,OpenFlow15")
        if self.ovs_datapath != "netdev":
            if pki is not None:
                raise TestbedError("controller.tls: the machine's Open vSwitch (kernel "
                                   "datapath) keeps one SSL setting for all its bridges, which "
                                   "fabriclab does not change; use emulator.datapath ebpf, or "
                                   "leave controller.tls false")
            ovs.create_bridges(list(specs.values()), self.run.record.run_id, self.ovs_datapath,
                               target, self.spec.fabric.mtu, protocols)
            return
        self._create_private(specs, target, protocols, pki)

    def _create_private(self, specs: dict[str, ovs.BridgeSpec], target: str, protocols: str,
                        pki: RunPki | None) -> None:
        """Private vswitchds on the userspace datapath, each serving a shard of the switches."""
        wanted = self.spec.emulator.vswitchd_instances
        shards = shard_switches(self.share.topo, len(specs) if wanted == "auto" else int(wanted),
                                frozenset(specs))
        run = self.run
        instances = [ovs.Instance(run.run_dir / f"ovs{i}", f"ovs{i}") for i in range(len(shards))]
        self.instances = instances
        self.switch_instance = {n: inst for inst, names in zip(instances, shards) for n in names}
        mtu = self.spec.fabric.mtu

        def start(inst: ovs.Instance, names: list[str]) -> None:
            inst.start_db({"userspace-tso-enable": "true",
                           **self.spec.emulator.ovs_other_config})
            run.track_process(inst.pids["ovsdb-server"], Role.ovs(inst.name, "ovsdb-server"))
            inst.start_switch()
            run.track_process(inst.pids["ovs-vswitchd"], Role.ovs(inst.name, "ovs-vswitchd"))
            if pki is not None:
                ovs.set_ssl(pki.switch_key, pki.switch_cert, pki.ca, inst.db)
            ovs.create_bridges([specs[n] for n in names], run.record.run_id,
                               ovs.PRIVATE_DATAPATH_TYPE, target, mtu, protocols, db=inst.db)

        # daemons start mostly asleep (vswitchd calibrates its TSC for 0.5 s): in parallel
        with ThreadPoolExecutor(max_workers=STARTUP_WORKERS) as pool:
            for future in [pool.submit(start, i, n) for i, n in zip(instances, shards)]:
                future.result()
        run.save()

    def _create_ebpf(self, controller: tuple[str, int], tls: ssl.SSLContext | None) -> None:
        """The switches here as eBPF switches: the program on every switch port, one switch
        index each in the maps, and their agent connected to the controller (it installs what
        the controller sets)."""
        self.ebpf = EbpfSwitches(self.run.pin_dir() / "switch", self.run.registry.state_dir)
        topo, specs = self.share.topo, {}
        for index, sw in enumerate(self.share.switches(), start=1):
            ports = []
            for number, link in sorted(topo.ports(sw.name).items()):
                ifname = link.end(sw.name).ifname
                self.ebpf.add_port(self.netlink, index, number, ifname,
                                   int(link.rate_mbps * 1e6 / 8))
                self.ebpf_ports[ifname] = (index, number)
                mac = f"02:fb:00:{index >> 8 & 0xFF:02x}:{index & 0xFF:02x}:{number & 0xFF:02x}"
                ports.append(Port(number, ifname, mac, speed_kbps=int(link.rate_mbps * 1000)))
            peers = {number: link.other(sw.name).node
                     for number, link in topo.ports(sw.name).items() if link.tier == "fabric"}
            specs[sw.name] = SwitchSpec(index, sw.dpid, ports, peers)
        self.agent = SwitchAgent(self.ebpf, specs, controller, LinkEvents(), tls=tls,
                                 mgmt_dir=self.run.run_dir / SWITCH_MGMT_DIR,
                                 notify=self.spec.emulator.fault_notices)
        self.agent.start()

    # -- readings ------------------------------------------------------------------------------
    def states(self) -> dict[str, tuple[bool, int]]:
        """Each switch here: connected to its controller, and how many flows it holds."""
        if self.agent is not None:
            return self.agent.states()
        return ovs.switch_states({name: self.switch_instance.get(name)
                                  for name in self.run.record.bridges})

    def notes(self) -> list[str]:
        """What the eBPF switches' OpenFlow agent saw go wrong (its errors, then its
        disconnects)."""
        return [] if self.agent is None else self.agent.errors + self.agent.disconnects

    def refusals(self) -> list[str]:
        """Version negotiations the eBPF switches refused (no version in common with the
        controller), each naming both sides' versions."""
        return [] if self.agent is None else list(self.agent.refusals)

    def vswitchd_pids(self) -> dict[str, int]:
        """Each vswitchd serving the switches here: the private ones (userspace datapath),
        else the system's; none on the eBPF datapath or where no switch is built."""
        if self.ebpf_datapath or not any(True for _ in self.share.switches()):
            return {}
        if self.instances:
            return {inst.name: inst.pids["ovs-vswitchd"] for inst in self.instances}
        return {f"system{i}": pid for i, pid in enumerate(ovs.vswitchd_pids())}

    def serving(self, vswitchd: str) -> str:
        """The switches a vswitchd serves, comma-separated (the system's: every bridge)."""
        return ",".join(sorted(s for s, i in self.switch_instance.items()
                               if i.name == vswitchd) or self.run.record.bridges)

    def dead(self) -> set[str]:
        """Switches whose private vswitchd is gone (killed, crashed)."""
        dead = set()
        for name, inst in self.switch_instance.items():
            stat = procfs.read_stat(inst.pids.get("ovs-vswitchd", 0))
            if stat is None or stat.state in ("Z", "X"):
                dead.add(name)
        return dead

    def db(self, switch: str) -> str | None:
        """The OVSDB of a switch's private vswitchd (None: the machine's, or none)."""
        inst = self.switch_instance.get(switch)
        return inst.db if inst is not None else None

    def set_port_rate(self, ifname: str, rate_bytes_s: int) -> None:
        """A port's rate as the eBPF switches' load accounting drains it (a degraded link's;
        switch-local adaptive routing sees the port fill the sooner). Open vSwitch keeps no
        load: nothing to do."""
        if self.ebpf is not None and ifname in self.ebpf_ports:
            self.ebpf.set_port_rate(*self.ebpf_ports[ifname], rate_bytes_s)

    def offered_bytes(self, names: set[str], frame: int) -> dict[str, int] | None:
        """Port -> bytes an eBPF switch sent to it, and towards it while it was not live (as
        full frames of ``frame`` bytes); None on Open vSwitch (its switches do not count)."""
        if self.ebpf is None:
            return None
        return {name: self.ebpf.sent_bytes(*self.ebpf_ports[name])
                + self.ebpf.dead_drops(*self.ebpf_ports[name]) * frame
                for name in names if name in self.ebpf_ports}

    def notices(self) -> list[tuple[float, str, int, tuple[int, ...]]]:
        """What the eBPF switches' fault notices did so far (:mod:`testbed.plan.notices`):
        (seconds ago, switch, group, the ports taken out of it; none: all back)."""
        if self.agent is None:
            return []
        now = time.monotonic()
        return [(now - t, name, gid, ports) for t, name, gid, ports in list(self.agent.notice_log)]

    def largest_packets(self, names: set[str]) -> dict[str, int]:
        """Port -> the largest packet an eBPF switch sent to it so far, bytes (none on Open
        vSwitch)."""
        if self.ebpf is None:
            return {}
        return {name: self.ebpf.largest_packet(*self.ebpf_ports[name])
                for name in names if name in self.ebpf_ports}

    def close(self) -> None:
        """The eBPF switches' agent and maps closed (bridges and daemons go with the run
        record)."""
        for service in ("agent", "ebpf"):
            if getattr(self, service) is not None:
                getattr(self, service).close()
                setattr(self, service, None)
