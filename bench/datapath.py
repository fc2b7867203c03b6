#!/usr/bin/env python3
"""Benchmark (not a test): what a datapath costs per packet and switch hop on this machine.

Two hosts (network namespaces) joined by a chain of ``--hops`` switches, on each datapath in
turn: ``ebpf``, each switch ``testbed/linux/progs/switch.c`` on its two ports with a compiled
flow table (a /32 route each way); ``ovs``, each switch a bridge of its own private
``ovs-vswitchd`` (the userspace datapath, as fabriclab runs it where the kernel has no
openvswitch module) with the same two flows; ``ovs-kernel``, each switch a bridge of the
machine's Open vSwitch on the kernel datapath (where the openvswitch module exists). The
default is every datapath the machine has. With ``--vm`` the whole benchmark runs inside the
``vm`` backend's full-kernel guest, which has all three (its CPU is emulated: compare the
datapaths with each other there, not with the host's figures). Links between switches are veth pairs in the root
namespace; with ``--rate-mbps`` every switch port's egress is shaped (HTB and a bfifo of
``--queue-kb``) as a fabric's ports are. iperf3 runs
one TCP flow, then UDP datagrams of ``--udp-bytes`` as fast as it can send, each for
``--duration`` seconds; the machine's busy CPU over each run, divided by the packets delivered
times the hops, is the CPU per packet-hop (it includes both hosts' stacks and iperf3: an upper
bound on the datapath's own cost).

With ``--selections hash,flowlet,packet`` the eBPF chain runs once per selection method: each
switch reaches host b through a SELECT group of four buckets (all on its one port towards b,
so that every bucket is live and equally loaded: the decision scans all four, as a 4-way ECMP
group's would) chosen by that method, so the difference between the rows is the decision's
cost per packet-hop (``hash``: the 5-tuple's hash; ``flowlet``: the flowlet table and, at a
gap, the least-loaded port; ``packet``: the least-loaded port for every packet;
``flowlet_next``, ``packet_next``: the same, each bucket weighing the next switch's group's
path quality and its port towards b as well, two more reads per bucket and the group's own
quality published per packet; ``flowlet+rebalance``, ``flowlet_next+rebalance``: the
flowlets' reactive rebalancing as ``rebalance: true`` sets it, weighed at a quarter of the
packets past the hold: each bucket's rate estimate read, and the link's beyond it).

Usage: bench/datapath.py [--hops 3] [--duration 5] [--udp-bytes 8900] [--mtu 9000]
                         [--datapaths ebpf,ovs,ovs-kernel] [--rate-mbps R] [--queue-kb 256]
                         [--selections hash,flowlet,packet,packet_next] [--vm] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the ports' load estimate drains at 10 Gbit/s (the chain is unshaped: the figure is unused)
PORT_RATE_BYTES_S = 1_250_000_000
sys.path.insert(0, str(ROOT))

from controllers.routing.tables import FlowEntry  # noqa: E402
from testbed.linux.cpu import sample, usage  # noqa: E402
from testbed.linux.ebpfswitch import SELECTION, EbpfSwitches  # noqa: E402
from testbed.linux import ovs  # noqa: E402
from testbed.linux.capabilities import probe_ovs_kernel_datapath  # noqa: E402
from testbed.linux.netlink import Netlink  # noqa: E402
from testbed.plan import tss  # noqa: E402
from testbed.plan.tcplan import plan_shaping  # noqa: E402

A, B = "10.78.0.1", "10.78.0.2"


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=120)


def route(dst: str, port: int) -> FlowEntry:
    return FlowEntry(200, (("eth_type", 0x0800), ("ipv4_dst", (dst, "255.255.255.255"))),
                     (("output", port),))


def ports_of(tag: str, hops: int) -> list[tuple[str, str]]:
    """Switch i's two ports: (towards a, towards b)."""
    return [(f"{tag}a0" if i == 1 else f"{tag}s{i}l", f"{tag}b0" if i == hops else f"{tag}s{i}r")
            for i in range(1, hops + 1)]


