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
    assert sched.steps == 1 and sched.size_bytes == 16  # the largest send buffer
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
