"""PFC on real switch ports: a lossless class loses nothing under a UDP incast while the same
blast into a lossy class loses, and the pauses travel hop by hop back to the senders."""

from __future__ import annotations

from tests.integration.conftest import DATAPATHS, experiment
from testbed.model.congestion import summarize_congestion
from traffic.agents.udpflow import run_flows, run_incast

# 10 Mbit/s hosts, 20 Mbit/s uplinks: four senders on leaves 2 and 3 into h1_1. The congested
# queue is leaf1's port to h1_1; one hop upstream the spine's port to leaf1, two hops the
# leaves' uplinks, three the senders' NICs.
FABRIC = ("version: 1\nfabric:\n  topology: leaf_spine\n  leaves: 3\n  spines: 1\n"
          "  hosts_per_leaf: 2\n  host_link: {rate_mbps: 10}\n  fabric_link: {rate_mbps: 20}\n"
          "  queue: {size_kb: 128}\n  traffic_classes: {dscp_to_priority: {26: 3}}\n")
EMULATOR = "emulator: {queue_sample_ms: 0}\n"
SENDERS = ["h2_1", "h2_2", "h3_1", "h3_2"]
COUNT = 150  # 8000-byte datagrams each: 4.8 MB in all, about 4 s at the receiver's 10 Mbit/s


def _blast(fabric) -> tuple[dict, dict]:
    before = fabric.congestion()
    result = run_incast(fabric, SENDERS, "h1_1", COUNT, dscp=26)
    return result, summarize_congestion(before, fabric.congestion(), {}, (3,))


@DATAPATHS
def test_a_lossless_udp_incast_loses_nothing_and_pauses_reach_the_senders(make_fabric, datapath):
    fabric = make_fabric(experiment(FABRIC + "  pfc: {priorities: [3]}\n" + EMULATOR, datapath))
    result, congestion = _blast(fabric)
    assert result["lost"] == 0, result
    assert all(s["local_drops"] == 0 for s in result["senders"]), result["senders"]
    assert congestion["drops"] == 0 and congestion["lossless_drops"] == 0, congestion
    paused = {port for port, p in congestion["ports"].items()
              if p["priorities"].get("3", {}).get("pfc", {}).get("pause_events")}
    # one hop (the spine), two (the leaves' uplinks) and three (the senders' NICs) upstream
    assert "spine1-eth1" in paused
    assert {"leaf2-eth3", "leaf3-eth3"} <= paused, paused
    assert {f"{h}-eth0" for h in SENDERS} <= paused, paused
    assert "leaf1-eth1" not in paused  # the congested queue pauses others, not itself
    report = fabric.pfc_agent.report()
    assert report["reaction_ms"]["count"] >= len(paused) and not report["errors"]


def test_the_same_blast_into_a_lossy_class_loses(make_fabric):
    fabric = make_fabric(experiment(FABRIC + EMULATOR))
    result, congestion = _blast(fabric)
    assert result["lost"] > COUNT, result  # most of the incast cannot fit
    assert congestion["drops"] > COUNT and congestion["pfc_pause_events"] == 0, congestion


RING = ("version: 1\nfabric:\n  topology: ring\n  leaves: 5\n  hosts_per_leaf: 1\n"
        "  host_link: {rate_mbps: 10}\n  fabric_link: {rate_mbps: 10}\n  queue: {size_kb: 128}\n"
        "  traffic_classes: {dscp_to_priority: {26: 3}}\n"
        "  pfc: {priorities: [3], watchdog_ms: 300}\n" + EMULATOR)


@DATAPATHS
def test_a_ring_of_pauses_is_detected_as_a_deadlock_and_the_watchdog_breaks_it(make_fabric,
                                                                              datapath):
    fabric = make_fabric(experiment(RING, datapath))
    # every host to the host two leaves ahead: each clockwise link carries two flows
    pairs = [(f"h{i}_1", f"h{(i + 1) % 5 + 1}_1") for i in range(1, 6)]
    before = fabric.congestion()
    result = run_flows(fabric, pairs, 120, dscp=26, idle_s=3.0)
    congestion = summarize_congestion(before, fabric.congestion(), {}, (3,))
    report = fabric.pfc_agent.report()
    clockwise = [f"leaf{i}-eth2" for i in range(1, 6)]
    assert {"priority": 3, "ports": clockwise} in [
        {k: d[k] for k in ("priority", "ports")} for d in report["deadlocks"]], report
    # the watchdog broke the cycle: every flow got through (losing what it dropped to do so)
    assert congestion["pfc_watchdog_events"] > 0, congestion
    assert all(result["flows"].get(str(i), {}).get("unique", 0) > 0 for i in range(5)), result