def build_links(tag: str, hops: int, mtu: int) -> None:
    """Hosts ``<tag>a`` and ``<tag>b`` and the veths between switches 1..hops."""
    macs = {"a": "02:00:0a:4e:00:01", "b": "02:00:0a:4e:00:02"}
    for side, ip in (("a", A), ("b", B)):
        sh("ip", "netns", "add", f"{tag}{side}")
        sh("ip", "link", "add", f"{tag}{side}0", "type", "veth", "peer", "name", f"{tag}{side}x",
           "mtu", str(mtu))
        sh("ip", "link", "set", f"{tag}{side}x", "netns", f"{tag}{side}")
        sh("ip", "-n", f"{tag}{side}", "link", "set", f"{tag}{side}x", "name", "eth0",
           "address", macs[side], "mtu", str(mtu))
        sh("ip", "-n", f"{tag}{side}", "addr", "add", f"{ip}/24", "dev", "eth0")
        sh("ip", "-n", f"{tag}{side}", "link", "set", "eth0", "up")
        sh("ip", "-n", f"{tag}{side}", "link", "set", "lo", "up")
        sh("ip", "link", "set", f"{tag}{side}0", "mtu", str(mtu), "up")
    sh("ip", "-n", f"{tag}a", "neigh", "replace", B, "lladdr", macs["b"], "dev", "eth0")
    sh("ip", "-n", f"{tag}b", "neigh", "replace", A, "lladdr", macs["a"], "dev", "eth0")
    for i in range(1, hops):
        left, right = f"{tag}s{i}r", f"{tag}s{i + 1}l"
        sh("ip", "link", "add", left, "type", "veth", "peer", "name", right, "mtu", str(mtu))
        sh("ip", "link", "set", left, "up")
        sh("ip", "link", "set", right, "up")


def shape(tag: str, hops: int, mtu: int, rate_mbps: float, queue_kb: int) -> None:
    """Every switch port's egress shaped as a fabric's ports are."""
    plan = plan_shaping(rate_mbps, mtu, queue_kb=queue_kb)
    with Netlink() as nl:
        for pair in ports_of(tag, hops):
            for ifname in pair:
                nl.shape(ifname, plan)


#: --selections: the group's buckets towards b, and a flowlet gap (us)
GROUP_BUCKETS = 4
FLOWLET_GAP_US = 100
#: ``+rebalance``: the flowlets' reactive rebalancing as ``rebalance: true`` sets it (a quality
#: delta and a chance per packet past the hold of 25 % each)
REBALANCE = (25, 25)


def ebpf_chain(tag: str, hops: int, state: Path, selection: str | None = None):
    """The switches as eBPF switches; returns their handle (closed at teardown). With
    ``selection``, the route to b goes through a SELECT group chosen by it."""
    switches = EbpfSwitches(Path(f"/sys/fs/bpf/fabriclab/{tag}"), state)
    with Netlink() as nl:
        for i, (port1, port2) in enumerate(ports_of(tag, hops), start=1):
            switches.add_port(nl, i, 1, port1, PORT_RATE_BYTES_S)
            switches.add_port(nl, i, 2, port2, PORT_RATE_BYTES_S)
            to_b = route(B, 2)
            if selection is not None:
                method, _, extra = selection.partition("+")
                ahead = [(i + 1, 1, i + 1, 2)] * GROUP_BUCKETS if (
                    method.endswith("_next") and i < hops) else None
                switches.set_group(i, 1, "select", [2] * GROUP_BUCKETS, basis=i,
                                   selection=method, gap_us=FLOWLET_GAP_US,
                                   beyond=ahead, rebalance=REBALANCE if extra else (0, 0))
                to_b = FlowEntry(200, to_b.match, (("group", 1),))
            switches.set_table(i, tss.compile_table([route(A, 1), to_b]))
    return switches


class OvsChain:
    """The switches as Open vSwitch bridges, one private vswitchd each (userspace datapath)."""

    def __init__(self, tag: str, hops: int, mtu: int, state: Path) -> None:
        self.instances = []
        for i, (port1, port2) in enumerate(ports_of(tag, hops), start=1):
            inst = ovs.Instance(state / f"{tag}-ovs{i}", f"ovs{i}")
            self.instances.append(inst)
            inst.start_db({"userspace-tso-enable": "true"})
            inst.start_switch()
            ovs.create_bridges([ovs.BridgeSpec(f"{tag}br{i}", f"{i:016x}",
                                               ((port1, 1), (port2, 2)))], tag,
                               ovs.PRIVATE_DATAPATH_TYPE, "tcp:127.0.0.1:9", mtu, db=inst.db)
            mgmt = f"unix:{inst.directory / f'{tag}br{i}.mgmt'}"
            for flow in (f"ip,nw_dst={A},actions=output:1", f"ip,nw_dst={B},actions=output:2"):
                sh("ovs-ofctl", "-O", "OpenFlow15", "add-flow", mgmt, f"priority=200,{flow}")

    def close(self) -> None:
        for inst in self.instances:
            for daemon in ("ovs-vswitchd", "ovsdb-server"):
                pid = inst.pids.get(daemon)
                if pid:
                    try:
                        os.kill(pid, 15)
                    except ProcessLookupError:
                        pass
        time.sleep(0.5)
        for inst in self.instances:
            sh("rm", "-rf", str(inst.directory), check=False)


