"""MoE's uneven all-to-all (traffic/workloads/moe.py): top-k routing under a Zipf skew, the
combine's transposed matrix, a matrix from a file's rows, the schedule and its most loaded
rank."""

from __future__ import annotations

import pytest

from testbed.errors import ConfigError
from traffic.workloads.moe import (all_to_allv, check_matrix, most_loaded, token_routing,
                                   transpose)

TOKEN = 4096  # bytes of one token's hidden state (2,048 x bf16)


def test_every_token_goes_to_top_k_experts_and_uniform_gating_spreads_evenly():
    m = token_routing(8, 2000, experts=16, top_k=2, token_bytes=TOKEN, skew=0.0, seed=1)
    assert all(sum(row) == 2000 * 2 * TOKEN for row in m)  # each token to 2 experts
    received = [sum(m[s][d] for s in range(8)) for d in range(8)]
    mean = sum(received) / 8
    assert max(received) < 1.1 * mean and min(received) > 0.9 * mean


def test_skew_concentrates_tokens_on_the_popular_experts_rank_and_is_seeded():
    flat = token_routing(8, 2000, 16, 2, TOKEN, skew=0.0, seed=3)
    skewed = token_routing(8, 2000, 16, 2, TOKEN, skew=1.0, seed=3)
    assert skewed == token_routing(8, 2000, 16, 2, TOKEN, skew=1.0, seed=3)
    assert skewed != token_routing(8, 2000, 16, 2, TOKEN, skew=1.0, seed=4)
    _, flat_load = most_loaded(flat)
    hot, load = most_loaded(skewed)
    assert load > 1.5 * flat_load  # the rank of the popular experts receives far more
    assert sum(skewed[s][hot] for s in range(8)) == max(sum(skewed[s][d] for s in range(8))
                                                        for d in range(8))


def test_the_combine_is_the_dispatch_transposed_and_the_schedule_skips_the_diagonal():
    m = [[5, 10, 0], [1, 0, 7], [3, 4, 9]]
    assert transpose(m) == [[5, 1, 3], [10, 0, 4], [0, 7, 9]]
    sched = all_to_allv(m)
    assert sched.steps == 1 and sched.size_bytes == 14  # what the most loaded rank moves
    assert sorted((t.src, t.dst, t.nbytes) for t in sched.transfers) == [
        (0, 1, 10), (1, 0, 1), (1, 2, 7), (2, 0, 3), (2, 1, 4)]
    assert most_loaded(m) == (1, 14)  # rank 1 sends 1 + 7 and receives 10 + 4


@pytest.mark.parametrize("rows,path", [
    ([[0, 1], [2]], "m[1]"), ([[0, -1], [2, 0]], "m[0][1]"), ([[0, 1.5], [2, 0]], "m[0][1]"),
    ([], "m")])
def test_a_bad_matrix_names_its_entry(rows, path):
    with pytest.raises(ConfigError) as err:
        check_matrix(rows, "m")
    assert err.value.path == path


@pytest.mark.parametrize("kw,path", [
    ({"experts": 12}, "moe.experts"), ({"top_k": 0}, "moe.top_k"), ({"skew": -1.0}, "moe.skew")])
def test_routing_settings_are_checked_by_name(kw, path):
    args = {"ranks": 8, "tokens_per_rank": 10, "experts": 16, "top_k": 2, "token_bytes": TOKEN,
            **kw}
    with pytest.raises(ConfigError) as err:
        token_routing(**args)
    assert err.value.path == path


# -- in the workload file and in training ------------------------------------------------------

from fabriclab.model import experiment as config  # noqa: E402

BASE = {"version": 1, "fabric": {"topology": "fat_tree", "k": 4}}