def test_a_strict_class_gets_htb_priority_0_at_every_link_end(make_fabric):
    import re
    import subprocess

    fabric = make_fabric(experiment(FABRIC.replace(
        "{dscp_to_priority: {26: 3}}", "{dscp_to_priority: {26: 3, 48: 6}, strict: [6]}")
        + EMULATOR))
    for ifname in ("leaf1-eth1", "spine1-eth2"):
        text = subprocess.run(["tc", "class", "show", "dev", ifname], capture_output=True,
                              text=True, check=True).stdout  # (tc -j prints no htb classes)
        prio = dict(re.findall(r"class htb (1:1\w) parent 1:1 leaf \w+: prio (\d)", text))
        assert prio == {"1:10": "1", "1:13": "1", "1:16": "0"}, (ifname, text)
    assert fabric.spec.fabric.traffic_classes.strict == (6,)


CBFC = "  pfc: {priorities: [3]}\n"


def test_credit_based_flow_control_loses_nothing_without_a_pause_frame(make_fabric):
    """The same incast with the lossless class under CBFC (eBPF switches): nothing lost, no PFC
    pause, and the links upstream of the congested queue stall on credit instead."""
    fabric = make_fabric(experiment(
        FABRIC.replace("traffic_classes: {dscp_to_priority: {26: 3}}",
                       "traffic_classes: {dscp_to_priority: {26: 3}, lossless: {mode: cbfc}}")
        + CBFC + EMULATOR, "ebpf"))
    result, congestion = _blast(fabric)
    assert result["lost"] == 0, result
    assert congestion["drops"] == 0 and congestion["lossless_drops"] == 0, congestion
    assert congestion["pfc_pause_events"] == 0, congestion
    stalled = {port for port, p in congestion["ports"].items()
               if p["priorities"].get("3", {}).get("cbfc", {}).get("stall_events")}
    assert stalled and "leaf1-eth1" not in stalled, congestion
    report = fabric.pfc_agent.report()
    assert report["mode"] == "cbfc" and report["credit_changes"] > 0 and not report["errors"]


def test_credits_on_the_ring_deadlock_as_pauses_do_and_nothing_breaks_them(make_fabric):
    """The PFC deadlock ring under CBFC: each clockwise link waits for credit its downstream
    cannot return (its buffer holds bytes that wait for the next link's credit), round the
    ring. The agent sees the cycle and it holds: CBFC has no watchdog. Only stopping the agent
    (every link free again) lets the flows finish."""
    import threading
    import time

    from testbed.poll import wait_for

    ring = RING.replace("traffic_classes: {dscp_to_priority: {26: 3}}",
                        "traffic_classes: {dscp_to_priority: {26: 3}, lossless: {mode: cbfc}}")
    fabric = make_fabric(experiment(ring, "ebpf"))
    pairs = [(f"h{i}_1", f"h{(i + 1) % 5 + 1}_1") for i in range(1, 6)]
    out: dict = {}
    blast = threading.Thread(target=lambda: out.update(
        run_flows(fabric, pairs, 120, dscp=26, idle_s=3.0)), daemon=True)
    blast.start()
    agent = fabric.pfc_agent
    wait_for(lambda: agent.report()["deadlocks"], 60, "a credit cycle round the ring")
    clockwise = [f"leaf{i}-eth2" for i in range(1, 6)]
    assert [d["ports"] for d in agent.report()["deadlocks"]] == [clockwise]
    # it holds: the clockwise ports, 10 Mbit/s each, send next to nothing for 3 s (a stalled
    # bucket lets a frame through every 4 s, so a port may have credit for a moment)
    before = fabric.congestion()
    time.sleep(3.0)
    after = fabric.congestion()
    sent = {port: after[port]["queue"]["bytes"] - before[port]["queue"]["bytes"]
            for port in clockwise}
    assert all(n < 0.1 * 10e6 / 8 * 3.0 for n in sent.values()), sent
    (thread,) = [t for t, _ in fabric.run._threads if t.name == "pfc agent"]
    fabric.stop_thread(thread)  # every link runs again
    blast.join(120)
    assert not blast.is_alive() and all(out["flows"][str(i)]["unique"] > 0 for i in range(5))
