"""Congestion settings: DSCP -> priority plans, ECN thresholds derived from the link, PFC
headroom arithmetic, the experiment file's ecn / traffic_classes / hosts / congestion_control,
and the congestion summary of a run."""

import pytest

from fabriclab.model import experiment as xp
from testbed.model.congestion import (
    EcnMode,
    EcnSpec,
    TrafficClasses,
    base_rtt_s,
    default_k_bytes,
    frame_bytes,
    pfc_headroom_bytes,
    resolve_ecn,
    summarize_congestion,
)
from testbed.errors import ConfigError
from testbed.model.spec import Requirement

LS = {"topology": "leaf_spine", "leaves": 2, "spines": 1, "hosts_per_leaf": 2}


def test_dscp_table_and_lossless_classes():
    classes = TrafficClasses({26: 3, 46: 5}).check()
    table = classes.table()
    assert len(table) == 64 and table[26] == 3 and table[46] == 5 and table[0] == 0
    assert sum(table) == 8
    with pytest.raises(ConfigError) as err:
        TrafficClasses({26: 9}).check()
    assert err.value.path == "fabric.traffic_classes.dscp_to_priority.26"
    with pytest.raises(ConfigError):
        TrafficClasses({64: 1}).check()


def test_dctcp_threshold_is_c_rtt_over_7_but_at_least_three_frames():
    # 10 Mbit/s, 30 ms: C x RTT / 7 = 5.4 KB, less than a jumbo frame: three frames
    assert default_k_bytes(10, 0.030, 9000) == 3 * frame_bytes(9000)
    # 10 Gbit/s, 100 us: 17.9 KB, above three 1500-byte frames
    assert default_k_bytes(10_000, 100e-6, 1500) == 17858
    rtt = base_rtt_s([10, 10, 10, 10], [0, 0, 100, 0], 9000)
    assert rtt == pytest.approx(4 * (9014 + 66) * 8 / 10e6 + 2 * 100e-6)


def test_resolve_ecn_per_priority_with_defaults():
    specs = (EcnSpec(EcnMode.STEP), EcnSpec(EcnMode.RED, kmin_kb=40, priorities=(3,)),
             EcnSpec(EcnMode.OFF, priorities=(7,)))
    table = resolve_ecn(specs, 10, 0.03, 9000, "fabric.fabric_link.ecn")
    k = 3 * 9014
    assert table[0].mode == EcnMode.STEP and table[0].k_bytes == k
    assert (table[3].mode, table[3].kmin_bytes, table[3].kmax_bytes, table[3].pmax) == (
        EcnMode.RED, 40 * 1024, 4 * 40 * 1024, 0.1)
    assert table[7].mode == EcnMode.OFF
    assert "step K=26.4 KiB" == table[0].describe()
    with pytest.raises(ConfigError) as err:
        resolve_ecn((EcnSpec(EcnMode.RED, kmin_kb=50, kmax_kb=20),), 10, 0.03, 9000, "x.ecn")
    assert err.value.path == "x.ecn.kmax_kb"


def test_pfc_headroom_covers_the_round_trip_the_reaction_and_three_frames():
    # 10 Mbit/s, 5 us of propagation, 2 ms to react: 1.25 MB/s x 2.01 ms, plus a frame in
    # flight each way and the one the paused TBF still lets go
    assert pfc_headroom_bytes(10, 5, 0.002, 9000) == 2513 + 3 * 9014
    assert pfc_headroom_bytes(100_000, 1, 0, 1500) == 25_000 + 3 * 1514


