"""The UDP transports on a real fabric: each completes a collective with every byte accounted
for, and spraying spreads one queue pair over every uplink."""

from __future__ import annotations

import pytest

from tests.integration.conftest import DATAPATHS, experiment
from traffic.agents.runner import run_job

LS = ("version: 1\nfabric:\n  topology: leaf_spine\n  leaves: 2\n  spines: 2\n"
      "  hosts_per_leaf: 2\n  host_link: {rate_mbps: 10}\n  fabric_link: {rate_mbps: 10}\n"
      "emulator: {queue_sample_ms: 0}\n")


@DATAPATHS
@pytest.mark.parametrize("transport", ["rocev2", "uet"])
def test_a_udp_transport_completes_an_all_reduce_with_every_byte(make_fabric, transport,
                                                                 datapath):
    exp = experiment(LS + "workload:\n  collectives:\n    - {op: all_reduce, size: 1MiB, "
                          "ranks: 4}\n", datapath)
    fabric = make_fabric(exp)
    (job,) = exp.workload.jobs
    (result,) = run_job(fabric, list(job.collectives), timeout_s=120, transport=transport)
    coll = job.collectives[0]
    payload = sum(t.nbytes for t in coll.schedule.transfers)
    t = result.transport
    assert t["transport"] == transport
    # every byte of every transfer went out (more only if something was resent) and arrived
    assert t["tx_bytes"] >= payload and t["tx_packets"] >= t["rx_packets"] - t["rx_duplicates"]
    assert t["goodput_ratio"] is not None and 0.0 < t["goodput_ratio"] <= 1.0
    assert 0.5 < result.efficiency <= 1.15, result


def _uplink_packets(fabric, before: dict, after: dict) -> dict[str, int]:
    return {p: after[p]["queue"]["packets"] - before[p]["queue"]["packets"]
            for p in ("leaf1-eth3", "leaf1-eth4")}


@pytest.mark.parametrize("spray,selection,datapath", [
    (True, "hash", "ovs"), (False, "hash", "ovs"), (True, "dp_hash", "ovs"),
    (True, "hash", "ebpf"), (False, "hash", "ebpf")])
def test_spraying_spreads_one_queue_pair_over_every_uplink(make_fabric, spray, selection,
                                                           datapath):
    # with dp_hash the datapath hashes each packet's 5-tuple itself (no upcall per entropy); the
    # eBPF datapath always does
    exp = experiment(LS + f"controller: {{ecmp_selection: {selection}}}\n"
                          "workload:\n  collectives:\n    - {op: send_recv, size: 2MiB, "
                          "ranks: [h1_1, h2_1]}\n", datapath)
    fabric = make_fabric(exp)
    (job,) = exp.workload.jobs
    before = fabric.congestion()
    (result,) = run_job(fabric, list(job.collectives), connections=1, timeout_s=120,
                        transport="uet", spray=spray)
    up = _uplink_packets(fabric, before, fabric.congestion())
    data = 2 * 1024 * 1024 // 8900  # packets of the one queue pair
    print(spray, up, result.transport)
    if spray:  # both uplinks carry a real share
        assert min(up.values()) > data // 5, up
    else:  # one path: the other uplink sees (almost) nothing
        assert min(up.values()) < data // 20 < max(up.values()), up


@pytest.mark.parametrize("transport", ["rocev2", "uet"])
def test_random_loss_on_the_fabric_links_is_recovered(make_fabric, transport):
    # 2 % loss, dropped by the eBPF program at the fabric links' ends (no netem here)
    exp = experiment(LS.replace("fabric_link: {rate_mbps: 10}",
                                "fabric_link: {rate_mbps: 10, loss_percent: 2}")
                     + "workload:\n  collectives:\n    - {op: send_recv, size: 2MiB, "
                       "ranks: [h1_1, h2_1]}\n")
    fabric = make_fabric(exp)
    (job,) = exp.workload.jobs
    before = fabric.congestion()
    (result,) = run_job(fabric, list(job.collectives), connections=1, timeout_s=120,
                        transport=transport)
    from testbed.model.congestion import summarize_congestion
    lost = summarize_congestion(before, fabric.congestion(), {})["link_loss_drops"]
    t = result.transport
    print(transport, lost, t)
    assert lost > 0 and t["tx_retransmitted"] >= 1, (lost, t)  # lost, then resent
    assert t["tx_bytes"] >= 2 * 1024 * 1024 and result.efficiency > 0.3


