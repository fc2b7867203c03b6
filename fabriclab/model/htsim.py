"""An experiment as htsim reads it (pure): the topology file, the connection matrix and the
command line of the Ultra Ethernet Consortium's htsim (ultraethernet/uet-htsim), so the same
scenario runs in the reference simulator and on fabriclab's fabric (``fabriclab export
--format htsim FILE``).

* **Topology** (``-topo``, htsim's FatTree configuration): a leaf-spine as two tiers, a fat tree
  as three, each tier's downlink speed (whole Gbit/s), radix down and up, and downlink latency
  (fabriclab's per-link latency, switch and cable together; no separate switch latency). htsim
  derives the uplinks from the speeds and an integer oversubscription: fabrics whose uplinks
  do not divide so are refused naming the field.
* **Connection matrix** (``-tm``): host ``h<leaf>_<i>`` (``h<pod>_<edge>_<i>``) is node
  ``(leaf - 1) x hosts_per_leaf + i - 1``, ToR by ToR as htsim numbers them. Every transfer of
  every collective is a flow (one per connection of its job, as the agents split it). A
  collective's first step starts at 0 (the first collective of a batch) or when the collective
  before it is done (a barrier trigger counting every flow of it: each flow's
  ``send_done_trigger``); a later step of a rank starts when the rank has received everything
  of its step before (a barrier counting those flows: their ``recv_done_trigger``), as
  fabriclab's agents run it. Start times are picoseconds.
* **Command line**: the binary for the transport (``htsim_uec`` for uet, ``htsim_roce`` for
  rocev2 with DCQCN, ``htsim_hpcc`` for HPCC), the host link speed, MTU, queue size and ECN
  thresholds in packets, trimming, load balancing and the congestion control. Only
  ``htsim_uec`` reads the topology file; the others build their own fat tree of the same
  tiers, hosts and per-link latency from their arguments.

What htsim cannot take is listed in :attr:`HtsimExport.notes` (compute gaps: its triggers start
flows at once; Swift; rocev2 without PFC, which htsim's RoCE does not model).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from testbed.errors import ConfigError
from testbed.model.congestion import EcnMode
from traffic.workloads.schedules import chunk_sizes

BINARIES = {"uet": "htsim_uec", "rocev2": "htsim_roce", "hpcc": "htsim_hpcc"}


@dataclass
class HtsimExport:
    """One experiment's htsim inputs: file name -> text, the command line, and notes on what
    did not carry over."""

    name: str
    files: dict[str, str]
    command: list[str]
    notes: list[str] = field(default_factory=list)


def node_ids(exp) -> dict[str, int]:
    """fabriclab host -> htsim node, ToR by ToR (the topology's own order of hosts)."""
    by_access: dict[str, list[str]] = {}
    for host in exp.topology.hosts:
        by_access.setdefault(exp.topology.attachment(host.name).node, []).append(host.name)
    out, i = {}, 0
    for access in sorted(by_access, key=_natural):
        for host in sorted(by_access[access], key=_natural):
            out[host] = i
            i += 1
    return out


def _natural(name: str) -> tuple:
    """``leaf10`` after ``leaf9``: digits as numbers."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def _gbps(mbps: float, path: str) -> int:
    gbps = mbps / 1e3
    if gbps < 1 or abs(gbps - round(gbps)) > 1e-6:
        raise ConfigError(path, f"{gbps:g} Gbit/s: htsim's topology takes whole Gbit/s")
    return int(round(gbps))


def topology(exp, real_mbps: tuple[float, float], latency_ns: tuple[float, float]) -> str:
    """htsim's FatTree configuration of ``exp``'s fabric at the real rates (host, fabric links)
    and per-link latencies (queues come from ``-q``).

    Raises:
        ConfigError: a shape or rate htsim's FatTree cannot hold, naming the field.
    """
    fab = exp.fabric
    if fab.servers is not None or fab.topology not in ("leaf_spine", "fat_tree"):
        raise ConfigError("fabric.topology", f"{fab.topology}: htsim's FatTree holds "
                                             "leaf_spine and fat_tree fabrics of plain hosts")
    host, up = (_gbps(real_mbps[0], "fabric.host_link.rate_gbps"),
                _gbps(real_mbps[1], "fabric.fabric_link.rate_gbps"))
    nodes = len(exp.topology.hosts)
    if fab.topology == "leaf_spine":
        shape = fab.shape
        down, spines, leaves = shape["hosts_per_leaf"], shape["spines"], shape["leaves"]
        oversub = down * host / (spines * up)
        tiers = [(host, down, spines, latency_ns[0]), (up, leaves, 0, latency_ns[1])]
        podsize = nodes
    else:
        k = fab.shape["k"]
        oversub = (k // 2) * host / ((k // 2) * up)
        tiers = [(host, k // 2, k // 2, latency_ns[0]), (up, k // 2, k // 2, latency_ns[1]),
                 (up, k, 0, latency_ns[1])]
        podsize = k * k // 4
    if oversub < 1 - 1e-9 or abs(oversub - round(oversub)) > 1e-9:
        raise ConfigError("fabric.fabric_link.rate_gbps",
                          f"the ToRs' uplinks carry 1/{oversub:g} of their hosts' rate: "
                          "htsim's FatTree takes a whole oversubscription of at least 1")
    lines = [f"Nodes {nodes}", f"Tiers {len(tiers)}", f"Podsize {podsize}", ""]
    for i, (speed, radix_down, radix_up, ns) in enumerate(tiers):
        lines += [f"Tier {i}", f"Downlink_speed_Gbps {speed}", f"Radix_Down {radix_down}"]
        if radix_up:
            lines.append(f"Radix_Up {radix_up}")
        if i == 0 and round(oversub) > 1:
            lines.append(f"Oversubscribed {round(oversub)}")
        lines += [f"Downlink_Latency_ns {max(1, round(ns))}", "Switch_Latency_ns 0", ""]
    return "\n".join(lines)


def connection_matrix(exp, nodes: int | None = None) -> tuple[str, list[str]]:
    """The workload's flows and triggers (``nodes``: the simulated fabric's hosts, when it has
    more than ``exp``); with the notes on what did not carry over."""
    ids = node_ids(exp)
    flows: list[list[str]] = []  # each flow's tokens after "src->dst"
    triggers: list[str] = []
    notes: set[str] = set()
    after: int | None = None  # the barrier of the batch before, once it has one

    def trigger(count: int) -> int:
        triggers.append(f"trigger id {len(triggers) + 1} barrier count {count}")
        return len(triggers)

    batches = exp.workload.batches()
    for b, batch in enumerate(batches):
        ends: list[int] = []  # every job's last collective's flows: the batch ends with them
        for job in batch:
            previous: int | None = after
            for i, coll in enumerate(job.collectives):
                if coll.gap_s or coll.gaps:
                    notes.add("compute gaps before collectives are left out (htsim's triggers "
                              "start flows at once)")
                made = _collective(coll, job.connections, ids, previous, trigger, flows)
                if i == len(job.collectives) - 1:
                    ends += made
                elif made:  # the next collective of the job starts once this one is done
                    previous = _barrier(made, trigger, flows)
        if ends and b < len(batches) - 1:  # the next batch starts once this one is done
            after = _barrier(ends, trigger, flows)
    head = [f"Nodes {nodes or len(ids)}", f"Connections {len(flows)}"]
    if triggers:
        head.append(f"Triggers {len(triggers)}")
    return "\n".join(head + [" ".join(f) for f in flows] + triggers) + "\n", sorted(notes)


def _barrier(made: list[int], trigger, flows: list[list[str]]) -> int:
    """A barrier that the flows ``made`` fire as each completes; its id."""
    done = trigger(len(made))
    for f in made:
        flows[f] += ["send_done_trigger", str(done)]
    return done


def _collective(coll, connections: int, ids: dict[str, int], start_trigger: int | None,
                trigger, flows: list[list[str]]) -> list[int]:
    """One collective's flows appended to ``flows``; returns their indices."""
    made = []
    transfers = sorted(coll.schedule.transfers, key=lambda t: (t.step, t.src, t.dst))
    received: dict[tuple[int, int], list[int]] = {}  # (rank, step) -> flows into it
    steps_of = sorted({t.step for t in transfers})
    waits: dict[tuple[int, int], int] = {}  # (rank, step) -> the trigger its sends wait for
    for t in transfers:
        key = (t.src, t.step)
        if key not in waits:
            before = [s for s in steps_of if s < t.step and received.get((t.src, s))]
            if before:
                into = received[(t.src, before[-1])]
                waits[key] = trigger(len(into))
                for f in into:
                    flows[f] += ["recv_done_trigger", str(waits[key])]
            else:
                waits[key] = 0
        for size in chunk_sizes(t.nbytes, connections):
            if size <= 0:
                continue
            src, dst = ids[coll.hosts[t.src]], ids[coll.hosts[t.dst]]
            index = len(flows)
            start = (["trigger", str(waits[key])] if waits[key] else
                     ["trigger", str(start_trigger)] if start_trigger else ["start", "0"])
            flows.append([f"{src}->{dst}", "id", str(index + 1), *start, "size", str(size)])
            received.setdefault((t.dst, t.step), []).append(index)
            made.append(index)
    return made


