"""A training job's iterations from its collectives' predictions (pure): each iteration's
predicted time, compute and exposed communication, as ``fabriclab predict`` prints them and
``fabriclab run`` stores them beside the measured iterations."""

from __future__ import annotations

from traffic.predict.predictor import Predicted
from traffic.workloads.workload import Workload


def iterations(workload: Workload, predicted: list[Predicted]) -> list[dict]:
    """Each training iteration's predicted time, compute and exposed communication: the
    collectives in stream order, each after the compute before it (the slowest rank's), an
    overlapped bucket (``barrier`` False) not before its release after the last barrier."""
    seconds = {(p.job, p.index): p.seconds for p in predicted}
    out = []
    for job in workload.jobs:
        rows: dict[int, dict] = {}
        now = seg_start = seg_release = 0.0
        for k, coll in enumerate(job.collectives):
            if coll.iteration is None:
                continue
            row = rows.get(coll.iteration)
            if row is None:
                row = rows[coll.iteration] = {"job": job.index, "iteration": coll.iteration,
                                              "start": now, "compute_s": 0.0, "comm_s": 0.0}
            gap = max(coll.gaps) if coll.gaps else coll.gap_s
            if coll.barrier:
                row["compute_s"] += gap
                seg_start, seg_release = now, gap
                begin = now + gap
            else:
                row["compute_s"] += max(0.0, gap - seg_release)
                seg_release = max(seg_release, gap)
                begin = max(now, seg_start + gap)
            now = begin + seconds[(job.index, k)]
            row["comm_s"] += seconds[(job.index, k)]
            row["end"] = now
        for row in rows.values():
            total = row.pop("end") - row.pop("start")
            out.append({**row, "predicted_s": round(total, 6),
                        "compute_s": round(row["compute_s"], 6),
                        "comm_s": round(row["comm_s"], 6),
                        "exposed_comm_s": round(total - row["compute_s"], 6)})
    return out