def test_a_trimming_switch_turns_an_incasts_overflow_into_nacks_uet_answers(make_fabric):
    """Eight uet senders into one 10 Mbit/s host port that trims above 16 KiB: the ports trim
    (the headers overtake in a strict class), every trimmed header reaches its receiver,
    which NACKs it, and the sender resends it (each NACK answered); rocev2's receiver would
    discard them (unit-tested)."""
    exp = experiment(
        "version: 1\nfabric:\n  topology: leaf_spine\n  leaves: 2\n  spines: 1\n"
        "  hosts_per_leaf: 5\n  host_link: {rate_mbps: 10, trim: {threshold_kb: 16}}\n"
        "  fabric_link: {rate_mbps: 20, trim: {threshold_kb: 16}}\n  queue: {size_kb: 64}\n"
        "  traffic_classes: {dscp_to_priority: {46: 7}, strict: [7]}\n"
        "emulator: {datapath: ebpf, queue_sample_ms: 0}\nworkload:\n  collectives:\n"
        "    - {op: flows, size: 512KiB, pairs: [[h2_1, h1_1], [h2_2, h1_1], [h2_3, h1_1], "
        "[h2_4, h1_1], [h1_2, h1_1], [h1_3, h1_1]]}\n")
    fabric = make_fabric(exp)
    (job,) = exp.workload.jobs
    before = fabric.congestion()
    (result,) = run_job(fabric, list(job.collectives), timeout_s=120, transport="uet")
    from testbed.model.congestion import summarize_congestion
    trimmed = summarize_congestion(before, fabric.congestion(), {})["trimmed"]
    t = result.transport
    assert trimmed > 0, t
    # every trimmed header reaches its receiver, which NACKs it (the headers' strict class
    # has room: a header is dropped only when even it does not fit)
    assert t["rx_trimmed"] == trimmed, (trimmed, t)
    assert t["tx_trim_naks"] == t["rx_trimmed"] and t["tx_retransmitted"] >= t["tx_trim_naks"]
    assert t["tx_timeouts"] == 0, t
    assert t["tx_bytes"] >= 6 * 512 * 1024


_INT_RECEIVER = """
import socket, sys
from traffic.transports.packet import Packet
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 4799))
s.settimeout(20)
print("ready", flush=True)
pkt = Packet.decode(s.recv(65536))
print(";".join(f"{h.ts_ns},{h.tx_bytes},{h.qlen_bytes},{h.rate_kbps}" for h in pkt.hops))
"""

_INT_SENDER = """
import socket, sys
from traffic.transports.packet import Flag, Kind, Packet
pkt = Packet(Kind.DATA, (0, 0), psn=1, length=2000, flags=Flag.INT)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.sendto(pkt.encode() + bytes(pkt.filler), (sys.argv[1], 4799))
"""


def test_the_switches_stamp_int_that_matches_their_own_counters(make_fabric):
    """One INT-flagged DATA packet across a leaf-spine (eBPF): three hops stamped in path
    order (leaf1's uplink, the spine's port to leaf2, leaf2's port to the host), each with
    its port's rate, an empty queue, the port's own byte count and a later time than the
    hop before."""
    import sys
    import time

    exp = experiment(LS.replace("spines: 2", "spines: 1")
                     .replace("fabric_link: {rate_mbps: 10}", "fabric_link: {rate_mbps: 20}")
                     + "workload:\n  collectives:\n    - {op: send_recv, size: 1KiB, "
                       "ranks: [h1_1, h2_1], transport: rocev2, congestion_control: hpcc}\n",
                     "ebpf")
    fabric = make_fabric(exp)
    ip = {h.name: h.ip for h in fabric.topo.hosts}
    rx = fabric.spawn("h2_1", [sys.executable, "-c", _INT_RECEIVER, ip["h2_1"]], "int-rx")
    assert rx.stdout.readline().strip() == "ready"
    start = time.monotonic_ns()
    tx = fabric.spawn("h1_1", [sys.executable, "-c", _INT_SENDER, ip["h2_1"]], "int-tx")
    tx.communicate(timeout=20)
    out, err = rx.communicate(timeout=20)
    hops = [tuple(int(x) for x in h.split(",")) for h in out.strip().split(";")]
    assert len(hops) == 3, (out, err)
    ports = ("leaf1-eth3", "spine1-eth2", "leaf2-eth1")
    tx_bytes = fabric.marker.tx_bytes()
    for (ts, sent, qlen, kbps), port, rate in zip(hops, ports, (20_000, 20_000, 10_000)):
        assert kbps == rate and qlen == 0, (port, hops)
        assert sent == tx_bytes[port] % (1 << 32), (port, sent, tx_bytes[port])
    times = [h[0] for h in hops]
    assert start < times[0] < times[1] < times[2] < time.monotonic_ns()


