"""Traffic out (pure): what a run's workload moved, as ``traffic.json`` holds it.

* ``matrix``: bytes per source and destination host, per job and in total, from the jobs'
  schedules (every transfer of every collective and repetition; a rank's own host excluded);
* ``phases``: per collective, the bytes each directed link carries as routed
  (:class:`traffic.predict.router.Router`: D-mod-k's paths exactly; ECMP's and adaptive
  routing's as the expectation, split evenly over the equal-cost paths; sprayed evenly);
  host links included; on a run whose paths are known as hashed (ECMP on eBPF switches),
  also ``links_as_hashed``: the same on the paths the connections took;
* ``connections`` (such runs only): every TCP connection a job sent on, its ports and the
  links it took, hop by hop;
* ``batches``: per batch of jobs run at once, the bytes each switch port measured it send
  (``node->peer``), from the switches' own counters before and after it.
"""

from __future__ import annotations

import random

from traffic.predict.router import Router, sprayed
from traffic.workloads.schedules import chunk_sizes
from traffic.workloads.workload import Job, Workload


def matrix(workload: Workload) -> dict:
    """``{"hosts": [...], "total": rows, "jobs": {"0": rows, ...}}``: rows[i][j] the bytes
    host i sent host j (hosts in first-seen order)."""
    hosts: dict[str, int] = {}
    per_job: dict[int, dict[tuple[int, int], int]] = {}
    for job in workload.jobs:
        cells = per_job.setdefault(job.index, {})
        for coll in job.collectives:
            for t in coll.schedule.transfers:
                src, dst = coll.hosts[t.src], coll.hosts[t.dst]
                if src == dst:
                    continue
                key = (hosts.setdefault(src, len(hosts)), hosts.setdefault(dst, len(hosts)))
                cells[key] = cells.get(key, 0) + t.nbytes
    n = len(hosts)

    def rows(cells: dict[tuple[int, int], int]) -> list[list[int]]:
        out = [[0] * n for _ in range(n)]
        for (i, j), nbytes in cells.items():
            out[i][j] += nbytes
        return out

    total: dict[tuple[int, int], int] = {}
    for cells in per_job.values():
        for key, nbytes in cells.items():
            total[key] = total.get(key, 0) + nbytes
    return {"hosts": list(hosts), "total": rows(total),
            "jobs": {str(j): rows(cells) for j, cells in per_job.items()}}


def phase_links(router: Router, workload: Workload) -> list[dict]:
    """Per collective, the bytes on each directed link as routed (see the module docstring)."""
    out = []
    expected = router.routing in ("ecmp", "adaptive")
    for job in workload.jobs:
        for k, coll in enumerate(job.collectives):
            links = _links(router, job, k, lambda src, dst, ch, j=job: router.path(
                src, dst, ch, random.Random(0), expected or sprayed(j)))
            out.append({"job": job.index, "index": k, "label": coll.label or coll.op,
                        "links": links})
    return out


def hashed_links(router: Router, jobs: list[Job], paths: dict[tuple, tuple]) -> dict:
    """Per collective of ``jobs``, ``(job, index)`` -> the bytes on each directed link on the
    paths its connections took (``paths``: ``(job, src, dst, channel)`` -> links, as
    :func:`fabriclab.model.prediction.hashed_paths` gives them)."""
    return {(job.index, k): _links(router, job, k,
                                   lambda src, dst, ch, j=job: paths[(j.index, src, dst, ch)])
            for job in jobs for k in range(len(job.collectives))}


def hashed_connections(router: Router, jobs: list[Job], seen: dict[int, tuple],
                       paths: dict[tuple, tuple]) -> list[dict]:
    """One row per connection of ``jobs`` (``seen``: job index -> its
    :class:`~traffic.protocol.Connection` s): job, ranks, hosts, channel, ports and
    ``path``, the links from the sending NIC to the receiving one in order."""
    out = []
    for job in jobs:
        hosts = job.collectives[0].hosts
        for c in sorted(seen.get(job.index, ()), key=lambda c: (c.src, c.dst, c.channel)):
            links = paths.get((job.index, hosts[c.src], hosts[c.dst], c.channel))
            if links is None:
                continue
            out.append({"job": job.index, "src": hosts[c.src], "dst": hosts[c.dst],
                        "src_rank": c.src, "dst_rank": c.dst, "channel": c.channel,
                        "sport": c.sport, "dport": c.dport,
                        "path": _in_order([router.names[i] for i, _w in links])})
    return out


def _in_order(names: list[str]) -> list[str]:
    """Links ``a->b`` of one path from its first node to its last (sorted by name where
    they form no single chain: a path split over several links inside a server)."""
    step = dict(name.split("->", 1) for name in names)
    node = next(iter(set(step) - set(step.values())), None)
    out = []
    while node in step and len(out) < len(names):
        out.append(f"{node}->{step[node]}")
        node = step[node]
    return out if len(out) == len(names) else sorted(names)


def _links(router: Router, job: Job, k: int, path_of) -> dict[str, int]:
    """The bytes each directed link carries of collective ``k`` of ``job``, each connection
    on ``path_of(src host, dst host, channel)``."""
    coll = job.collectives[k]
    links: dict[str, float] = {}
    for t in coll.schedule.transfers:
        for ch, share in enumerate(chunk_sizes(t.nbytes, job.connections)):
            if not share:
                continue
            for i, w in path_of(coll.hosts[t.src], coll.hosts[t.dst], ch):
                name = router.names[i]
                links[name] = links.get(name, 0.0) + w * share
    return {name: round(v) for name, v in sorted(links.items())}


def measured_links(topo, before: dict[str, dict], after: dict[str, dict]) -> dict[str, int]:
    """The bytes each switch port sent between two congestion readings, as ``node->peer``."""
    out = {}
    for link in topo.links:
        for end in (link.a, link.b):
            if not topo.nodes[end.node].is_switch or end.ifname not in after:
                continue
            sent = (after[end.ifname].get("queue", {}).get("bytes", 0)
                    - before.get(end.ifname, {}).get("queue", {}).get("bytes", 0))
            if sent > 0:
                out[f"{end.node}->{link.other(end.node).node}"] = sent
    return out


def batch_entry(index: int, jobs: list[Job], links: dict[str, int]) -> dict:
    """One batch's line of ``batches``."""
    return {"batch": index, "jobs": [j.index for j in jobs], "links": links}
