"""The results document: rows per repetition, training iterations by their number (never by a
label), the nccl-tests-like per-job summary, and a failed run keeping what it measured."""

import pytest

from fabriclab.model import results
from fabriclab.model.document import (Congestion, CollectiveRow, FlowCompletion, Iteration,
                                      TransportCounters, read)
from traffic.measure.results import CollectiveResult


def _row(duration_s: float, label: str = "", iteration=None, gap_s: float = 0.0,
         op: str = "all_reduce") -> CollectiveResult:
    return CollectiveResult(op, "ring", ["a", "b"], 1_000_000, duration_s * 1e6,
                            1e6 / duration_s / 1e9, 1e6 / duration_s / 1e9, 0.8,
                            0.5, label=label, gap_s=gap_s, communicator_size=2,
                            iteration=iteration)


def test_iterations_come_from_the_phases_numbers_not_from_labels():
    doc = results.new_document("x", "x.yaml", "now", {})
    # user labels that look like training phases: one made the run raise after measuring,
    # the other was merged into iteration 3
    results.add_rows(doc, 0, [_row(1.0, label="iter warmup"), _row(1.0, label="iter 3")], 1)
    results.add_rows(doc, 1, [_row(0.5, "iter 0 tp", 0, 0.1), _row(0.25, "iter 0 dp", 0),
                              _row(0.75, "iter 1 tp", 1, 0.2)], 1)
    results.finish(doc)
    assert doc.complete is True
    assert [i.to_json() for i in doc.iterations] == [
        {"job": 1, "iteration": 0, "time_s": pytest.approx(0.85)},
        {"job": 1, "iteration": 1, "time_s": pytest.approx(0.95)}]
    assert [r.repetition for r in doc.collectives] == [0, 1, 0, 1, 2]


def test_an_iteration_from_the_agents_clocks_compute_exposed_and_hidden_communication():
    """Rows timed by the agents: the barrier, each phase's slowest compute and its end. An
    all-reduce after 4 s of compute; then the same gradients as two buckets, the first
    released at 3 s and run beside the rest of the backward pass."""
    def timed(start: float, seconds: float, released: float, compute: float,
              barrier: bool = True) -> CollectiveRow:
        return CollectiveRow("all_reduce", 1, seconds * 1e6, 0.0, 0.0, 0.0, iteration=0,
                             start_unix_s=start, released_unix_s=released, compute_s=compute,
                             barrier=barrier)
    (plain,) = results.iteration_times([timed(104.0, 2.0, 100.0, 4.0)])
    assert plain == Iteration(0, 0, 6.0, compute_s=4.0, comm_s=2.0, exposed_comm_s=2.0,
                              overlap_fraction=0.0)
    (over,) = results.iteration_times([timed(103.0, 1.0, 100.0, 3.0),
                                        timed(104.0, 1.0, 100.0, 4.0, barrier=False)])
    assert over.time_s == 5.0 and over.compute_s == 4.0
    assert over.exposed_comm_s == 1.0 and over.overlap_fraction == 0.5


def test_no_training_no_iterations_and_a_failure_keeps_the_rows():
    doc = results.new_document("x", "x.yaml", "now", {"topology": "fat_tree"})
    results.add_rows(doc, 0, [_row(2.0)], 2)
    results.fail(doc, "job 1: timed out")
    assert doc.complete is False and doc.error == "job 1: timed out"
    assert len(doc.collectives) == 1 and doc.collectives[0].concurrent_jobs == 2
    results.finish(doc)
    assert "iterations" not in doc.to_json()


def test_job_summaries_average_repetitions():
    doc = results.new_document("x", "x.yaml", "now", {})
    results.add_rows(doc, 0, [_row(1.0), _row(3.0)], 1)
    results.add_rows(doc, 1, [_row(1.0, op="all_to_all")], 1)
    first, second = results.job_summaries(doc.collectives)
    assert (first.op, first.repetitions, first.mean_us) == ("all_reduce", 2, 2.0e6)
    assert first.algbw_GBps == pytest.approx(0.0005) and first.count == 250_000
    assert first.efficiency == 0.5 and second.op == "all_to_all"


def test_a_variant_row_compares_queues_and_jobs():
    doc = results.new_document("x", "x.yaml", "now", {"variant": "ecn"})
    fast, slow = _row(1.0), _row(2.0)
    fast.flow_end_s = {"p50": 0.4, "p99": 0.9, "max": 1.0}
    slow.flow_end_s = {"p50": 0.5, "p99": 1.8, "max": 2.0}
    results.add_rows(doc, 0, [fast, slow], 1)
    doc.congestion = Congestion.from_json({"drops": 3, "ecn_marked": 40,
                                           "queue_max_bytes": 9000, "queue_p99_bytes": 8000,
                                           "ports": {}})
    results.finish(doc)
    row = results.variant_row(doc)
    assert (row.variant, row.complete, row.drops, row.ecn_marked) == ("ecn", True, 3, 40)
    (job,) = row.jobs
    assert (job.fct_p50_s, job.fct_p99_s) == (0.5, 1.8)  # rows before fct_s: their ends
    for collective, (p50, p99) in zip(doc.collectives, ((0.3, 0.7), (0.45, 1.5))):
        collective.fct_s = FlowCompletion(p50, p99, p99)  # each transfer from its own start
    (measured,) = results.variant_row(doc).jobs
    assert (measured.fct_p50_s, measured.fct_p99_s) == (0.45, 1.5)
    assert job.busbw_GBps == pytest.approx(1e6 / 1.5 / 1e9)
    assert results.VariantRow.from_json(row.to_json()) == row  # variants.json reads back
    missing = results.variant_row(None, "pfc", "build failed")
    assert (missing.variant, missing.complete, missing.error, missing.jobs) == (
        "pfc", False, "build failed", [])


