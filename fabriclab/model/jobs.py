"""Several jobs on one fabric, as results (pure): each named job's time together with the
others and alone, its slowdown, the prediction's slowdown, and the links it shared
(``results.json`` ``jobs``)."""

from __future__ import annotations

from fabriclab.model.document import CollectiveRow, JobResult, Prediction, RunDocument


def job_seconds(rows: list[CollectiveRow]) -> float | None:
    """A job's wall time from its rows: from the barrier before its first collective (or
    its start less the compute before it) to its last collective's end."""
    if not rows:
        return None
    begin = min(r.released_unix_s if r.released_unix_s is not None
                else r.start_unix_s - r.gap_s for r in rows)
    return max(r.end_unix_s for r in rows) - begin


def predicted_seconds(prediction: Prediction | None, job: int) -> float | None:
    """A job's predicted time: its iterations' where it trains, else its collectives' and
    the compute before each."""
    return prediction.job_seconds(job) if prediction else None


def shared_links(phases: list[dict], jobs: dict[int, str]) -> dict[str, list[str]]:
    """Per named job, the links (as routed) that carry bytes of another job too."""
    users: dict[str, set[str]] = {}
    for phase in phases:
        name = jobs.get(phase["job"])
        if name is None:
            continue
        for link, nbytes in phase["links"].items():
            if nbytes > 0:
                users.setdefault(link, set()).add(name)
    out: dict[str, list[str]] = {name: [] for name in jobs.values()}
    for link, names in sorted(users.items()):
        if len(names) > 1:
            for name in names:
                out[name].append(link)
    return out


def summary(doc: RunDocument, jobs: list[dict], phases: list[dict],
            baseline: dict[str, float] | None = None) -> list[JobResult]:
    """One line per named job (``jobs``: ``{"index", "name", "alone_index", "hosts"}``):
    ``time_s`` together, ``alone_s`` (its alone run's, or the baseline's), ``slowdown``, the
    prediction's, and ``shared_links``."""
    prediction = doc.prediction
    shared = shared_links(phases, {j["index"]: j["name"] for j in jobs})
    out = []
    for j in jobs:
        alone_index = j["alone_index"]
        together = job_seconds(doc.job_rows(j["index"]))
        alone = (job_seconds(doc.job_rows(alone_index)) if alone_index is not None
                 else (baseline or {}).get(j["name"]))
        p_together = predicted_seconds(prediction, j["index"])
        p_alone = predicted_seconds(prediction, alone_index) if alone_index is not None \
            else None
        out.append(JobResult(j["name"], list(j["hosts"]), _round(together), _round(alone),
                             _round(together / alone if together and alone else None),
                             _round(p_together), _round(p_alone),
                             _round(p_together / p_alone if p_together and p_alone else None),
                             shared.get(j["name"], [])))
    return out


def baseline_times(doc: RunDocument) -> dict[str, float]:
    """A baseline run's jobs by name: their time alone (or, run alone there, their time)."""
    return {j.name: j.alone_s or j.time_s for j in doc.jobs or () if j.alone_s or j.time_s}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
