"""Training iterations as clusters run them (traffic/workloads/training.py, presets.py):
compute that no collective carries is not lost, stragglers and jitter per rank, DDP's gradient
buckets released during the backward pass, presets of published models and the size knob."""

import pytest

from fabriclab.model import experiment as config
from testbed.errors import ConfigError
from traffic.workloads import presets, training

DDP = {"layers": 4, "hidden": 256, "seq_len": 128, "micro_batches": 2, "tp": 1, "pp": 1,
       "dp": 4, "params": 40_000_000, "compute_ms": 100, "iterations": 1}


def test_data_parallel_compute_waits_for_the_gradient_all_reduce():
    (phase,) = training.phases(training.TrainingSpec(**DDP))
    # 2 micro-batches, forward and backward 100 ms each: 400 ms before the all-reduce
    assert phase.label == "iter 0 dp all_reduce" and phase.gap_s == pytest.approx(0.4)
    assert phase.gaps is None and phase.barrier


def test_a_straggler_computes_longer_and_jitter_is_seeded_with_mean_one():
    spec = training.TrainingSpec(**DDP, stragglers=((2, 1.5),))
    (phase,) = training.phases(spec)
    assert phase.gaps == pytest.approx((0.4, 0.4, 0.6, 0.4))
    jitter = {**DDP, "iterations": 200, "compute_jitter": 0.2}
    ph = training.phases(training.TrainingSpec(**jitter))
    assert ph == training.phases(training.TrainingSpec(**jitter))
    factors = [g / p.gap_s for p in ph for g in p.gaps]
    assert 0.95 < sum(factors) / len(factors) < 1.05 and max(factors) > 1.2
    with pytest.raises(ConfigError) as err:
        training.TrainingSpec(**DDP, stragglers=((4, 2.0),)).check()
    assert err.value.path == "workload.training.stragglers[0].rank"


def test_ddp_buckets_are_released_as_the_backward_pass_produces_their_gradients():
    spec = training.TrainingSpec(**DDP, overlap=True, bucket_mb=40)
    buckets = training.phases(spec)
    grad = 40_000_000 * 4  # 160 MB: 40 MB per layer, one layer per bucket
    assert [p.label for p in buckets] == [f"iter 0 dp bucket {k} all_reduce" for k in range(4)]
    assert [p.barrier for p in buckets] == [True, False, False, False]
    assert sum(p.schedule.size_bytes for p in buckets) == grad
    # forward, backward, forward (300 ms), then a layer's gradients every 25 ms
    assert [p.gap_s for p in buckets] == pytest.approx([0.325, 0.35, 0.375, 0.4])
    forward = training.phases(training.TrainingSpec(**DDP, overlap=True, bucket_mb=40,
                                                    bucket_order="forward"))
    assert [p.gap_s for p in forward] == pytest.approx([0.4] * 4)  # ready only at the end
    with pytest.raises(ConfigError) as err:
        training.TrainingSpec(**{**DDP, "tp": 2}, overlap=True).check()
    assert err.value.path == "workload.training.overlap"


def test_presets_fill_the_models_shape_and_size_scale_shrinks_every_byte():
    raw = presets.resolve({"preset": "llama3-8b", "tp": 1, "dp": 4, "layers": 2})
    assert raw["hidden"] == 4096 and raw["seq_len"] == 8192 and raw["layers"] == 2
    moe = presets.resolve({"preset": "mixtral-8x7b"})
    assert (moe["experts"], moe["top_k"], moe["moe_every"]) == (8, 2, 1)
    with pytest.raises(ConfigError) as err:
        presets.resolve({"preset": "llama9"})
    assert err.value.path == "workload.training.preset" and "llama3-8b" in err.value.message
    exp = config.parse({"version": 1, "fabric": {"topology": "fat_tree", "k": 4}, "workload": {
        "training": {"preset": "llama3-8b", "tp": 1, "dp": 4, "layers": 2, "size_scale": 1e-4,
                     "micro_batches": 1}}})
    (coll,) = exp.workload.jobs[0].collectives
    assert coll.schedule.size_bytes == round(8_030_000_000 * 4 * 1e-4)


@pytest.mark.parametrize("name", sorted(presets.PRESETS))
def test_every_preset_generates_an_iteration(name):
    p = presets.PRESETS[name]
    ep = 4 if p.experts else 1
    spec = training.TrainingSpec(**{**presets.resolve({"preset": name}), "tp": 2, "dp": 4,
                                    "ep": ep, "micro_batches": 1, "layers": 2,
                                    "size_scale": 1e-5})
    phases = training.phases(spec)
    assert any("dp all_reduce" in ph.label for ph in phases)
    assert any("all_to_allv" in ph.label for ph in phases) == bool(p.experts)