def command(exp, names: dict[str, str], real_mbps: float, end_us: float,
            hop_us: float) -> tuple[list[str], list[str]]:
    """The htsim command line for the experiment's transport (``hop_us``: a link's latency,
    for the programs that build their own topology); with notes."""
    fab, notes = exp.fabric, []
    jobs = exp.workload.jobs
    kinds = {(j.transport, j.transport_options.congestion_control if j.transport == "rocev2"
              else "") for j in jobs}
    if len(kinds) != 1:
        raise ConfigError("workload.transport", "htsim runs one transport per simulation: "
                                                "export one variant at a time")
    (transport, cc), = kinds
    if transport == "tcp":
        raise ConfigError("workload.transport", "tcp: export rocev2 or uet (htsim's TCP is "
                                                "another program, not its reference transports)")
    binary = BINARIES["hpcc" if cc == "hpcc" else transport]
    packet = fab.mtu
    queue_pkts = max(1, math.floor((fab.queue_kb or 0) * 1024 / packet))
    args = [binary, "-topo", names["topo"], "-tm", names["cm"], "-nodes",
            str(hpcc_nodes(exp) if binary == "htsim_hpcc" else len(exp.topology.hosts)),
            "-linkspeed",
            f"{real_mbps:g}", "-mtu", str(packet), "-q", str(queue_pkts), "-end",
            str(math.ceil(end_us)), "-seed", "1"]
    if binary == "htsim_hpcc":  # it builds its own three-tier fat tree: no -topo
        del args[1:3]
        args += ["-hop_latency", f"{hop_us:g}"]
    elif binary == "htsim_roce":  # its -topo loses the queues (uet-htsim 40ccb05): its own
        args[1:3] = ["-tiers", "2" if fab.topology == "leaf_spine" else "3"]
        args += ["-hop_latency", f"{hop_us:g}"]
        notes.append("htsim_roce builds its own FatTree (-tiers, -nodes, -hop_latency: every "
                     "link at -linkspeed); it prints a line per packet event: keep the lines "
                     "with 'finished'")
    ecn = [e for e in fab.host_link.ecn if e.mode != EcnMode.OFF]
    thresholds = exp.port_ecn("host")[0]
    if transport == "uet":
        job = jobs[0]
        args += ["-sender_cc_algo", "nscc"] if job.transport_options.nscc else []
        if job.transport_options.rccc:
            args.append("-receiver_cc")
        spray = job.spray if job.spray is not None else True
        args += ["-load_balancing_algo", "reps"] if spray else ["-paths", "1"]
        if fab.host_link.trim is None and fab.fabric_link.trim is None:
            args.append("-disable_trim")
        if ecn:
            low, high = _ecn_packets(thresholds, packet)
            args += ["-ecn", str(low), str(high)]
    else:  # a path per flow by the switches' ECMP hash, as rocev2 keeps one per queue pair
        args += ["-strat", "ecmp_host", "-paths", "1"]
    if binary == "htsim_roce":
        if cc == "dcqcn":
            low, _high = _ecn_packets(thresholds, packet) if ecn else (queue_pkts // 4, 0)
            args += ["-dcqcn", str(max(1, low))]
        notes.append("htsim's RoCE is lossless (PFC at its input queues); fabriclab's rocev2 "
                     "runs " + ("lossless (fabric.pfc)" if fab.pfc.priorities else
                                "lossy, recovering losses by go-back-N"))
    elif binary == "htsim_hpcc":
        notes.append(f"htsim's HPCC runs over lossless queues (PFC), on a three-tier fat tree "
                     f"of {hpcc_nodes(exp)} hosts it builds itself (-nodes, -hop_latency), the "
                     "experiment's hosts its first: paths and round trips differ")
    if transport == "rocev2" and cc == "swift":
        raise ConfigError("workload.transport.congestion_control",
                          "swift: htsim has Swift only in its own program (htsim_swift), "
                          "with other options: not exported")
    return args, notes


def hpcc_nodes(exp) -> int:
    """htsim_hpcc's fat tree (three tiers, k^3/4 hosts): the least that holds ``exp``'s hosts
    (they take its first nodes, ToR by ToR)."""
    k = 4
    while k ** 3 // 4 < len(exp.topology.hosts):
        k += 2
    return k ** 3 // 4


def _ecn_packets(thresholds, packet: int) -> tuple[int, int]:
    """A port's ECN marking in packets (step: one threshold; RED: its two)."""
    if thresholds.mode == EcnMode.STEP:
        k = max(1, round(thresholds.k_bytes / packet))
        return k, k
    return (max(1, round(thresholds.kmin_bytes / packet)),
            max(1, round(thresholds.kmax_bytes / packet)))


def export(exp, end_us: float) -> HtsimExport:
    """``exp`` (one variant, or a file without any) as htsim's inputs; real units when the
    file is time-scaled (the emulated ones otherwise), ``end_us`` the simulated time's end.

    Raises:
        ConfigError: what htsim cannot hold, naming the field.
    """
    if exp.workload is None:
        raise ConfigError("workload", "nothing to export: the experiment has no workload")
    n = exp.time_scale.n if exp.time_scale else 1.0
    fab = exp.fabric
    real = (fab.host_link.rate_mbps * n, fab.fabric_link.rate_mbps * n)
    latency = (fab.host_link.delay_us / n * 1e3, fab.fabric_link.delay_us / n * 1e3)
    name = exp.variant or exp.name
    names = {"topo": f"{name}.topo", "cm": f"{name}.cm"}
    args, more = command(exp, names, real[0], end_us, latency[0] / 1e3)
    cm, notes = connection_matrix(exp, hpcc_nodes(exp) if args[0] == "htsim_hpcc" else None)
    files = {names["cm"]: cm}
    if "-topo" in args:
        files[names["topo"]] = topology(exp, real, latency)
    else:  # the shape is still checked: the same scenario, whichever program builds it
        topology(exp, real, latency)
    return HtsimExport(name, files, args, notes + more)
