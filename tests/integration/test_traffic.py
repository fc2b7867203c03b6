"""Collectives run by real agents in the hosts, over TCP through the emulated fabric."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from testbed.errors import TestbedError
from tests.integration.conftest import ROOT, experiment
from traffic.agents.runner import run_job
from traffic.workloads.schedules import build
from traffic.workloads.workload import Collective

K4 = "version: 1\nfabric: {topology: fat_tree, k: 4}\n"  # 10 Mbit/s links, non-blocking
# dmodk pins every step of these collectives (shift permutations) onto disjoint paths, so the
# band below tests the emulation, not the luck of ECMP hashing
PINNED = K4 + "controller: {routing: dmodk}\n"
RANKS = ("h1_1_1", "h2_1_1", "h3_1_1", "h4_1_1")  # one per pod: every transfer crosses the core


def _fabriclab_run(state_dir, exp, out):
    """``fabriclab run EXP --out OUT --json`` as a user runs it; returns the process and the
    document (which must be what results.json holds)."""
    proc = subprocess.run([sys.executable, "-m", "fabriclab.cli", "--state-dir", str(state_dir),
                           "run", str(exp), "--out", str(out), "--json"], capture_output=True,
                          text=True, cwd=ROOT, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert doc == json.loads((out / "results.json").read_text())
    return proc, doc


def test_ring_all_reduce_and_all_to_all_complete_near_line_rate(make_fabric):
    fabric = make_fabric(experiment(PINNED))
    size = 2 << 20
    results = run_job(fabric, [Collective("all_reduce", RANKS, build("all_reduce", 4, size)),
                               Collective("all_to_all", RANKS, build("all_to_all", 4, size))],
                      connections=2, timeout_s=120)
    for res in results:
        print(f"{res.op}: {res.time_us:.0f} us, busbw {res.busbw_GBps:.4f} GB/s, "
              f"efficiency {res.efficiency:.3f}")
        assert res.bytes == size and res.ranks == list(RANKS)
        if res.op == "all_reduce":
            # a pinned ring: one shaped path per hop at 10 Mbit/s, busbw close to the line rate
            assert 0.85 <= res.efficiency <= 1.05, res
        else:
            # pairwise steps of 170 KiB each wait for the step before: TCP restarts per step,
            # so the efficiency varies with the machine's load; it must complete sensibly
            assert 0.5 <= res.efficiency <= 1.05, res
        assert 0 < res.flow_end_s["p50"] <= res.flow_end_s["max"] <= res.time_us / 1e6
        # each transfer from its sender's start: no longer than its end from the collective's
        # start, and no shorter than alone on the idle fabric but for the shapers' burst
        assert 0 < res.fct_s["p50"] <= res.fct_s["max"] <= res.flow_end_s["max"] + 1e-6
        assert all(f.fct_s <= f.end_s + 1e-6 and f.ideal_fct_s > 0 for f in res.flows)


def test_a_stuck_rank_is_named(make_fabric):
    fabric = make_fabric(experiment(K4))
    fabric.set_link("h3_1_1", "edge3_1", up=False)  # rank 2 is cut off
    with pytest.raises(TestbedError) as err:
        run_job(fabric, [Collective("all_reduce", RANKS, build("all_reduce", 4, 1 << 20))],
                timeout_s=15)
    text = str(err.value)
    # the job fails once rank 2 has been cut off for the grace, not at its 15 s timeout
    assert text.startswith("the job cannot finish, ranks cut off for 3 s") and \
        "h1_1_1 cannot reach h3_1_1" in text
    # every rank says what it waits for; the others wait on rank 2, which cannot reach anyone
    assert "rank 2 (h3_1_1): connecting to rank" in text, text
    # and where each stuck agent's main thread is, from its own stack dump
    assert re.search(r"rank 2 \(h3_1_1\): connecting to rank[^\n]*; main thread at: "
                     r"[^\n]*connect \(traffic/agents/", text), text
    waits = re.findall(r"rank (\d) \(\w+\): waiting for connections from ranks \[([\d, ]*)\]",
                       text)
    assert waits and all("2" in ranks.split(", ") for _, ranks in waits), text


def test_fabriclab_run_writes_results_json(state_dir, tmp_path):
    exp = tmp_path / "run.yaml"
    exp.write_text(PINNED + "workload:\n  connections: 2\n  collectives:\n"
                   "    - {op: all_reduce, size: 1MiB, ranks: [h1_1_1, h2_1_1, h3_1_1, h4_1_1],"
                   " repetitions: 2}\n"
                   "    - {op: broadcast, size: 1MiB, ranks: 4}\n"
                   # at the same time as the broadcast, sharing host h1_1_1 with it
                   "    - {op: all_to_all, size: 512KiB, ranks: [h3_2_2, h4_2_2, h1_1_1],"
                   " concurrent: true}\n")
    proc, doc = _fabriclab_run(state_dir, exp, tmp_path / "out")
    assert doc["complete"] is True and "error" not in doc
    rows = doc["collectives"]
    assert [(r["op"], r["job"], r["repetition"], r["concurrent_jobs"]) for r in rows] == [
        ("all_reduce", 0, 0, 1), ("all_reduce", 0, 1, 1), ("broadcast", 1, 0, 2),
        ("all_to_all", 2, 0, 2)]
    for row in rows:
        for key in ("ranks", "bytes", "time_us", "algbw_GBps", "busbw_GBps", "efficiency",
                    "ideal_s", "flow_end_s", "fct_s", "slowdown"):
            assert key in row
        low = 0.5 if row["concurrent_jobs"] == 1 else 0.2  # concurrent jobs share h1_1_1
        assert low < row["efficiency"] <= 1.15  # HTB burst tokens speed the first KiB
    assert "busbw" in proc.stderr and "all_reduce" in proc.stderr  # the table, for a person


def test_failures_in_the_experiment_file_are_applied_during_the_workload(state_dir, tmp_path):
    exp = tmp_path / "fail.yaml"
    exp.write_text(K4 + "workload:\n  collectives:\n"
                   "    - {op: all_reduce, size: 2MiB, ranks: [h1_1_1, h2_1_1, h3_1_1, h4_1_1]}\n"
                   "failures:\n"
                   "  - {at_s: 0.2, link: [agg1_1, core1], action: down}\n"
                   "  - {at_s: 0.4, switch: core3, action: down}\n"
                   "  - {at_s: 0.8, link: [agg1_1, core1], action: up}\n")
    _, doc = _fabriclab_run(state_dir, exp, tmp_path / "out")
    assert doc["complete"] is True and doc["collectives"][0]["efficiency"] > 0.1
    applied = doc["failures"]
    assert [(f["target"], f["action"], f["links"]) for f in applied] == [
        ("link agg1_1-core1", "down", 1), ("switch core3", "down", 4),
        ("link agg1_1-core1", "up", 1)]
    assert all(not f["errors"] and f["applied_s"] >= f["at_s"] for f in applied)
    assert all(set(f["throughput"]) >= {"before_mbps", "during_mbps", "after_mbps"}
               for f in applied)
    # each failure cut its links before the switches heard of it and before the veths went
    # down; the repair reports what the cut dropped while it lasted (a number, maybe none)
    for f in applied[:2]:
        steps = f["steps_s"]
        assert steps["cut_s"] <= steps["signalled_s"] <= steps["down_s"], f
    assert applied[2]["steps_s"]["up_s"] <= applied[2]["steps_s"]["signalled_s"]
    # the cut's program counted (None: no cut loaded, the failure only took the veths down)
    assert isinstance(applied[2]["cut_drops"], int), applied[2]
    # a failure's ports are watched (what reaches them and what their cut drops) against 0
    move = applied[0]["move_off"]
    assert set(move["rates_mbps"].values()) == {0.0} and set(move["ms"]) == set(
        move["rates_mbps"]), move
    assert "move_off" not in applied[2]  # a repair moves nothing off
    # the eBPF switches' fault notices: core1 lost its only way to pod 1's agg1_1, so the other
    # pods' agg_1 switches took core1's port out of their groups for pod 1 at once
    assert doc["provenance"]["datapath"] == "ebpf", doc["provenance"]  # auto: OVS has none
    notices = applied[0]["notices"]
    out = {(n["switch"], tuple(n["ports_out"])) for n in notices if n["ports_out"]}
    assert {name for name, _ in out} == {"agg2_1", "agg3_1", "agg4_1"}, notices
    assert min(n["ms"] for n in notices) < 100, notices  # at once, not the controller's pace
    assert all(n["ms"] < 200 for n in notices), notices  # none of the next event's


def _two_flows_and(state_dir, tmp_path, failure: str, head: str = PINNED) -> dict:
    """Two 10 MiB cross-pod flows from edge1_1 on disjoint paths (D-mod-k) and one
    ``failure`` event: the complete run's document."""
    exp = tmp_path / "two-flows.yaml"
    exp.write_text(head + "workload:\n  collectives:\n"
                   "    - {op: flows, size: 10MiB, pairs: [[h1_1_1, h2_1_1], [h1_1_2, h2_1_2]]}\n"
                   f"failures:\n  - {failure}\n")
    _, doc = _fabriclab_run(state_dir, exp, tmp_path / "out")
    assert doc["complete"] is True
    return doc


