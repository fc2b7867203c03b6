"""Ranks that move on each at their own pace (traffic.predict.progress): which schedules it
applies to, even steps as the step-by-step model times them, a rank that runs ahead of a slow
peer, a sender held to a receive window until its receiver reaches the step, and the
predictor's pairwise all-to-alls."""

import pytest

from testbed.model.builders import fat_tree
from traffic.predict.predictor import Predictor
from traffic.predict.progress import completion, own_connections
from traffic.workloads.schedules import build
from traffic.workloads.workload import Collective, Job, Workload


def _up_down(src: int, dst: int, hosts: int) -> tuple:
    """A path from ``src`` to ``dst`` over their own uplink and downlink (links ``src`` and
    ``hosts + dst``)."""
    return ((src, 1.0), (hosts + dst, 1.0))


def test_own_connections_holds_for_pairwise_exchanges_only():
    def shape(op, algorithm=None):
        return [(t.step, t.src, t.dst) for t in build(op, 8, 8_000_000, algorithm).transfers]
    assert own_connections(shape("all_to_all", "pairwise"))
    assert not own_connections(shape("all_to_all", "direct"))  # one step: nothing to pace
    assert not own_connections(shape("all_reduce", "ring"))  # a ring reuses its connections
    assert not own_connections([])


def test_even_steps_take_what_the_step_by_step_model_gives():
    """Four ranks, every flow alone on its sender's uplink and receiver's downlink: three
    steps of 1 s each plus a 10 ms hand-off after each."""
    n = 4
    flows = [(s, r, (r + s + 1) % n, 10.0, _up_down(r, (r + s + 1) % n, n))
             for s in range(n - 1) for r in range(n)]
    assert completion(flows, [10.0] * (2 * n), 0.01) == pytest.approx(3 * (1 + 0.01))


def test_ranks_run_ahead_of_a_slow_peer_and_are_held_to_its_window():
    """Step 0: rank 0 to 1 over a link of half the rate (2 s), rank 2 to 0 (1 s); step 1:
    rank 2 to 1. Rank 2 has no receive in step 0, so it hands step 1 over at once; sharing
    its uplink with 2 -> 0 it gets half of it. Unbounded window: everything is in at 2 s.
    Window 0.25: 2 -> 1 stops at 0.25 B (0.5 s), 2 -> 0 then has the link (0.75 B left: in
    at 1.25 s), and 2 -> 1 resumes when rank 1 reaches step 1 (2 s): 0.75 B more, 2.75 s."""
    up = {0: 0, 1: 1, 2: 2}
    down = {0: 3, 1: 4, 2: 5}
    slow = 6
    flows = [(0, 0, 1, 1.0, ((up[0], 1.0), (down[1], 1.0), (slow, 1.0))),
             (0, 2, 0, 1.0, ((up[2], 1.0), (down[0], 1.0))),
             (1, 2, 1, 1.0, ((up[2], 1.0), (down[1], 1.0)))]
    capacity = [1.0] * 6 + [0.5]
    assert completion(flows, capacity, 0.0, window=1e9) == pytest.approx(2.0)
    assert completion(flows, capacity, 0.0, window=0.25) == pytest.approx(2.75)
    # the step-by-step model: step 0 ends at 2 s, then 2 -> 1 takes 1 s
    assert completion(flows, capacity, 0.0, window=0.0) == pytest.approx(3.0)


def test_pairwise_all_to_all_is_paced_by_its_ranks_under_ecmp_and_even_under_dmodk():
    """On a k=4 fat-tree the pairwise all-to-all's steps end unevenly under ECMP's hash
    draws: at the ranks' own pace it takes less than step by step, and never less than
    its busiest host link's bytes. Under D-mod-k every step is even: both models agree."""
    topo = fat_tree(4)
    hosts = tuple(h.name for h in topo.hosts)
    size = 16 * 2**20
    sched = build("all_to_all", len(hosts), size, "pairwise")
    wl = Workload((Job(0, (Collective("all_to_all", hosts, sched),), 1, 60.0, False),))

    class StepByStep(Predictor):
        def _paced(self, job, k):
            return False

    for routing, low, high in (("ecmp", 0.80, 0.98), ("dmodk", 0.995, 1.005)):
        paced = Predictor(topo, routing, draws=8, share_cv=0.0).workload(wl)[0]
        stepped = StepByStep(topo, routing, draws=8, share_cv=0.0).workload(wl)[0]
        assert low * stepped.seconds <= paced.seconds <= high * stepped.seconds, routing
        per_host = size * (len(hosts) - 1) / len(hosts) * 8 / 100e6
        assert paced.seconds >= per_host