class OvsKernelChain:
    """The switches as bridges of the machine's Open vSwitch on the kernel datapath."""

    def __init__(self, tag: str, hops: int, mtu: int) -> None:
        ovs.check_running()
        self.bridges = [f"{tag}br{i}" for i in range(1, hops + 1)]
        ovs.create_bridges([ovs.BridgeSpec(name, f"{i:016x}", ((port1, 1), (port2, 2)))
                            for i, (name, (port1, port2))
                            in enumerate(zip(self.bridges, ports_of(tag, hops)), start=1)],
                           tag, "system", "tcp:127.0.0.1:9", mtu)
        for name in self.bridges:
            for flow in (f"ip,nw_dst={A},actions=output:1", f"ip,nw_dst={B},actions=output:2"):
                sh("ovs-ofctl", "-O", "OpenFlow15", "add-flow", name, f"priority=200,{flow}")

    def close(self) -> None:
        ovs.delete_bridges(self.bridges)


DATAPATHS = ("ebpf", "ovs", "ovs-kernel")


def available() -> list[str]:
    """The datapaths this machine has."""
    return [d for d in DATAPATHS if d != "ovs-kernel" or probe_ovs_kernel_datapath()]


def teardown(tag: str, hops: int, switches) -> None:
    if switches is not None:
        switches.close()
    for name in [f"{tag}a0", f"{tag}b0", *(f"{tag}s{i}r" for i in range(1, hops))]:
        sh("ip", "link", "del", name, check=False)
    for side in "ab":
        sh("ip", "netns", "del", f"{tag}{side}", check=False)
    sh("rm", "-rf", f"/sys/fs/bpf/fabriclab/{tag}", check=False)