def test_the_throughput_before_during_and_after_a_failure_is_in_the_results(state_dir,
                                                                            tmp_path):
    """Two cross-pod flows from edge1_1, which D-mod-k sends up different aggregation switches;
    4 s into them one of edge1_1's uplinks fails, and from then on both share the other one."""
    doc = _two_flows_and(state_dir, tmp_path, "{at_s: 4, link: [edge1_1, agg1_1], action: down}")
    (failure,) = doc["failures"]
    tp = failure["throughput"]
    assert tp["windows_s"]["before"] == pytest.approx([failure["applied_s"] - 3,
                                                       failure["applied_s"]], abs=0.01)
    assert 14 <= tp["before_mbps"] <= 21, tp  # two 10 Mbit/s flows on disjoint paths
    assert tp["during_mbps"] < tp["before_mbps"], tp
    assert 0.35 <= tp["after_vs_before"] <= 0.75, tp  # both on one 10 Mbit/s uplink now


def test_a_link_degraded_to_half_rate_carries_half_and_its_ports_are_watched(state_dir,
                                                                            tmp_path):
    """The same two flows; at 4 s edge1_1-agg1_1 drops to half its rate (both directions):
    one flow is left 5 Mbit/s, the other keeps 10, and the bytes offered to the link's two
    switch ports are sampled every millisecond against the new rate."""
    doc = _two_flows_and(state_dir, tmp_path, "{at_s: 4, link: [edge1_1, agg1_1], "
                         "action: degrade, rate_factor: 0.5}")
    (event,) = doc["failures"]
    assert event["action"] == "degrade" and event["rate_factor"] == 0.5 and not event["errors"]
    tp = event["throughput"]
    assert 14 <= tp["before_mbps"] <= 21, tp
    assert 0.6 <= tp["after_vs_before"] <= 0.85, tp  # 10 + 5 of 20
    move = event["move_off"]
    assert set(move["rates_mbps"].values()) == {5.0} and len(move["rates_mbps"]) == 2, move
    assert move["samples"] > 500, move  # two seconds at one a millisecond, give or take
    assert set(move["ms"]) == set(move["rates_mbps"]), move
    # measured over windows of four of the largest packets offered at 5 Mbit/s, not 5 ms:
    # kernel TCP's segmentation-offload units, which pass the eBPF switches whole, at
    # edge1_1's uplink (the flows' data); frames (acknowledgements) the other way
    assert move["packet_bytes"]["edge1_1-eth3"] >= 2 * 8948, move  # two segments or more
    assert move["packet_bytes"]["agg1_1-eth1"] >= 9014, move
    assert all(move["window_ms"][p] == pytest.approx(4 * b * 8 / 5e6 * 1e3, rel=0.01)
               for p, b in move["packet_bytes"].items()), move


