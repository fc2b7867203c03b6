"""What a workload should take on a fabric, from its schedules and the fabric as routed (pure):
the prediction that ``fabriclab predict`` prints and ``fabriclab run`` stores beside each
measurement.

Every transfer is split over its connections (``chunk_sizes``, as the agents split it; on a
multi-plane fabric connection ``c`` takes plane ``c % planes``), and every connection follows
the path the switches give it:

* ``dmodk``: exactly the controller's D-mod-k up-ports (:mod:`testbed.model.routes`);
* ``ecmp``: a hash draw per connection and switch among the equal-cost next hops (with a
  ``shared`` hash basis, one draw per connection that every switch reduces the same way: the
  polarization the switches show), fixed for the job as a connection's 5-tuple is; the
  prediction is the expectation over the draws: the mean of ``draws`` seeded ones, with
  their range, corrected by their busiest-link bounds against the mean bound of many more
  path draws (:mod:`traffic.predict.pathdraws`, a control variate);
* ``spray`` (or a sprayed transport, uet by default): each connection split evenly over the
  next hops at every switch (ideal per-link sharing);
* ``adaptive``: each connection placed, largest first, on the path whose busiest link it
  loads least (what a load-aware router at best reaches);
* ``local_adaptive`` by flowlet (``local_flowlet``): each step's new connections in a random
  order, each switch putting each on the next hop it has put the fewest of the step's
  connections on, ties drawn (a switch balances its own ports, blind to the links beyond;
  flowlets a flow keeps while it sends, as TCP does); the mean over ``draws``. Weighing the
  next switch (``local_flowlet_next``): the count on a next hop is the more of its link's and
  the next hop's own least count beyond it (its path quality), recursively. Rebalancing
  (``local_flowlet_rebalance``, ``local_flowlet_next_rebalance``): as each starts, one
  connection at a time moves to the path whose busiest link (or source switch's own link),
  carrying it, is lighter by the quality delta at max-min fair rates, until none does; then
  held-back connections are walked along their chains of collisions
  (:meth:`~traffic.predict.router.Router.rebalance`). By packet (``local_packet``): an even
  split at every switch, as ``spray``.

A step's flows start together and share links max-min fairly (:mod:`traffic.predict.flowsim`);
the next step starts a hand-off after the slowest has ended (:data:`STEP_OVERHEAD_S` per
connection per peer: every rank at once, a ring's ranks wait for the slowest link anyway); a
collective takes the sum of its steps plus the compute before it, and one that starts behind
the agents' barrier the spread of its release over its ranks (:data:`RELEASE_S_PER_RANK`:
the agents time a collective from its first rank's start to its last rank's end).
A pairwise all-to-all (every transfer on a connection of its own) that runs alone is
simulated rank by rank instead (:mod:`traffic.predict.progress`): each rank moves on once its
own receives are in, as the agents do. Jobs that run at once (``concurrent``) share links
step by step (step ``i`` of each job's current collective together), each job's step lasting
until its own flows have ended. Link capacity is the rate times the wire's payload share
(TCP/IP headers at the fabric's MTU).
Queues, losses, retransmissions, slow start and CPU limits are not in it: the measured time
over the predicted one is what they cost.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from testbed.model.topology import Topology
from traffic.predict.flowsim import finish_times
from traffic.predict.pathdraws import BoundDraws, step_bound
from traffic.predict.progress import completion, own_connections
from traffic.predict.router import FLOWLETS, REBALANCED, Router, sprayed
from traffic.predict.shares import Shares
from traffic.workloads.schedules import chunk_sizes
from traffic.workloads.workload import Collective, Job, Workload

#: a step of at most this many new connections is rebalanced as each starts (each pass sees
#: those started before it); a larger one once, all started
INCREMENTAL_STEP = 64

DEFAULT_DRAWS = 16
#: what a step costs beyond its bytes, per connection to a peer: the agents hand the next
#: step's sends over once the last receive is in (0.5-3 ms measured on a 2-core machine with
#: one connection, about twice that with two; the emulated links' token buckets let a small
#: transfer through at once, so no store-and-forward time is added)
STEP_OVERHEAD_S = 1e-3
#: how far apart the barrier's release starts a collective's ranks, per rank after the first:
#: rank 0 answers them one by one and each wakes behind the others on the cores (measured on
#: a 2-core machine: 8 ranks 1-5.5 ms, 16 ranks 4-11 ms; 128 ranks 0.24-0.38 s, where the
#: agents crowd the cores: the few seconds' collectives of so many ranks barely notice)
RELEASE_S_PER_RANK = 0.4e-3
#: how unevenly TCP's flows share a link: the coefficient of variation of a flow's share
#: around the fair one (see :class:`~traffic.predict.shares.Shares`)
SHARE_CV = 0.6
#: draws of those shares where the paths are fixed (D-mod-k): a step bound by many links
#: averages its own unevenness, a few draws give its mean
SHARE_DRAWS = 4
#: flows of uneven shares due within 5 % of the next to end end with it, midway (the
#: simulation's re-sharings a few per step instead of one per flow; the predictions move by
#: under 0.5 % against 0.2 %)
TOGETHER = 0.05


@dataclass(frozen=True)
class Predicted:
    """One collective's predicted time (seconds, from its start to its end as the agents time
    it: the compute before it, ``gap_s``, apart): the expectation over hash draws (see the
    module docstring), and the simulated draws' range."""

    job: int
    index: int  # the collective's place in its job
    label: str
    op: str
    seconds: float
    low_s: float
    high_s: float
    gap_s: float  # the compute before the collective
    draws: int
    busiest: str  # the link whose bytes over capacity bound the collective most
    path_draws: int = 0  # the path draws of the busiest-link bound's mean (0: none)

    def to_dict(self) -> dict:
        return {"job": self.job, "index": self.index, "label": self.label, "op": self.op,
                "predicted_s": round(self.seconds, 6), "low_s": round(self.low_s, 6),
                "high_s": round(self.high_s, 6), "gap_s": self.gap_s, "draws": self.draws,
                "busiest_link": self.busiest, "path_draws": self.path_draws}


