"""An experiment's prediction (pure): every collective of the base experiment, of each variant
or of each sweep cell, estimated on the fabric as built and routed, with no fabric built
(:mod:`traffic.measure.predict`). ``fabriclab predict FILE`` prints it; ``fabriclab run``
stores each run's beside its measurement (``results.json`` ``prediction``, and per collective
row ``predicted_s``).
"""

from __future__ import annotations

from fabriclab.model import experiment as xp
from fabriclab.model import traffic as traffic_out
from traffic.measure import metrics
from traffic.measure.predict import (DEFAULT_DRAWS, SHARE_CV, Predicted, Predictor, Router,
                                     iterations)
from traffic.measure.transport import goodput_fraction

WHAT = ("max-min sharing of the links by each step's connections on the paths the switches "
        "give them (dmodk exact, ecmp the mean over hash draws, spray and sprayed transports "
        "evenly split, adaptive placed on the least loaded path), at the link rates times the "
        "payload share at the MTU; where several shared links bound a step, TCP's uneven "
        "shares drawn (share_cv); 1 ms per step and connection to a peer for the agents' "
        "hand-off and 0.4 ms per rank for the spread of a barrier's release; no queues, "
        "losses or slow start")


def predict(exp: xp.Experiment, draws: int = DEFAULT_DRAWS,
            share_cv: float | None = None) -> list[Predicted]:
    """One experiment's collectives (a variant's or a cell's: not its variants);
    ``share_cv`` how unevenly TCP's flows share a link (None: :data:`SHARE_CV`)."""
    if exp.workload is None:
        return []
    ctl = exp.controller
    routing = str(ctl.routing) if ctl.own else "ecmp"  # an app's or remote's routes: unknown
    predictor = Predictor(exp.topology, routing, str(ctl.ecmp_seed),
                          goodput_fraction(exp.fabric.mtu), draws,
                          share_cv=SHARE_CV if share_cv is None else share_cv)
    return predictor.workload(exp.workload)


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
    out = {"routing": str(exp.controller.routing) if exp.controller.own else "ecmp",
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


def attach(rows: list[dict], prediction: dict | None) -> None:
    """Each measured collective row's prediction (``predicted_s``), matched by job and place
    in the job (``repetition``)."""
    if not prediction:
        return
    by_key = {(p["job"], p["index"]): p["predicted_s"] for p in prediction["collectives"]}
    for row in rows:
        predicted = by_key.get((row.get("job"), row.get("repetition")))
        if predicted:
            row["predicted_s"] = predicted


def router(exp: xp.Experiment) -> Router:
    """The paths of ``exp``'s fabric under its routing."""
    ctl = exp.controller
    return Router(exp.topology, str(ctl.routing) if ctl.own else "ecmp", str(ctl.ecmp_seed),
                  goodput_fraction(exp.fabric.mtu))


def traffic_document(exp: xp.Experiment) -> dict:
    """``traffic.json`` before the run: the matrix and each collective's links as routed
    (:mod:`fabriclab.model.traffic`); the run adds its batches' measured links."""
    if exp.workload is None:
        return {}
    return {"matrix": traffic_out.matrix(exp.workload),
            "phases": traffic_out.phase_links(router(exp), exp.workload), "batches": []}