def test_the_experiment_file_carries_ecn_classes_hosts_and_congestion_control():
    exp = xp.parse({"version": 1, "fabric": {
        **LS, "fabric_link": {"ecn": [{"mode": "step", "k_kb": 30},
                                      {"mode": "red", "priorities": [3], "pmax": 0.2}]},
        "host_link": {"ecn": {"mode": "step"}},
        "traffic_classes": {"dscp_to_priority": {"26": 3}},
        "hosts": {"ecn": True}},
        "workload": {"congestion_control": "reno", "collectives": [
            {"op": "all_reduce", "size": 64, "ranks": 2},
            {"op": "all_reduce", "size": 64, "ranks": 2, "congestion_control": "dctcp"}]}})
    assert exp.fabric.marks_ecn and exp.fabric.host_ecn
    assert exp.fabric.traffic_classes.table()[26] == 3
    fabric_ports = exp.port_ecn("fabric")
    assert fabric_ports[0].k_bytes == 30 * 1024 and fabric_ports[3].pmax == 0.2
    assert [j.congestion_control for j in exp.workload.jobs] == ["reno", "dctcp"]
    needs = exp.requirements()
    assert Requirement("fabric.fabric_link.ecn", "qdisc", "clsact") in needs
    assert Requirement("workload job 1.congestion_control", "tcp_cc", "dctcp") in needs
    plain = xp.parse({"version": 1, "fabric": LS})
    assert not plain.fabric.marks_ecn and not plain.fabric.host_ecn


def test_a_receive_buffer_limit_keeps_the_machines_other_values():
    exp = xp.parse({"version": 1, "fabric": {**LS, "hosts": {"tcp_rmem_max_kb": 256}}})
    assert exp.fabric.host_rmem_max_kb == 256
    assert exp.fabric.host_sysctls("4096 131072 6291456") == {
        "net.ipv4.tcp_rmem": "4096 131072 262144"}
    small = xp.parse({"version": 1, "fabric": {**LS, "hosts": {"tcp_rmem_max_kb": 64,
                                                                "ecn": True}}})
    assert small.fabric.host_sysctls("4096 131072 6291456") == {  # the default lowered to it
        "net.ipv4.tcp_ecn": "1", "net.ipv4.tcp_rmem": "4096 65536 65536"}
    assert xp.parse({"version": 1, "fabric": LS}).fabric.host_sysctls("4096 87380 6291456") == {}


def test_the_hosts_offload_unit_is_the_kernels_unless_set():
    assert xp.parse({"version": 1, "fabric": LS}).fabric.host_offload_segments is None
    exp = xp.parse({"version": 1, "fabric": {**LS, "hosts": {"offload_segments": 1}}})
    assert exp.fabric.host_offload_segments == 1


@pytest.mark.parametrize("fabric,path,text", [
    ({"host_link": {"ecn": {"mode": "wred"}}}, "fabric.host_link.ecn.mode", "did you mean 'red'"),
    ({"host_link": {"ecn": {"mode": "red", "pmax": 2}}}, "fabric.host_link.ecn.pmax", "<= 1"),
    ({"fabric_link": {"ecn": {"mode": "red", "kmin_kb": 90, "kmax_kb": 10}}},
     "fabric.fabric_link.ecn.kmax_kb", "above kmin_kb"),
    ({"traffic_classes": {"dscp_to_priority": {"26": 8}}},
     "fabric.traffic_classes.dscp_to_priority.26", "<= 7"),
    ({"traffic_classes": {"dscp_to_priority": {"70": 1}}},
     "fabric.traffic_classes.dscp_to_priority.70", "DSCP is 0..63"),
    ({"hosts": {"ecn": "yes"}}, "fabric.hosts.ecn", "boolean"),
    ({"hosts": {"tcp_rmem_max_kb": 8}}, "fabric.hosts.tcp_rmem_max_kb", ">= 16"),
    ({"hosts": {"tcp_rmem_max_kb": "256k"}}, "fabric.hosts.tcp_rmem_max_kb", "integer"),
    ({"hosts": {"offload_segments": 0}}, "fabric.hosts.offload_segments", ">= 1"),
    ({"hosts": {"offload_segments": 65}}, "fabric.hosts.offload_segments", "<= 64"),
    ({"hosts": {"offload_segments": "1"}}, "fabric.hosts.offload_segments", "integer"),
])
def test_bad_congestion_settings_name_the_field(fabric, path, text):
    with pytest.raises(ConfigError) as err:
        xp.parse({"version": 1, "fabric": {**LS, **fabric}})
    assert err.value.path == path and text in err.value.message, err.value


