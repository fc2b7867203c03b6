"""An experiment's prediction (pure): every collective of the base experiment, of each variant
or of each sweep cell, estimated on the fabric as built and routed, with no fabric built
(:mod:`traffic.predict`). ``fabriclab predict FILE`` prints it; ``fabriclab run``
stores each run's beside its measurement (``results.json`` ``prediction``, and per collective
row ``predicted_s``).
"""

from __future__ import annotations

from fabriclab.model import experiment as xp
from fabriclab.model import traffic as traffic_out
from fabriclab.model.document import CollectiveRow, Prediction
from testbed.model.topology import hostname
from traffic.measure import metrics
from traffic.predict.iterations import iterations
from traffic.predict.predictor import DEFAULT_DRAWS, SHARE_CV, Predicted, Predictor
from traffic.predict.router import LOCAL_FLOWLET, LOCAL_FLOWLET_NEXT, LOCAL_PACKET, Router
from traffic.measure.transport import goodput_fraction
from traffic.protocol import Connection
from traffic.workloads.program import Program, Reported
from traffic.workloads.schedules import build
from traffic.workloads.workload import Collective, Job

WHAT = ("max-min sharing of the links by each step's connections on the paths the switches "
        "give them (dmodk exact, ecmp the expectation over hash draws: the draws' mean "
        "corrected by their busiest-link bounds against those of 1024 path draws, spray and "
        "sprayed transports evenly split, adaptive placed on the least loaded path, "
        "switch-local flowlets at each switch on the next hop it gave the fewest of the "
        "step's connections (ties drawn; the mean over the draws; weighing the next switch, "
        "counting as well the fewest that hop gave on its way on; rebalancing, then, as "
        "each starts, one at a time to the path lighter by the quality delta at max-min "
        "rates, and held-back ones walked along their chains of collisions), "
        "switch-local packets evenly split), at the "
        "link rates times the payload share at the MTU; a pairwise all-to-all alone at each "
        "rank's own pace (a sender held to a 64 KiB receive window until its receiver "
        "reaches the step); elsewhere, where several shared links bound a step, TCP's uneven "
        "shares drawn (share_cv); 1 ms per step and connection to a peer for the agents' "
        "hand-off and 0.4 ms per rank for the spread of a barrier's release; no queues, "
        "losses or slow start")


def routing_of(ctl) -> str:
    """The routing the prediction assumes: the controller's mode (switch-local adaptive
    routing's by its granularity: :data:`~traffic.predict.router.LOCAL_FLOWLET`,
    :data:`~traffic.predict.router.LOCAL_PACKET`, by flowlet weighing the next switch
    :data:`~traffic.predict.router.LOCAL_FLOWLET_NEXT`, each with ``_rebalance`` when its
    flowlets rebalance; by packet it is modelled as an even
    split either way); an app's or a remote controller's routes are unknown: ECMP's."""
    if not ctl.own:
        return "ecmp"
    if str(ctl.routing) == "local_adaptive":
        if str(ctl.granularity) == "packet":
            return LOCAL_PACKET
        mode = LOCAL_FLOWLET_NEXT if str(ctl.load) == "next_switch" else LOCAL_FLOWLET
        return f"{mode}_rebalance" if any(getattr(ctl, "rebalance", (0, 0))) else mode
    return str(ctl.routing)


def predict(exp: xp.Experiment, draws: int = DEFAULT_DRAWS,
            share_cv: float | None = None) -> list[Predicted]:
    """One experiment's collectives (a variant's or a cell's: not its variants);
    ``share_cv`` how unevenly TCP's flows share a link (None: :data:`SHARE_CV`)."""
    if exp.workload is None:
        return []
    ctl = exp.controller
    routing = routing_of(ctl)  # an app's or remote's routes: unknown
    predictor = Predictor(exp.topology, routing, str(ctl.ecmp_seed),
                          goodput_fraction(exp.fabric.mtu), draws,
                          share_cv=SHARE_CV if share_cv is None else share_cv)
    return predictor.workload(exp.workload)


def workload_wall_s(exp: xp.Experiment) -> float:
    """At least how long one experiment's workload takes, in its own (emulated) seconds: the
    predicted transfers (one hash draw at fair shares: an estimate, cheap enough for
    ``validate`` over many variants) and one base RTT per step, which the prediction leaves
    out and a time-scaled fabric makes long."""
    colls = [c for job in (exp.workload.jobs if exp.workload else ()) for c in job.collectives]
    steps = sum(len({t.step for t in c.schedule.transfers}) for c in colls)
    return sum(p.seconds for p in predict(exp, 1, share_cv=0.0)) + steps * exp.base_rtt_s


