"""The prediction under switch-local adaptive routing (traffic/predict/router.py): flowlets
each switch balances over its own ports, weighing the next switch, and rebalancing."""

from __future__ import annotations

import random

import pytest

from testbed.model.builders import fat_tree, leaf_spine
from traffic.predict.predictor import Predictor
from traffic.predict.router import Router
from traffic.workloads.schedules import flows
from traffic.workloads.workload import Workload

from tests.unit.test_predict import NO_OVERHEAD, _job


def test_switch_local_flowlets_balance_each_switchs_own_ports_blind_to_the_links_beyond():
    """Switch-local adaptive routing by flowlet: each switch puts a step's connections on the
    next hop it has put the fewest on. Two flows from one leaf to another take both spines
    (line rate, as ``adaptive``). On a k=4 fat-tree a random permutation never sends two
    flows up one link, but flows still meet on the way down, where no switch on the way up
    looks: a shift permutation slower than line rate, faster than ECMP's draws. By packet:
    an even split."""
    topo = leaf_spine(2, 2, 2)
    hosts = [h.name for h in topo.hosts]
    wl = Workload((_job(topo, flows([(0, 2), (1, 3)], 4, 12_500_000), hosts),))
    local = Predictor(topo, "local_flowlet", **NO_OVERHEAD).workload(wl)[0]
    assert local.seconds == pytest.approx(1.0) and local.high_s == pytest.approx(1.0)
    topo = fat_tree(4)
    hosts = [h.name for h in topo.hosts]
    router = Router(topo, "local_flowlet")
    up = {i for (a, b), i in router.index.items()
          if (a.startswith("edge") and b.startswith("agg"))
          or (a.startswith("agg") and b.startswith("core"))}
    rng = random.Random(3)
    for _ in range(20):
        dst = list(range(16))
        rng.shuffle(dst)
        placed: dict[int, int] = {}
        for i, j in enumerate(dst):
            if i != j:
                router.path(hosts[i], hosts[j], 0, rng, placed=placed)
        assert max(placed.get(i, 0) for i in up) == 1
    sched = flows([(i, (i + 5) % 16) for i in range(16)], 16, 12_500_000)
    wl = Workload((_job(topo, sched, hosts),))
    kw = dict(draws=32, **NO_OVERHEAD, share_cv=0.0)
    local = Predictor(topo, "local_flowlet", **kw).workload(wl)[0]
    ecmp = Predictor(topo, "ecmp", **kw).workload(wl)[0]
    # a collective lasts as long as its slowest flow: two meeting on a downlink make it 2 s
    assert local.draws == 32 and 1.0 <= local.low_s <= local.high_s <= 2.0
    assert local.seconds < 0.8 * ecmp.seconds
    packet = Predictor(topo, "local_packet", **kw).workload(wl)[0]
    assert packet.seconds == pytest.approx(1.0, rel=1e-6)


def test_switch_local_flowlets_weighing_the_next_switch_avoid_a_taken_core_downlink():
    """``local_flowlet_next``: an aggregation switch counts the connections on a core's one
    link into the destination pod as well: two flows from pods 2 and 3 to one edge switch of
    pod 1 that leave through aggregation switches of the same index never share a core's
    downlink (blind to it, they do in some draws); the shift permutation is no slower."""
    topo = fat_tree(4)
    shared = {}
    for routing in ("local_flowlet", "local_flowlet_next"):
        router = Router(topo, routing)
        down = {i for (a, b), i in router.index.items() if a.startswith("core")}
        shared[routing] = 0
        for seed in range(40):
            rng, placed = random.Random(seed), {}
            first = router.path("h2_1_1", "h1_1_1", 0, rng, placed=placed)
            second = router.path("h3_1_1", "h1_1_2", 0, rng, placed=placed)
            cores = [{i for i, _ in path} & down for path in (first, second)]
            shared[routing] += bool(cores[0] & cores[1])
    assert shared["local_flowlet_next"] == 0 < shared["local_flowlet"]
    sched = flows([(i, (i + 5) % 16) for i in range(16)], 16, 12_500_000)
    wl = Workload((_job(topo, sched, [h.name for h in topo.hosts]),))
    kw = dict(draws=32, **NO_OVERHEAD, share_cv=0.0)
    blind = Predictor(topo, "local_flowlet", **kw).workload(wl)[0]
    ahead = Predictor(topo, "local_flowlet_next", **kw).workload(wl)[0]
    assert ahead.seconds <= blind.seconds + 1e-9