def test_hosts_that_hand_their_nics_one_segment_at_a_time_put_frames_on_the_links(state_dir,
                                                                                tmp_path):
    """``hosts: {offload_segments: 1}``: the same two flows, and the switches see TCP's
    frames (the largest packet at edge1_1's uplink is one), not its offload units."""
    head = ("version: 1\nfabric: {topology: fat_tree, k: 4, hosts: {offload_segments: 1}}\n"
            "controller: {routing: dmodk}\n")
    doc = _two_flows_and(state_dir, tmp_path, "{at_s: 4, link: [edge1_1, agg1_1], "
                         "action: degrade, rate_factor: 0.5}", head)
    move = doc["failures"][0]["move_off"]
    assert move["packet_bytes"] == {"edge1_1-eth3": 9014, "agg1_1-eth1": 9014}, move


def test_a_job_whose_ranks_are_cut_off_fails_at_once(state_dir, tmp_path):
    """edge2_1 goes down 1 s into a ring all-reduce that would take about 10 s: h2_1_1, one of
    its ranks, is cut off, and the run fails within the grace, not after its 600 s timeout."""
    exp = tmp_path / "cut.yaml"
    exp.write_text(K4 + "workload:\n  timeout_s: 600\n  collectives:\n"
                   "    - {op: all_reduce, size: 8MiB, ranks: [h1_1_1, h2_1_1, h3_1_1, h4_1_1]}\n"
                   "failures:\n  - {at_s: 1, switch: edge2_1, action: down}\n")
    out = tmp_path / "out"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "fabriclab.cli", "--state-dir", str(state_dir),
                           "run", str(exp), "--out", str(out), "--json"], capture_output=True,
                          text=True, cwd=ROOT, timeout=300, check=False)
    took = time.monotonic() - started
    assert proc.returncode != 0, proc.stdout[-2000:]
    doc = json.loads((out / "results.json").read_text())
    assert doc["complete"] is False
    assert "ranks cut off" in doc["error"] and "h1_1_1 cannot reach h2_1_1" in doc["error"], doc
    assert "edge2_1" in doc["error"]
    assert [f["target"] for f in doc["failures"]] == ["switch edge2_1"]
    assert took < 90, took  # build, 1 s, the 3 s grace, teardown; not the job's timeout