class Predictor:
    """Predicted times of a workload's collectives on one fabric (see the module docstring).

    Args:
        topo: the fabric.
        routing: the controller's routing mode.
        ecmp_seed: ``per_switch`` or ``shared``.
        goodput: the payload share of a link's bits (``goodput_fraction(mtu)``).
        draws: ECMP hash draws to average over.
        seed: the draws' seed.
        step_overhead_s: added to every step per connection to a peer (the agents'
            hand-off between steps).
        release_s_per_rank: added to a collective behind a barrier per rank after the first
            (the spread of the barrier's release).
    """

    def __init__(self, topo: Topology, routing: str = "ecmp", ecmp_seed: str = "per_switch",
                 goodput: float = 1.0, draws: int = DEFAULT_DRAWS, seed: int = 1,
                 step_overhead_s: float = STEP_OVERHEAD_S,
                 share_cv: float = SHARE_CV,
                 release_s_per_rank: float = RELEASE_S_PER_RANK) -> None:
        self.router = Router(topo, routing, ecmp_seed, goodput)
        self.draws = draws
        self.seed = seed
        self.step_overhead_s = step_overhead_s
        self.share_cv = share_cv
        self.release_s_per_rank = release_s_per_rank
        #: paced collectives' seconds by their flows and paths (a job's repetitions share
        #: their connections, so a draw's paths repeat: one simulation serves them all)
        self._paced_s: dict[tuple, float] = {}

    def workload(self, workload: Workload) -> list[Predicted]:
        """Every collective of every job, batch by batch."""
        return [p for batch in workload.batches() for p in self.batch(batch)]

    def batch(self, jobs: list[Job], paths: dict[tuple, tuple] | None = None) -> list[Predicted]:
        """The collectives of jobs that run at once; ``paths``: every connection's path as
        the switches gave it (``(job, src host, dst host, channel)`` -> the links of
        :meth:`Router.hashed_path`), which then replaces the hash draws."""
        router = self.router
        random_paths = not paths and any(router.random_paths(sprayed(j)) for j in jobs)
        # switch-local flowlets break the switches' ties by draw as well (no bound for those)
        drawn = random_paths or (not paths and router.routing in FLOWLETS
                                 and not all(sprayed(j) for j in jobs))
        draws = (self.draws if drawn else min(self.draws, SHARE_DRAWS)
                 if self.share_cv > 0 else 1)
        times: dict[tuple[int, int], list[float]] = {}
        bounds: dict[tuple[int, int], list[float]] = {}
        loads: dict[tuple[int, int], dict[int, float]] = {}
        self._shared_steps = False
        self._fair: dict[tuple, list[float]] = {}  # a step's finish times at fair shares
        self._own: dict[tuple[int, int], bool] = {}  # collectives paced by their ranks
        for draw in range(draws):
            rng = random.Random(self.seed * 100_003 + draw)
            shares = Shares(self.share_cv, self.seed * 7_919 + draw)
            fixed = self._adaptive(jobs) if router.routing == "adaptive" else dict(paths or {})
            bound: dict[tuple[int, int], float] = {}
            for key, seconds in self._run(jobs, rng, fixed, loads if draw == 0 else None,
                                          shares, bound).items():
                times.setdefault(key, []).append(seconds)
                bounds.setdefault(key, []).append(bound.get(key, 0.0))
            if draw == 0 and not drawn and not self._shared_steps:
                draws = 1  # every link carried one flow at a time: no draw can differ
                break
        many = (BoundDraws(router, self.seed).means(self._steps(jobs))
                if random_paths and draws > 1 else None)
        out = []
        for job in jobs:
            for k, coll in enumerate(job.collectives):
                t = times[(job.index, k)]
                mean = sum(t) / len(t)
                if many:
                    mean = _controlled(t, bounds[(job.index, k)], many[0][(job.index, k)])
                load = loads.get((job.index, k), {})
                worst = max(load, key=lambda i: load[i] / router.capacity[i], default=None)
                out.append(Predicted(job.index, k, coll.label or coll.op, coll.op,
                                     mean, min(t), max(t), coll.gap_s, draws,
                                     router.names.get(worst, ""),
                                     many[1] if many else 0))
        return out

    def _steps(self, jobs: list[Job]) -> list[tuple[int, list[tuple[tuple, int, float]]]]:
        """Every step of a batch as its collective's place and its flows (connection key,
        job, bytes), in the order :meth:`_run` takes them."""
        out = []
        for k in range(max(len(j.collectives) for j in jobs)):
            now = [j for j in jobs if k < len(j.collectives)]
            for step in range(max(j.collectives[k].schedule.steps for j in now)):
                flows = [((j.index, src, dst, ch), j.index, float(nbytes)) for j in now
                         for src, dst, ch, nbytes in self.connections(j, j.collectives[k], step)]
                if flows:
                    out.append((k, flows))
        return out

    def connections(self, job: Job, coll: Collective, step: int) -> list[tuple]:
        """(src host, dst host, channel, bytes) of one step of a collective."""
        out = []
        for t in coll.schedule.transfers:
            if t.step == step:
                for ch, share in enumerate(chunk_sizes(t.nbytes, job.connections)):
                    if share:
                        out.append((coll.hosts[t.src], coll.hosts[t.dst], ch, share))
        return out

    def _run(self, jobs: list[Job], rng: random.Random, fixed: dict,
             loads: dict | None, shares: Shares,
             bound: dict[tuple[int, int], float]) -> dict[tuple[int, int], float]:
        """One draw: each (job, collective)'s seconds; ``loads`` gets each collective's
        bytes per link, ``bound`` its steps' summed busiest-link bounds
        (:func:`~traffic.predict.pathdraws.step_bound`)."""
        router = self.router
        paths: dict[tuple, tuple] = dict(fixed)
        cache: dict[tuple, list[float]] = {}
        out: dict[tuple[int, int], float] = {}
        for k in range(max(len(j.collectives) for j in jobs)):
            now = [j for j in jobs if k < len(j.collectives)]
            steps = {j.index: j.collectives[k].schedule.steps for j in now}
            for j in now:
                coll = j.collectives[k]
                out[(j.index, k)] = (self.release_s_per_rank * (len(coll.hosts) - 1)
                                     if coll.barrier else 0.0)
            if len(now) == 1 and self._paced(now[0], k):
                out[(now[0].index, k)] += self._progress(now[0], k, rng, paths, loads, bound)
                continue
            for step in range(max(steps.values())):
                flows, owner, keys = [], [], []
                conns = [(j, *c) for j in now for c in self.connections(j, j.collectives[k], step)]
                self._place(conns, paths, rng)
                for j, src, dst, ch, nbytes in conns:
                    key = (j.index, src, dst, ch)
                    flows.append((nbytes, paths[key]))
                    owner.append(j.index)
                    keys.append(key)
                    if loads is not None:
                        load = loads.setdefault((j.index, k), {})
                        for link, w in paths[key]:
                            load[link] = load.get(link, 0.0) + w * nbytes
                if not flows:
                    continue
                for j in now:
                    bound[(j.index, k)] = bound.get((j.index, k), 0.0) + step_bound(
                        flows, router.capacity, [o == j.index for o in owner])
                scale = max(n for n, _p in flows)
                shape = tuple((o, round(n / scale, 6), p) for o, (n, p) in zip(owner, flows))
                if shape not in self._fair:
                    self._fair[shape] = finish_times([(n / scale, p) for n, p in flows],
                                                     router.capacity)
                ends = self._fair[shape]
                claims = shares.of(keys, flows, ends)
                if claims is not None:  # several shared links bound the step: TCP's unevenness
                    self._shared_steps = True
                    shape += (tuple(claims),)
                    if shape not in cache:
                        cache[shape] = finish_times([(n / scale, p) for n, p in flows],
                                                    router.capacity, claims, TOGETHER)
                    ends = cache[shape]
                for j in now:
                    mine = [e for o, e in zip(owner, ends) if o == j.index]
                    if mine:
                        out[(j.index, k)] += (max(mine) * scale
                                               + self.step_overhead_s * j.connections)
        return out

    def _place(self, conns: list[tuple], paths: dict, rng: random.Random) -> None:
        """Paths for a step's connections (``(job, src, dst, channel, bytes)``) that have
        none yet; under switch-local flowlets in a random order (as their first packets
        come), each switch counting the step's connections it already placed."""
        router, placed = self.router, None
        new = list({(j.index, s, d, ch): (j, s, d, ch) for j, s, d, ch, _n in conns
                    if (j.index, s, d, ch) not in paths}.items())
        if router.routing in FLOWLETS:
            placed = {}
            for j, s, d, ch, _n in conns:
                for link, _w in paths.get((j.index, s, d, ch), ()):
                    placed[link] = placed.get(link, 0) + 1
            rng.shuffle(new)
        rebalancing = router.routing in REBALANCED
        fixed = tuple(paths[(j.index, s, d, ch)] for j, s, d, ch, _n in conns
                      if (j.index, s, d, ch) in paths) if rebalancing else ()
        moving: dict[tuple, tuple[str, str, int]] = {}
        for key, (j, s, d, ch) in new:
            paths[key] = router.path(s, d, ch, rng, sprayed(j), placed)
            if rebalancing and not sprayed(j):
                moving[key] = (s, d, ch)
                if len(new) <= INCREMENTAL_STEP:  # moves as they start, one after another
                    router.rebalance(moving, paths, rng, fixed, placed)
        if rebalancing and len(new) > INCREMENTAL_STEP:
            router.rebalance(moving, paths, rng, fixed, placed)

    def _paced(self, job: Job, k: int) -> bool:
        """Whether collective ``k`` of ``job`` runs at its ranks' own pace when alone
        (:func:`~traffic.predict.progress.own_connections`)."""
        key = (job.index, k)
        if key not in self._own:
            self._own[key] = own_connections([(t.step, t.src, t.dst)
                                              for t in job.collectives[k].schedule.transfers])
        return self._own[key]

    def _progress(self, job: Job, k: int, rng: random.Random, paths: dict,
                  loads: dict | None, bound: dict[tuple[int, int], float]) -> float:
        """One draw of a collective whose ranks each move on at their own pace
        (:func:`~traffic.predict.progress.completion`, shares fair): its seconds; its loads
        and busiest-link bounds as :meth:`_run` keeps them."""
        router, coll = self.router, job.collectives[k]
        flows = []
        for step in range(coll.schedule.steps):
            mine = []
            self._place([(job, *c) for c in self.connections(job, coll, step)], paths, rng)
            for t in coll.schedule.transfers:
                if t.step != step:
                    continue
                src, dst = coll.hosts[t.src], coll.hosts[t.dst]
                for ch, nbytes in enumerate(chunk_sizes(t.nbytes, job.connections)):
                    if not nbytes:
                        continue
                    key = (job.index, src, dst, ch)
                    mine.append((nbytes, paths[key]))
                    flows.append((step, t.src, t.dst, float(nbytes), paths[key]))
                    if loads is not None:
                        load = loads.setdefault((job.index, k), {})
                        for link, w in paths[key]:
                            load[link] = load.get(link, 0.0) + w * nbytes
            if mine:
                bound[(job.index, k)] = bound.get((job.index, k), 0.0) + step_bound(
                    mine, router.capacity, [True] * len(mine))
        key = (tuple(flows), self.step_overhead_s * job.connections)
        if key not in self._paced_s:
            self._paced_s[key] = completion(flows, router.capacity, key[1])
        return self._paced_s[key]

    def _adaptive(self, jobs: list[Job]) -> dict[tuple, tuple]:
        """Adaptive routing's paths: each connection (largest first, by its bytes over the
        jobs) on the candidate path whose busiest link it loads least."""
        router = self.router
        total: dict[tuple, int] = {}
        for j in jobs:
            for coll in j.collectives:
                for step in range(coll.schedule.steps):
                    for src, dst, ch, nbytes in self.connections(j, coll, step):
                        key = (j.index, src, dst, ch)
                        total[key] = total.get(key, 0) + nbytes
        load = [0.0] * len(router.capacity)
        out = {}
        for key in sorted(total, key=lambda k: (-total[k], k)):
            _job, src, dst, ch = key
            best = min(router.candidates(src, dst, ch), key=lambda p: max(
                (load[i] + w * total[key]) / router.capacity[i] for i, w in p))
            for i, w in best:
                load[i] += w * total[key]
            out[key] = best
        return out


def _controlled(times: list[float], bounds: list[float], expected_bound: float) -> float:
    """The mean of ``times`` corrected by their bounds (a control variate): the draws'
    mean plus ``b`` times how far the bounds' expectation (from many more draws) is from
    their mean over these draws, ``b`` the times' regression on the bounds (0 to 2)."""
    n = len(times)
    mean_t, mean_b = sum(times) / n, sum(bounds) / n
    var = sum((b - mean_b) ** 2 for b in bounds)
    if var <= 1e-18 * max(mean_b * mean_b, 1e-30) * n:
        return mean_t
    slope = sum((t - mean_t) * (b - mean_b) for t, b in zip(times, bounds)) / var
    return mean_t + min(max(slope, 0.0), 2.0) * (expected_bound - mean_b)