def test_an_all_to_allv_entry_from_the_routing_model_or_a_matrix_file(tmp_path):
    exp = config.parse({**BASE, "workload": {"collectives": [
        {"op": "all_to_allv", "ranks": 8, "moe": {"experts": 16, "tokens": 500, "skew": 1.0}}]}})
    (coll,) = exp.workload.jobs[0].collectives
    matrix = token_routing(8, 500, 16, 2, 4096, 1.0, 1)  # the defaults: top_k 2, 4 KiB tokens
    assert coll.op == "all_to_allv" and len(coll.hosts) == 8
    assert coll.schedule.size_bytes == most_loaded(matrix)[1]
    assert sorted((t.src, t.dst, t.nbytes) for t in coll.schedule.transfers) == sorted(
        (s, d, matrix[s][d]) for s in range(8) for d in range(8) if s != d and matrix[s][d])
    (tmp_path / "m.json").write_text("[[0, 5, 7], [1, 0, 0], [2, 3, 0]]")
    (tmp_path / "x.yaml").write_text(
        "version: 1\nfabric: {topology: fat_tree, k: 4}\nworkload:\n  collectives:\n"
        "    - {op: all_to_allv, ranks: 3, matrix: m.json}\n")
    (coll,) = config.load(tmp_path / "x.yaml").workload.jobs[0].collectives
    assert coll.schedule.size_bytes == 12 and coll.schedule.sent_by(0) == 12


@pytest.mark.parametrize("entry,path,text", [
    ({"op": "all_to_allv", "ranks": 4}, "workload.collectives[0].moe", "one of them"),
    ({"op": "all_to_allv", "ranks": 4, "size": "1MiB", "moe": {}},
     "workload.collectives[0].size", "not size"),
    ({"op": "all_to_allv", "ranks": 4, "matrix": [[0, 1], [1, 0]]},
     "workload.collectives[0].matrix", "2 x 2 matrix for 4 ranks"),
    ({"op": "all_to_allv", "ranks": 2, "matrix": [[0, 1], [1, -1]]},
     "workload.collectives[0].matrix[1][1]", ">= 0"),
    ({"op": "all_to_allv", "ranks": 4, "moe": {"experts": 6}},
     "workload.collectives[0].moe.experts", "spread evenly"),
    ({"op": "all_to_allv", "ranks": 4, "matrix": "absent.json"},
     "workload.collectives[0].matrix", "cannot read"),
])
def test_a_bad_all_to_allv_entry_names_its_field(entry, path, text):
    with pytest.raises(ConfigError) as err:
        config.parse({**BASE, "workload": {"collectives": [entry]}})
    assert err.value.path == path and text in err.value.message, err.value


def test_training_moe_layers_dispatch_and_combine_uneven_under_skew():
    from traffic.workloads import training

    raw = {"layers": 2, "hidden": 256, "seq_len": 256, "micro_batches": 1, "tp": 2, "pp": 1,
           "dp": 4, "ep": 4, "moe_every": 1, "experts": 16, "top_k": 2,
           "params": 1_000_000}
    flat = training.phases(training.TrainingSpec(**raw))
    moe_phases = [p for p in flat if "all_to_allv" in p.label]
    # 2 MoE layers x (dispatch, combine) forward and (combine grad, dispatch grad) backward
    assert [p.label.split(" ep ")[1] for p in moe_phases] == [
        "dispatch all_to_allv", "combine all_to_allv"] * 2 + [
        "combine grad all_to_allv", "dispatch grad all_to_allv"] * 2
    first, combine = moe_phases[0].schedule, moe_phases[1].schedule
    # the combine sends back what the dispatch brought: the same pairs, reversed
    assert sorted((t.dst, t.src, t.nbytes) for t in first.transfers) == sorted(
        (t.src, t.dst, t.nbytes) for t in combine.transfers)
    # two EP groups (one per tensor-parallel rank): ranks t + 2 d, never across them
    assert all(t.src % 2 == t.dst % 2 for t in first.transfers)
    tokens_out = 256 * 2 * 256 * 2  # tokens x top_k x token bytes, per rank (some stay home)
    assert all(0 < first.sent_by(r) < tokens_out for r in range(8))
    skewed = training.phases(training.TrainingSpec(**{**raw, "moe_skew": 1.0}))
    load = lambda ph: ph.schedule.size_bytes  # noqa: E731 - the most loaded rank's bytes
    mean = lambda ph: sum(t.nbytes for t in ph.schedule.transfers) / 8  # noqa: E731
    assert load(moe_phases[0]) < 1.3 * mean(moe_phases[0])
    hot = [p for p in skewed if "all_to_allv" in p.label][0]
    assert load(hot) > 1.5 * mean(hot)
    with pytest.raises(ConfigError) as err:
        training.phases(training.TrainingSpec(**{**raw, "experts": 6}))
    assert err.value.path == "workload.training.experts"