def test_background_incast_shares_the_receivers_link(make_fabric):

    from fabriclab.model import experiment as config

    exp = config.parse({"version": 1, "fabric": {"topology": "fat_tree", "k": 4},
                        "workload": {"collectives": [
                            {"op": "flows", "pattern": "incast", "fan_in": 3, "size": "1MiB"}]}})
    fabric = make_fabric(exp)
    (job,) = exp.workload.jobs
    (res,) = run_job(fabric, list(job.collectives), timeout_s=60)
    assert not [p for p in fabric.record.processes if p.role.startswith("agent:")]  # reaped
    # three senders share h1_1_1's 10 Mbit/s link: each flow gets about a third of it
    assert 0.2 <= res.efficiency <= 0.4, res


def test_a_training_iteration_runs_and_is_timed(state_dir, tmp_path):
    exp = tmp_path / "train.yaml"
    # a collective whose label looks like a training phase's counts for no iteration
    exp.write_text(K4 + "workload:\n  training: {layers: 2, hidden: 256, seq_len: 128, "
                   "micro_batches: 1, tp: 2, pp: 2, dp: 2, params: 1000000, compute_ms: 50}\n"
                   "  collectives:\n    - {op: all_reduce, size: 64KiB, ranks: 2, "
                   "label: iter warmup}\n")
    _, doc = _fabriclab_run(state_dir, exp, tmp_path / "out")
    (iteration,) = doc["iterations"]
    warmup, *phases = doc["collectives"]
    assert warmup["label"] == "iter warmup" and warmup["iteration"] is None
    assert {r["op"] for r in phases} == {"all_reduce", "send_recv"}
    assert {r["iteration"] for r in phases} == {0}
    assert all(r["communicator_size"] == 2 and len(r["ranks"]) == 8 for r in phases)
    # the iteration, by the agents' clocks from its first barrier to its last phase's end,
    # is its phases and their compute (50 ms over the stages' layers), and the barriers
    summed = sum(r["time_us"] / 1e6 + r["gap_s"] for r in phases)
    assert summed - 1e-3 <= iteration["time_s"] < summed + 0.01 * len(phases) + 0.2, \
        (iteration, summed)
    assert iteration["compute_s"] >= sum(r["gap_s"] for r in phases) * 0.99
    assert iteration["exposed_comm_s"] == pytest.approx(
        iteration["time_s"] - iteration["compute_s"], abs=1e-5)
    assert sum(r["gap_s"] for r in phases) == pytest.approx(4 * 0.050)