def test_throughput_of_ideal_counts_each_flow_for_its_own_share():
    from traffic.measure.metrics import throughput_of_ideal
    alone = 8e6 / 8e6  # 1 MB at 8 Mbit/s: 1 s alone
    # three flows at line rate and one that took twice as long: busbw would be halved by the
    # straggler, the aggregate throughput loses an eighth
    flows = [(1_000_000, 1.0)] * 3 + [(1_000_000, 2.0)]
    assert throughput_of_ideal(flows, 8.0) == pytest.approx((3 * alone + 0.5) / 4)
    assert throughput_of_ideal([(1_000_000, 2.0)], 8.0, goodput_fraction=0.5) == \
        pytest.approx(1.0)
    with pytest.raises(ValueError):
        throughput_of_ideal([], 8.0)


def test_results_written_before_one_set_of_units_read_in_todays_fields():
    """A results.json of ``duration_s``, ``*_gbps`` (Gbit/s) and a sweep's ``busbw_mbps``
    reads as ``time_us`` and GB/s; a VM run's ``duration_s`` (no collective) stays."""
    from fabriclab.model.results import upgrade

    old = {"collectives": [{"op": "all_reduce", "bytes": 1000, "duration_s": 0.5,
                            "algbw_gbps": 0.016, "busbw_gbps": 0.024,
                            "real": {"bytes": 9, "duration_s": 2e-6, "busbw_gbps": 80.0}}],
           "vm": {"exit": 0, "duration_s": 12.0},
           "cells": [{"jobs": [{"label": "ar", "busbw_mbps": 16.0}]}]}
    new = upgrade(old)
    row = new["collectives"][0]
    assert (row["time_us"], row["algbw_GBps"], row["busbw_GBps"]) == (
        pytest.approx(5e5), pytest.approx(0.002), pytest.approx(0.003))
    assert "duration_s" not in row and "busbw_gbps" not in row
    assert row["real"]["time_us"] == pytest.approx(2.0) and row["real"]["busbw_GBps"] == 10.0
    assert new["vm"] == {"exit": 0, "duration_s": 12.0}
    assert new["cells"][0]["jobs"][0]["busbw_GBps"] == pytest.approx(0.002)
    assert upgrade({"collectives": [{"op": "x", "bytes": 1, "time_us": 3.0}]}) == {
        "collectives": [{"op": "x", "bytes": 1, "time_us": 3.0}]}


def test_a_variant_row_says_which_transport_and_what_it_did():
    from fabriclab.model.results import variant_row

    def label(t: dict) -> str:
        return TransportCounters.from_json(t).label

    assert label({"transport": "uet", "delivery": "rod", "rccc": True,
                  "nscc": False}) == "uet ROD+RCCC, no NSCC"
    assert label({"transport": "rocev2", "congestion_control": "dcqcn",
                  "dcqcn": "connectx"}) == "rocev2 DCQCN (connectx)"
    assert label({"transport": "rocev2", "congestion_control": "hpcc"}) == "rocev2 HPCC"
    t = {"transport": "uet", "delivery": "rud", "rccc": True, "nscc": True,
         "tx_retransmitted": 3, "tx_grants": 40}
    doc = read({"fabric": {"variant": "rccc"}, "complete": True,
           "congestion": {"trimmed": 5, "ports": {"leaf1-eth1": {"queue_p99_bytes": 2048},
                                                  "leaf1-eth2": {"queue_p99_bytes": 0}}},
           "collectives": [{"job": 0, "op": "flows", "algorithm": "direct", "bytes": 8,
                            "time_us": 10.0, "algbw_GBps": 1.0, "busbw_GBps": 1.0,
                            "efficiency": 0.5, "communicator_size": 2, "transport": t,
                            "flow_end_s": {"p50": 1.0, "p99": 2.0}}] * 2})
    row = variant_row(doc).transport
    assert row.label == "uet RUD+RCCC" and row.tx_retransmitted == 6
    assert row.tx_grants == 80 and row.trimmed == 5
    assert row.bottleneck_queue_p99_bytes == 2048
    assert variant_row(doc).reordered is None  # nothing says how many arrived
    # reordering: out-of-order arrivals over what arrived (UDP packets; TCP's segments)
    udp = {**t, "rx_packets": 1000, "rx_out_of_order": 30}
    tcp = {"transport": "tcp", "rx_data_segments": 3000, "rx_out_of_order": 10}
    mixed = read({"fabric": {"variant": "x"}, "complete": True,
                  "collectives": [{"job": 0, "op": "flows", "algorithm": "direct", "bytes": 8,
                                   "time_us": 10.0, "algbw_GBps": 1.0, "busbw_GBps": 1.0,
                                   "efficiency": 0.5, "communicator_size": 2, "transport": x}
                                  for x in (udp, tcp)]})
    assert variant_row(mixed).reordered == pytest.approx(40 / 4000)