def test_rebalanced_flowlets_move_off_a_shared_link_and_leave_a_lone_flow():
    """``local_flowlet_next_rebalance``: of two flows placed on one core's downlink, one
    moves to the path whose busiest link, carrying it, is lighter by the quality delta; a
    flow alone on its path stays (another path carrying it would be as busy); a shift
    permutation and a random one come out no slower than without rebalancing."""
    topo = fat_tree(4)
    router = Router(topo, "local_flowlet_next_rebalance")
    ways = {key: router.candidates(*key) for key in (("h2_1_1", "h1_1_1", 0),
                                                     ("h3_1_1", "h1_1_2", 0))}
    down = {i for (a, b), i in router.index.items() if a == "core1" and b == "agg1_1"}

    def through(way) -> bool:
        return bool({i for i, _ in way} & down)
    paths = {key: next(w for w in ways[key] if through(w)) for key in ways}
    router.rebalance(dict(zip(ways, ways)), paths, random.Random(1))
    assert sum(through(p) for p in paths.values()) == 1, paths
    alone = {("h2_1_1", "h1_1_1", 0): paths[("h2_1_1", "h1_1_1", 0)]}
    before = dict(alone)
    router.rebalance({k: k for k in alone}, alone, random.Random(2))
    assert alone == before
    kw = dict(draws=32, **NO_OVERHEAD, share_cv=0.0)
    for pairs in ([(i, (i + 5) % 16) for i in range(16)],
                  list(enumerate(random.Random(7).sample(range(16), 16)))):
        wl = Workload((_job(topo, flows(pairs, 16, 12_500_000),
                            [h.name for h in topo.hosts]),))
        plain = Predictor(topo, "local_flowlet_next", **kw).workload(wl)[0]
        moved = Predictor(topo, "local_flowlet_next_rebalance", **kw).workload(wl)[0]
        assert moved.seconds <= plain.seconds + 1e-9, (pairs, moved.seconds, plain.seconds)


def test_rebalancing_walks_mend_collisions_single_moves_leave(monkeypatch):
    """Walks (a held-back connection moved beside another, which moves on, until a move
    lands on a lighter path): random permutations of a k=4 fat-tree come out faster than
    with single moves alone, never slower on average over the draws; a flow alone starts
    no walk."""
    import traffic.predict.router as router_module

    topo = fat_tree(4)
    hosts = [h.name for h in topo.hosts]
    kw = dict(draws=32, **NO_OVERHEAD, share_cv=0.0)
    faster = 0
    for seed in (1, 7, 11):
        pairs = list(enumerate(random.Random(seed).sample(range(16), 16)))
        wl = Workload((_job(topo, flows(pairs, 16, 12_500_000), hosts),))
        walked = Predictor(topo, "local_flowlet_next_rebalance", **kw).workload(wl)[0]
        monkeypatch.setattr(router_module, "WALKS", 0)
        single = Predictor(topo, "local_flowlet_next_rebalance", **kw).workload(wl)[0]
        monkeypatch.undo()
        assert walked.seconds <= single.seconds + 1e-9, (pairs, walked.seconds, single.seconds)
        faster += walked.seconds < single.seconds - 1e-3
    assert faster >= 1
    router = Router(topo, "local_flowlet_next_rebalance")
    key = ("h2_1_1", "h1_1_1", 0)
    alone = {key: router.candidates(*key)[0]}
    before = dict(alone)
    router.rebalance({key: key}, alone, random.Random(3))
    assert alone == before


def test_the_prediction_assumes_the_switch_local_mode_the_controller_sets():
    from fabriclab.model.prediction import routing_of
    from testbed.model.spec import ControllerSpec, Granularity, Load, Routing

    local = dict(routing=Routing.LOCAL_ADAPTIVE)
    assert routing_of(ControllerSpec(**local)) == "local_flowlet"
    assert routing_of(ControllerSpec(**local, load=Load.NEXT_SWITCH)) == "local_flowlet_next"
    assert routing_of(ControllerSpec(**local, load=Load.NEXT_SWITCH, rebalance=(25, 25))) \
        == "local_flowlet_next_rebalance"
    assert routing_of(ControllerSpec(**local, rebalance=(25, 25))) == "local_flowlet_rebalance"
    assert routing_of(ControllerSpec(**local, granularity=Granularity.PACKET)) == "local_packet"