def test_congestion_summary_counts_deltas_and_samples():
    def port(packets, drops, marked, ect):
        return {"queue": {"packets": packets, "drops": drops},
                "priorities": {0: {"packets": packets, "ect": ect, "marked": marked}}}

    before = {"p1": port(10, 1, 2, 5), "p2": port(4, 0, 0, 0)}
    after = {"p1": port(110, 4, 32, 95), "p2": port(4, 0, 0, 0)}
    samples = {"p1": [(0, 0), (1000, 1200), (50_000, 40_000), (9000, None)], "p2": [(0, 0)]}
    doc = summarize_congestion(before, after, samples)
    assert (doc["drops"], doc["ect"], doc["ecn_marked"]) == (3, 90, 30)
    assert doc["queue_max_bytes"] == 50_000 and doc["samples"] == 4
    assert list(doc["ports"]) == ["p1"]  # p2 carried nothing during the run
    assert doc["virtual_queue_drift_bytes"]["mean"] == pytest.approx((200 + 10_000) / 2)
    assert doc["ports"]["p1"]["priorities"]["0"] == {"packets": 100, "ect": 90,
                                                     "ecn_marked": 30}


def test_validate_prints_the_thresholds_it_derived():
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-m", "fabriclab.cli", "validate", "--json",
                           str(root / "experiments" / "incast.yaml")], capture_output=True,
                          text=True, cwd=root, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    (doc,) = json.loads(proc.stdout)
    # K = C x RTT / 7 of each tier's emulated rate and the fabric's scaled base RTT
    assert doc["ecn"] == {"host": "priority 0-7: step K=38.1 KiB",
                          "fabric": "priority 0-7: step K=76.1 KiB"}
    assert doc["variants"] == ["lossy", "ecn", "pfc", "ecn_pfc"] and 0 < doc["base_rtt_s"] < 1
    assert doc["pfc"].startswith("priorities 3: XOFF 1066.0 KiB")
    assert "ECN at the switch ports of fabric links" in proc.stderr


def test_pause_cycles_find_each_deadlock_once():
    from testbed.model.congestion import pause_cycles

    # a ring of three switches, each port paused by the next: the classic PFC deadlock
    ring = {"s1-eth2": {"s2-eth2"}, "s2-eth2": {"s3-eth2"}, "s3-eth2": {"s1-eth2"},
            "h1-eth0": {"s1-eth2"}}  # a host paused by the ring is a victim, not in the cycle
    assert pause_cycles(ring) == [["s1-eth2", "s2-eth2", "s3-eth2"]]
    # a chain of pauses back to the senders is no deadlock
    assert pause_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    # two cycles sharing a port, and a port pausing itself
    both = {"a": {"b", "c"}, "b": {"a"}, "c": {"a"}, "d": {"d"}}
    assert pause_cycles(both) == [["a", "b"], ["a", "c"], ["d"]]


def test_link_utilization_per_tier_from_port_byte_counters():
    from testbed.model.congestion import link_utilization
    from testbed.model.builders import fat_tree

    topo = fat_tree(4, host_rate_mbps=8, fabric_rate_mbps=8)
    up = topo.find_link("edge1_1", "agg1_1").end("edge1_1").ifname
    core = topo.find_link("agg1_1", "core1").end("agg1_1").ifname
    before = {up: {"queue": {"bytes": 0}}, core: {"queue": {"bytes": 0}}}
    after = {up: {"queue": {"bytes": 1_000_000}}, core: {"queue": {"bytes": 500_000}}}
    util = link_utilization(topo, before, after, 2.0)  # 8 Mbit/s for 2 s = 2 MB
    assert util["edge->agg"]["max"] == 0.5 and util["agg->core"]["max"] == 0.25
    assert util["edge->agg"]["mean"] == 0.5  # ports without counters are not averaged in