def program_rows(exp: xp.Experiment, program: Program, reports: list[Reported],
                 job: int) -> list[CollectiveRow]:
    """The collectives a program reported, as rows of ``results.json`` beside the agents':
    NCCL-tests' figures from the program's own time, the ideal, and ``fabriclab predict``'s
    time for the same collective on its ranks' hosts (the program's, or those the line
    names; rank order, or the reverse for a ring that sends to the rank before), one
    connection per peer as a program opens. With several ranks on a host the prediction is
    left out (the fabric sees hosts, not ranks)."""
    rate, goodput = exp.fabric.host_link.rate_mbps, goodput_fraction(exp.fabric.mtu)
    predictor = None
    rows = []
    for index, rep in enumerate(reports):
        named = {hostname(h): h for h in exp.topology.nodes}  # a hostname -> its node
        ranks = tuple(named.get(h, h) for h in rep.hosts) or \
            tuple(h for h in program.hosts for _ in range(program.per_host))
        n = len(ranks)
        seconds = rep.time_us / 1e6
        schedule = build(rep.op, n, rep.bytes, rep.algorithm) if n >= 2 else None
        predicted = None
        known = all(h in exp.topology.nodes for h in ranks)
        if schedule is not None and len(set(ranks)) == n and known:
            hosts = tuple(reversed(ranks)) if rep.reverse else ranks
            coll = Collective(rep.op, hosts, schedule, label=rep.label)
            if predictor is None:
                ctl = exp.controller
                predictor = Predictor(exp.topology, routing_of(ctl),
                                      str(ctl.ecmp_seed), goodput, DEFAULT_DRAWS,
                                      share_cv=SHARE_CV)
            (p,) = predictor.batch([Job(job, (coll,), 1, program.timeout_s)])
            predicted = round(p.seconds, 6)
        factor = metrics.bus_factor(rep.op, n) if rep.op in metrics.BUS_FACTOR else 1.0
        algbw = metrics.algbw_GBps(rep.bytes, seconds)
        rows.append(CollectiveRow(
            rep.op, rep.bytes, rep.time_us, algbw, algbw * factor,
            algbw * factor * 8e3 / rate, job=job, repetition=index,
            algorithm=schedule.algorithm if schedule else (rep.algorithm or ""),
            ranks=list(ranks), label=rep.label or f"program {rep.op}",
            ideal_s=metrics.ideal_time_s(rep.op, n, rep.bytes, rate, goodput)
            if rep.op in metrics.BUS_FACTOR else 0.0,
            communicator_size=n, predicted_s=predicted))
    return rows


def document(exp: xp.Experiment, draws: int = DEFAULT_DRAWS,
             share_cv: float | None = None) -> dict:
    """What ``results.json`` stores and ``predict --json`` prints for one experiment: the
    routing it assumed, how, and per collective the prediction and its busbw."""
    rows = []
    colls = [c for job in (exp.workload.jobs if exp.workload else ()) for c in job.collectives]
    predicted = predict(exp, draws, share_cv)
    for p, coll in zip(predicted, colls):
        comm = max(p.seconds, 1e-12)
        n = coll.schedule.communicator_size
        row = p.to_dict()
        row["busbw_GBps"] = round(metrics.busbw_GBps(coll.op, n, coll.schedule.size_bytes, comm)
                                  if coll.op in metrics.BUS_FACTOR else 0.0, 6)
        rows.append(row)
    out = {"routing": routing_of(exp.controller),
           "draws": draws, "share_cv": SHARE_CV if share_cv is None else share_cv,
           "model": WHAT, "collectives": rows}
    if exp.workload is not None:
        its = iterations(exp.workload, predicted)
        if its:
            out["iterations"] = its
    return out


def targets(exp: xp.Experiment) -> list[tuple[str, xp.Experiment]]:
    """What a run of ``exp`` measures, by name: its variants, its sweep's cells (one per
    cell, not per repetition), or itself."""
    if exp.variants:
        return [(v.variant or "", v) for v in exp.variants]
    if exp.cells:
        seen: dict[str, xp.Experiment] = {}
        for cell in exp.cells:
            seen.setdefault(cell.plan.group, cell.experiment)
        return list(seen.items())
    return [("", exp)]


def attach(rows: list[CollectiveRow], prediction: Prediction | None) -> None:
    """Each measured collective row's prediction (``predicted_s``), matched by job and place
    in the job (``repetition``)."""
    if not prediction:
        return
    by_key = {(p.job, p.index): p.predicted_s for p in prediction.collectives}
    for row in rows:
        predicted = by_key.get((row.job, row.repetition))
        if predicted:
            row.predicted_s = predicted


