"""ECMP's path draws in bulk (traffic.predict.pathdraws) and the control variate they give the
prediction: each connection's paths with the probabilities the router draws them, the
busiest-link bound by hand and its expectation where it is known exactly, and the few full
simulations' mean made precise (seed to seed, and against many plain draws)."""

import random
from collections import Counter

import pytest

from testbed.model.builders import fat_tree, leaf_spine
from traffic.predict.pathdraws import BoundDraws, choices, step_bound
from traffic.predict.predictor import Predictor, _controlled
from traffic.predict.router import Router
from traffic.workloads.schedules import build, flows
from traffic.workloads.workload import Collective, Job, Workload


@pytest.mark.parametrize("seed,paths", [("per_switch", 4), ("shared", 2)])
def test_a_connections_paths_come_with_the_probabilities_the_router_draws_them(seed, paths):
    """Across a k=4 fat-tree: four core paths, each a quarter of the draws per switch; with
    one shared basis the aggregation and core switches reduce the same draw alike: two."""
    topo = fat_tree(4)
    router = Router(topo, "ecmp", seed)
    hosts = [h.name for h in topo.hosts]
    src, dst = hosts[0], hosts[-1]
    walks, probs = choices(router, src, dst, 0)
    assert len(walks) == paths and sum(probs) == pytest.approx(1.0)
    rng = random.Random(7)
    seen = Counter(router.path(src, dst, 0, rng) for _ in range(8000))
    assert set(seen) == set(walks)
    for walk, p in zip(walks, probs):
        assert seen[walk] / 8000 == pytest.approx(p, abs=0.03)
    # under one leaf: the one path
    assert choices(router, hosts[0], hosts[1], 0)[1] == [1.0]


def test_the_busiest_link_bound_by_hand():
    capacity = [10.0, 5.0, 10.0]
    step = [(20.0, ((0, 1.0), (1, 1.0))), (10.0, ((1, 1.0),)), (30.0, ((2, 1.0),))]
    # link 1 carries 30 B at 5 B/s: 6 s; link 2 30 B at 10 B/s: 3 s
    assert step_bound(step, capacity, [True, True, True]) == pytest.approx(6.0)
    # the third flow's own links only: 3 s
    assert step_bound(step, capacity, [False, False, True]) == pytest.approx(3.0)


def test_the_bounds_expectation_over_many_draws_where_it_is_known():
    """Two equal flows from one leaf to another over two spines: half the draws put them on
    one spine (its uplink carries both: 2 s), half on two (1 s each): 1.5 s expected."""
    topo = leaf_spine(2, 2, 2)
    router = Router(topo, "ecmp")
    h = [x.name for x in topo.hosts]
    nbytes = 100e6 / 8  # a second at 100 Mbit/s
    step = [((0, h[0], h[2], 0), 0, nbytes), ((0, h[1], h[3], 0), 0, nbytes)]
    means, draws = BoundDraws(router, 1).means([(0, step)])
    assert draws == 1024
    assert means[(0, 0)] == pytest.approx(1.5, rel=0.03)


def test_the_control_variate_by_hand():
    # times that are their bounds plus 0.2 s: the bounds' expectation plus 0.2 s exactly
    assert _controlled([1.2, 2.2, 1.7], [1.0, 2.0, 1.5], 1.4) == pytest.approx(1.6)
    # bounds that do not vary: the plain mean
    assert _controlled([1.0, 2.0], [1.0, 1.0], 5.0) == pytest.approx(1.5)
    # times that do not follow their bounds (slope 0): the plain mean
    assert _controlled([1.0, 1.0, 1.0], [1.0, 2.0, 3.0], 9.0) == pytest.approx(1.0)


def _a2a(topo):
    hosts = [h.name for h in topo.hosts]
    sched = build("all_to_all", len(hosts), 16 * 2**20)
    return Workload((Job(0, (Collective(sched.op, tuple(hosts), sched),), 1, 60.0, False),))


def test_sixteen_draws_with_the_bound_agree_seed_to_seed_and_with_many_plain_draws():
    """A 16-rank all-to-all on a leaf-spine at 1:1 step by step (as when other jobs run at
    once), where the hash decides the time (draws spread by +-15 %): 16 draws with the
    control variate land within 1.5 % of 128 plain draws' mean and within 1 % of each other
    whatever the seed; 16 plain draws spread several times as far."""
    topo = leaf_spine(4, 4, 4)
    wl = _a2a(topo)
    plain = _without_bound(lambda: StepByStep(topo, "ecmp", draws=128).workload(wl)[0])
    assert plain.path_draws == 0
    assert plain.high_s > 1.25 * plain.low_s  # the draws differ
    seeds = (1, 2, 3, 4)
    got = [StepByStep(topo, "ecmp", draws=16, seed=s).workload(wl)[0] for s in seeds]
    assert all(p.path_draws == 1024 for p in got)
    for p in got:
        assert p.seconds == pytest.approx(plain.seconds, rel=0.015)
    spread = max(p.seconds for p in got) / min(p.seconds for p in got) - 1
    assert spread < 0.01
    alone = [_without_bound(lambda s=s: StepByStep(topo, "ecmp", draws=16, seed=s)
                            .workload(wl)[0]).seconds for s in seeds]
    assert max(alone) / min(alone) - 1 > 2 * spread  # what the bound takes away


class StepByStep(Predictor):
    """The step-by-step model for every collective (none paced by its ranks)."""

    def _paced(self, job, k):
        return False


def _without_bound(call):
    kept = BoundDraws.means
    BoundDraws.means = lambda self, steps: None
    try:
        return call()
    finally:
        BoundDraws.means = kept


def test_fixed_paths_and_dmodk_draw_no_paths():
    """D-mod-k has no draws to correct, nor has a single draw."""
    topo = leaf_spine(2, 2, 2)
    hosts = [h.name for h in topo.hosts]
    sched = flows([(0, 2), (1, 3)], 4, 12_500_000)
    wl = Workload((Job(0, (Collective(sched.op, tuple(hosts), sched),), 1, 60.0, False),))
    assert Predictor(topo, "dmodk").workload(wl)[0].path_draws == 0
    assert Predictor(topo, "ecmp", draws=1).workload(wl)[0].path_draws == 0