def iperf(tag: str, duration: int, udp_bytes: int | None) -> dict:
    server = subprocess.Popen(["ip", "netns", "exec", f"{tag}b", "iperf3", "-s", "-1", "-J"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        time.sleep(0.5)
        cmd = ["ip", "netns", "exec", f"{tag}a", "iperf3", "-c", B, "-t", str(duration), "-J"]
        if udp_bytes:
            cmd += ["-u", "-b", "0", "-l", str(udp_bytes)]
        before = sample([])
        client = sh(*cmd)
        after = sample([])
        server.wait(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    doc = json.loads(client.stdout)
    end = doc["end"]
    cpu = usage(before, after)
    if udp_bytes:
        s = end["sum"]
        delivered = s["packets"] - s["lost_packets"]
        return {"kind": "udp", "bytes": udp_bytes, "sent_pps": s["packets"] / s["seconds"],
                "delivered_pps": delivered / s["seconds"], "busy_cores": cpu.busy_cores,
                "mbps": delivered * udp_bytes * 8 / s["seconds"] / 1e6}
    s = end["sum_received"]
    return {"kind": "tcp", "mbps": s["bits_per_second"] / 1e6, "busy_cores": cpu.busy_cores,
            "seconds": s["seconds"]}


def measure(datapath: str, args, tag: str, selection: str | None = None) -> list[dict]:
    switches = None
    rows = []
    try:
        build_links(tag, args.hops, args.mtu)
        if args.rate_mbps:
            shape(tag, args.hops, args.mtu, args.rate_mbps, args.queue_kb)
        state = Path("/run/fabriclab")
        if datapath == "ebpf":
            switches = ebpf_chain(tag, args.hops, state, selection)
        elif datapath == "ovs-kernel":
            switches = OvsKernelChain(tag, args.hops, args.mtu)
        else:
            switches = OvsChain(tag, args.hops, args.mtu, state)
        time.sleep(1.0)  # vswitchd: its ports polled
        for udp in (None, args.udp_bytes):
            row = iperf(tag, args.duration, udp)
            # packets through the chain per second: UDP datagrams delivered, or TCP segments
            # of one MSS (MTU - 52) at the measured goodput
            pps = row["delivered_pps"] if udp else row["mbps"] * 1e6 / 8 / (args.mtu - 52)
            row.update(datapath=datapath if selection is None else f"{datapath}:{selection}",
                       hops=args.hops, rate_mbps=args.rate_mbps,
                       us_per_packet_hop=row["busy_cores"] * 1e6 / (pps * args.hops)
                       if pps else None)
            rows.append(row)
    finally:
        teardown(tag, args.hops, switches)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hops", type=int, default=3)
    parser.add_argument("--duration", type=int, default=5)
    parser.add_argument("--udp-bytes", type=int, default=8900)
    parser.add_argument("--mtu", type=int, default=9000)
    parser.add_argument("--datapaths", default=None,
                        help=f"comma-separated, of {', '.join(DATAPATHS)} "
                             "(default: every one the machine has)")
    parser.add_argument("--rate-mbps", type=float, default=0.0)
    parser.add_argument("--queue-kb", type=int, default=256)
    parser.add_argument("--selections", default=None,
                        help="ebpf: comma-separated group selection methods (hash, flowlet, "
                             "packet, flowlet_next, packet_next; flowlet+rebalance, "
                             "flowlet_next+rebalance), one run each through a SELECT group")
    parser.add_argument("--vm", action="store_true",
                        help="run inside the vm backend's full-kernel guest")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    selections = args.selections.split(",") if args.selections else [None]
    bad = sorted(str(s) for s in set(selections) - {None, "hash", "dp_hash", *SELECTION,
                                                     "flowlet+rebalance",
                                                     "flowlet_next+rebalance"})
    if bad:
        parser.error(f"--selections: unknown {', '.join(bad)} (of {', '.join(SELECTION)})")
    if args.vm:
        return in_guest(args)
    names = args.datapaths.split(",") if args.datapaths else available()
    unknown = sorted(set(names) - set(DATAPATHS))
    if unknown:
        parser.error(f"--datapaths: unknown {', '.join(unknown)} (of {', '.join(DATAPATHS)})")
    if "ovs-kernel" in names and not probe_ovs_kernel_datapath():
        parser.error("--datapaths: ovs-kernel needs the openvswitch kernel module, which this "
                     "kernel lacks (try --vm)")
    rows = []
    for datapath in names:
        for selection in (selections if datapath == "ebpf" else [None]):
            rows += measure(datapath, args, f"dp{os.getpid() % 100000}", selection)
    print(f"kernel {os.uname().release}, {os.cpu_count()} CPUs")
    print(f"{'datapath':13} {'kind':4} {'hops':>4} {'shaped':>6} {'Mbit/s':>9} {'pkt/s':>9} "
          f"{'cores':>6} {'us/pkt-hop':>10}")
    for r in rows:
        pps = r.get("delivered_pps") or r["mbps"] * 1e6 / 8 / (args.mtu - 52)
        print(f"{r['datapath']:13} {r['kind']:4} {r['hops']:>4} {r['rate_mbps'] or '-':>6} "
              f"{r['mbps']:>9.0f} {pps:>9.0f} {r['busy_cores']:>6.2f} "
              f"{r['us_per_packet_hop'] or 0:>10.2f}")
    print("TCP packets are MSS-sized equivalents of the goodput (segmentation offload moves "
          "fewer, larger ones); UDP counts the datagrams delivered.")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


def in_guest(args) -> int:
    """This benchmark, with the same options, inside the full-kernel guest; its table printed
    here, its rows written to ``--json``."""
    from testbed.linux import bpf
    from testbed.linux.ebpfswitch import PROGRAM
    from testbed.runs.registry import Registry
    from testbed.vm import guest

    state = Path("/run/fabriclab")
    obj = bpf.build(PROGRAM, state)  # the guest has no compiler: built here, carried in
    opts = [f"--hops {args.hops}", f"--duration {args.duration}",
            f"--udp-bytes {args.udp_bytes}", f"--mtu {args.mtu}",
            f"--rate-mbps {args.rate_mbps}", f"--queue-kb {args.queue_kb}"]
    if args.datapaths:
        opts.append(f"--datapaths {args.datapaths}")
    if args.selections:
        opts.append(f"--selections {args.selections}")
    job = ("mkdir -p /run/fabriclab && cp -r /job/bpf /run/fabriclab/\n"
           f"python3 bench/datapath.py {' '.join(opts)} --json \"$FABRICLAB_OUT/rows.json\"\n")
    image = guest.ensure_image(log=print)
    work = state / "vm" / f"bench-datapath-{time.strftime('%Y%m%d-%H%M%S')}"
    result = guest.run(image, job, {f"bpf/{obj.parent.name}/{obj.name}": obj}, work,
                       Registry(state), timeout_s=3600)
    print(result.output.rstrip())
    print(f"guest run: exit {result.returncode} after {result.duration_s:.0f} s "
          f"(console: {result.console})")
    if args.json and (result.out_dir / "rows.json").exists():
        rows = json.loads((result.out_dir / "rows.json").read_text())
        args.json.write_text(json.dumps([dict(r, vm=True) for r in rows], indent=1))
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