def hashing_known(exp: xp.Experiment, datapath: str | None) -> str | None:
    """Why a run of ``exp`` cannot have a prediction of the paths as its switches hashed
    them, or None when it can: the fabric's own ECMP routing on eBPF switches (whose hash
    :func:`testbed.plan.groups.flow_hash` reproduces), links that stay up, TCP."""
    ctl = exp.controller
    if not ctl.own or str(ctl.routing) != "ecmp":
        return "the routing is not the controller's ecmp"
    if datapath != "ebpf":
        return f"the {datapath or 'unknown'} datapath hashes with a function of its own"
    if exp.failures:
        return "link failures change the groups during the run"
    return None


class AsHashed:
    """A run's collectives predicted on the paths their connections took, where the
    switches' hash is known (:func:`hashing_known`), instead of the mean over hash draws
    (TCP's uneven shares still drawn)."""

    def __init__(self, exp: xp.Experiment) -> None:
        self.predictor = Predictor(exp.topology, "ecmp", str(exp.controller.ecmp_seed),
                                   goodput_fraction(exp.fabric.mtu), share_cv=SHARE_CV)
        self.router = self.predictor.router

    def paths(self, jobs: list[Job],
              seen: dict[int, tuple[Connection, ...]]) -> dict[tuple, tuple] | None:
        """Every connection of ``jobs`` (a batch that ran at once) on the path the switches'
        hash gave it (``seen``: job index -> the TCP connections its ranks sent on):
        ``(job, src host, dst host, channel)`` -> its links; None unless every connection
        the jobs' schedules use is known."""
        paths: dict[tuple, tuple] = {}
        for job in jobs:
            if job.transport != "tcp" or not seen.get(job.index):
                return None
            hosts = job.collectives[0].hosts
            for c in seen[job.index]:
                key = (job.index, hosts[c.src], hosts[c.dst], c.channel)
                paths.setdefault(key, self.router.hashed_path(
                    hosts[c.src], hosts[c.dst], c.channel, c.five_tuple))
            needed = {(job.index, src, dst, ch) for coll in job.collectives
                      for step in range(coll.schedule.steps)
                      for src, dst, ch, _n in self.predictor.connections(job, coll, step)}
            if not needed <= set(paths):
                return None
        return paths

    def connection_paths(self, jobs: list[Job],
                         seen: dict[int, tuple[Connection, ...]]) -> dict[tuple, tuple]:
        """The path each connection ``seen`` took as the switches hashed its 5-tuple (any
        transport's: a UDP queue pair's too), whether or not every connection is known."""
        out = {}
        for job in jobs:
            hosts = job.collectives[0].hosts
            for c in seen.get(job.index, ()):
                out[(job.index, hosts[c.src], hosts[c.dst], c.channel)] = \
                    self.router.hashed_path(hosts[c.src], hosts[c.dst], c.channel, c.five_tuple)
        return out

    def predict(self, jobs: list[Job], paths: dict[tuple, tuple]) -> list[Predicted]:
        """The collectives of ``jobs`` on ``paths``."""
        return self.predictor.batch(jobs, paths)

    def links(self, jobs: list[Job], paths: dict[tuple, tuple]) -> dict[tuple, dict]:
        """Per collective, the bytes each directed link carried on ``paths``."""
        return traffic_out.hashed_links(self.router, jobs, paths)


def attach_hashed(rows: list[CollectiveRow], predicted: list[Predicted]) -> None:
    """Each measured row's prediction on its paths as hashed (``predicted_hashed_s``)."""
    by_key = {(p.job, p.index): p.seconds for p in predicted}
    for row in rows:
        seconds = by_key.get((row.job, row.repetition))
        if seconds:
            row.predicted_hashed_s = round(seconds, 6)


def router(exp: xp.Experiment) -> Router:
    """The paths of ``exp``'s fabric under its routing."""
    ctl = exp.controller
    return Router(exp.topology, routing_of(ctl), str(ctl.ecmp_seed),
                  goodput_fraction(exp.fabric.mtu))


def traffic_document(exp: xp.Experiment) -> dict:
    """``traffic.json`` before the run: the matrix and each collective's links as routed
    (:mod:`fabriclab.model.traffic`); the run adds its batches' measured links."""
    if exp.workload is None:
        return {}
    return {"matrix": traffic_out.matrix(exp.workload),
            "phases": traffic_out.phase_links(router(exp), exp.workload), "batches": []}
