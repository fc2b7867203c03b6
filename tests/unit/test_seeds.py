"""The run seed (fabriclab/model/seeds.py): every seed a file leaves out takes it, the jobs
carry it to their agents' source ports, a sweep over it changes them all, and a file without
one runs as before (every seed 1)."""

from __future__ import annotations

import pytest

from fabriclab.model import experiment as xp
from fabriclab.model import seeds
from testbed.errors import ConfigError

FILE = {"version": 1, "fabric": {"topology": "fat_tree", "k": 4},
        "workload": {"collectives": [
            {"op": "flows", "pattern": "permutation", "size": "1MiB"},
            {"op": "flows", "pattern": "permutation", "size": "1MiB", "seed": 3},
            {"op": "all_reduce", "size": "1MiB",
             "ranks": {"count": 4, "placement": "random"}}]}}


def _pairs(exp) -> list:
    return [sorted((t.src, t.dst) for t in job.collectives[0].schedule.transfers)
            for job in exp.workload.jobs[:2]]


def test_a_file_without_a_seed_runs_with_every_seed_1_as_before():
    exp = xp.parse(FILE)
    assert exp.seed == 1 and all(job.seed == 1 for job in exp.workload.jobs)
    assert "seed" not in exp.raw["workload"]["collectives"][0]  # the file as written
    explicit = xp.parse({**FILE, "seed": 1})
    assert _pairs(explicit) == _pairs(exp)
    assert explicit.workload.jobs[2].collectives[0].hosts == exp.workload.jobs[2].collectives[0].hosts


def test_the_run_seed_fills_every_seed_left_out_and_reaches_the_jobs():
    exp = xp.parse({**FILE, "seed": 11})
    entries = exp.raw["workload"]["collectives"]
    # the experiment as run names every seed: a replay needs no default
    assert [e.get("seed") for e in entries[:2]] == [11, 3]
    assert entries[2]["ranks"] == {"count": 4, "placement": "random", "seed": 11}
    assert exp.seed == 11 and {job.seed for job in exp.workload.jobs} == {11}
    one = xp.parse(FILE)
    assert _pairs(exp)[0] != _pairs(one)[0]  # another permutation
    assert _pairs(exp)[1] == _pairs(one)[1]  # its own seed kept
    assert exp.workload.jobs[2].collectives[0].hosts != one.workload.jobs[2].collectives[0].hosts


def test_training_takes_the_run_seed_under_its_own_names():
    raw = seeds.apply({"seed": 4, "workload": {"training": {"tp": 2, "top_k": 2},
                                               "collectives": []}})
    assert raw["workload"]["training"] == {"tp": 2, "top_k": 2, "moe_seed": 4, "jitter_seed": 4}
    assert seeds.apply({"workload": {}}) == {"workload": {}}


def test_a_sweep_over_the_seed_gives_each_cell_its_own_and_a_bad_one_is_named(tmp_path):
    exp = xp.parse({**FILE, "sweep": {"axes": {"seed": [1, 2]}}})
    first, second = (cell.experiment for cell in exp.cells)
    assert (first.seed, second.seed) == (1, 2)
    assert _pairs(first)[0] != _pairs(second)[0]
    assert {job.seed for job in second.workload.jobs} == {2}
    with pytest.raises(ConfigError) as err:
        xp.parse({**FILE, "seed": -1})
    assert err.value.path == "seed"
    path = tmp_path / "x.yaml"
    path.write_text("version: 1\nfabric: {topology: fat_tree, k: 4}\nseed: 5\n")
    assert xp.load(path).seed == 5 and xp.load(path, seed=6).seed == 6  # --seed wins