@pytest.mark.parametrize("llr", [False, True])
def test_bit_errors_are_dropped_on_arrival_and_link_level_retry_replays_them(make_fabric, llr):
    """BER 1e-6 on every link (a 4 KB frame: 1 in 30 corrupted): each corrupted frame is dropped
    by the port it reaches, as a bad FCS is; uet resends them end to end, unless the links
    replay them (LLR): then not one is lost end to end (no resend but a tail probe)."""
    from testbed.model.congestion import summarize_congestion

    impair = f"impair: {{ber: 1.0e-6, llr: {str(llr).lower()}}}"
    exp = experiment(LS.replace("spines: 2", "spines: 1")
                     .replace("host_link: {rate_mbps: 10}", f"host_link: {{rate_mbps: 10, {impair}}}")
                     .replace("fabric_link: {rate_mbps: 10}",
                              f"fabric_link: {{rate_mbps: 20, {impair}}}")
                     .replace("fabric:\n", "fabric:\n  mtu: 4200\n")
                     + "workload:\n  collectives:\n    - {op: send_recv, size: 1MiB, "
                       "ranks: [h1_1, h2_1]}\n", "ebpf")
    fabric = make_fabric(exp)
    (job,) = exp.workload.jobs
    before = fabric.congestion()
    (result,) = run_job(fabric, list(job.collectives), connections=1, timeout_s=120,
                        transport="uet")
    c = summarize_congestion(before, fabric.congestion(), {})
    t = result.transport
    print(llr, {k: c[k] for k in ("corrupted", "llr_replays", "bad_fcs_drops")}, t)
    assert c["corrupted"] > 10 and c["bad_fcs_drops"] == c["corrupted"], c
    if llr:
        # nothing lost end to end: no resend but tail probes (the last packet again when its
        # acknowledgement is late, as on a loaded machine), no timeout, no loss detected
        assert c["llr_replays"] == c["corrupted"], (c, t)
        assert t["tx_retransmitted"] == t["tx_probes"] and t["tx_timeouts"] == 0, (c, t)
        assert t["tx_sack_losses"] == 0 and t["rx_lost"] == 0, (c, t)
    else:
        assert c["llr_replays"] == 0 and t["tx_retransmitted"] > 0, (c, t)
    assert t["tx_bytes"] >= 1 << 20


INCAST4 = ("version: 1\nfabric:\n  topology: leaf_spine\n  leaves: 2\n  spines: 1\n"
           "  hosts_per_leaf: 3\n  host_link: {rate_mbps: 10, ecn: {mode: step}}\n"
           "  fabric_link: {rate_mbps: 20, ecn: {mode: step}}\n  queue: {size_kb: 256}\n"
           "emulator: {queue_sample_ms: 0}\n"
           "workload:\n  collectives:\n    - {op: flows, size: 512KiB, pairs: [[h1_2, h1_1], "
           "[h1_3, h1_1], [h2_1, h1_1], [h2_2, h1_1], [h2_3, h1_1]]}\n")


@pytest.mark.parametrize("transport,options", [
    ("uet", {"rccc": True}), ("uet", {"delivery": "rod"}), ("uet", {"delivery": "uud"}),
    ("rocev2", {"congestion_control": "hpcc"}), ("rocev2", {"congestion_control": "swift"})])
def test_uets_credits_and_modes_and_rocev2s_hpcc_and_swift_carry_an_incast(make_fabric,
                                                                         transport, options):
    """A 5-to-1 incast on eBPF switches: every byte arrives (UUD: what was not lost, and it
    says how much was), and each variant shows its mechanism at work."""
    from testbed.model.congestion import summarize_congestion

    settings = ", ".join(f"{k}: {str(v).lower()}" for k, v in options.items())
    exp = experiment(INCAST4.replace("pairs:", f"transport: {{kind: {transport}, {settings}}}, "
                                               "pairs:"), "ebpf")
    fabric = make_fabric(exp)
    (job,) = exp.workload.jobs
    before = fabric.congestion()
    (result,) = run_job(fabric, list(job.collectives), connections=1, timeout_s=180,
                        transport=transport, options=job.transport_options.to_dict())
    c = summarize_congestion(before, fabric.congestion(), {})
    t = result.transport
    print(transport, options, c["drops"], t)
    for key, value in options.items():
        assert t[key] == value, t
    assert t["tx_bytes"] >= 5 * 512 * 1024 or t.get("rx_lost", 0) > 0
    if options.get("rccc"):  # the receiver paced them: no queue overflow, no timeout
        assert t["rx_grants"] > 0 and c["drops"] == 0 and t["tx_timeouts"] == 0, (c, t)
    if options.get("congestion_control") == "hpcc":  # INT drove the windows down
        assert t["tx_rate_cuts"] > 0 and fabric.spec.fabric.int_telemetry, t
    if options.get("delivery") == "uud":
        assert t["tx_retransmitted"] == 0 and t["rx_lost"] >= 0
