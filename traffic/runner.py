"""Run collectives on a fabric: one agent per rank host, a shared start, results per collective.

The runner writes the job spec into the run directory, starts ``python -m traffic.agent`` in
every participating host's namespace (tracked by PID in the run record, ended by PID), waits
with a hard timeout, and turns the agents' timings into per-collective results with NCCL-tests'
metrics. A job that times out names the ranks that had not finished.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from testbed.errors import TestbedError
from testbed.fidelity import goodput_fraction
from traffic import metrics
from traffic.workload import Collective

AGENT_PORT = 17000
START_DELAY_S = 1.0


@dataclass
class CollectiveResult:
    """What one collective measured (results.json fields)."""

    op: str
    algorithm: str
    ranks: list[str]
    bytes: int
    duration_s: float
    algbw_gbps: float
    busbw_gbps: float
    ideal_s: float
    efficiency: float
    flow_completion_s: dict[str, float] = field(default_factory=dict)  # p50, p99, max
    label: str = ""
    agent_cpu_s: float = 0.0  # CPU seconds of all agents over the whole job (first row only)
    gap_s: float = 0.0  # compute time before it (training workloads)
    communicator_size: int = 0  # ranks per communicator (len(ranks) unless groups ran at once)


def job_spec(collectives: list[Collective], ips: dict[str, str], connections: int,
             start_at: float, port: int = AGENT_PORT) -> dict:
    """The spec every agent reads. All collectives must use the same rank hosts (one job)."""
    hosts = collectives[0].hosts
    if any(c.hosts != hosts for c in collectives):
        raise ValueError("one job, one rank list")
    return {"port": port, "connections": connections, "start_at": start_at,
            "ranks": [{"host": h, "ip": ips[h]} for h in hosts],
            "collectives": [{"op": c.op, "gap_s": c.gap_s,
                             "transfers": [(t.step, t.src, t.dst, t.nbytes)
                                           for t in c.schedule.transfers]}
                            for c in collectives]}


def run_batch(fabric, jobs: list[tuple[list[Collective], int, float]]
              ) -> list[list[CollectiveResult] | TestbedError]:
    """Run several jobs at once, each (collectives, connections, timeout_s) on its own port,
    all starting together; returns each job's results or its error."""
    if len(jobs) == 1:
        colls, conns, timeout = jobs[0]
        return [run_job(fabric, colls, conns, timeout)]
    hosts = {h for colls, _, _ in jobs for h in colls[0].hosts}
    start_at = time.time() + START_DELAY_S + 0.1 * len(hosts) * len(jobs)
    out: list = [None] * len(jobs)

    def one(i: int) -> None:
        colls, conns, timeout = jobs[i]
        try:
            out[i] = run_job(fabric, colls, conns, timeout, AGENT_PORT + i, start_at)
        except TestbedError as err:
            out[i] = err

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def _agent_state(spec_path: Path, rank: int) -> str:
    try:
        return Path(f"{spec_path}.rank{rank}").read_text()
    except OSError:
        return "no state published"


def summarize(collectives: list[Collective], reports: list[dict], rate_mbps: float,
              mtu: int) -> list[CollectiveResult]:
    """Per-collective results from the agents' reports (pure)."""
    out = []
    for index, coll in enumerate(collectives):
        per_rank = [r["collectives"][index] for r in reports]
        start = min(c["start"] for c in per_rank)
        end = max(c["end"] for c in per_rank)
        duration = max(end - start, 1e-9)
        fcts = [f["done"] - c["start"] for c in per_rank for f in c["flows"]]
        sched = coll.schedule
        n = sched.communicator_size
        ideal = metrics.ideal_time_s(coll.op, n, sched.size_bytes, rate_mbps,
                                     goodput_fraction(mtu))
        out.append(CollectiveResult(
            coll.op, sched.algorithm, list(coll.hosts), sched.size_bytes, duration,
            metrics.algbw_gbps(sched.size_bytes, duration),
            metrics.busbw_gbps(coll.op, n, sched.size_bytes, duration), ideal,
            metrics.efficiency(coll.op, n, sched.size_bytes, duration, rate_mbps),
            {"p50": metrics.percentile(fcts, 50), "p99": metrics.percentile(fcts, 99),
             "max": max(fcts)} if fcts else {}, coll.label, gap_s=coll.gap_s,
            communicator_size=n))
    return out


def run_job(fabric, collectives: list[Collective], connections: int = 1,
            timeout_s: float = 600.0, port: int = AGENT_PORT,
            start_at: float | None = None) -> list[CollectiveResult]:
    """Run ``collectives`` (in order, on the same ranks) over ``fabric``.

    Jobs that run at once need their own ``port`` (their agents may share hosts) and can share a
    ``start_at`` wall-clock time.

    Raises:
        TestbedError: when an agent fails or the job outlives ``timeout_s`` (naming the ranks).
    """
    topo = fabric.topo
    hosts = collectives[0].hosts
    ips = {h.name: h.ip for h in topo.hosts}
    start_at = start_at or time.time() + START_DELAY_S + 0.1 * len(hosts)
    spec = job_spec(collectives, ips, connections, start_at, port)
    path = Path(fabric.run_dir) / f"job-{port}-{time.time_ns()}.json"
    path.write_text(json.dumps(spec))
    procs = {}
    try:
        for host in hosts:
            procs[host] = fabric.hosts.popen(host, [sys.executable, "-m", "traffic.agent",
                                                    str(path), host])
            fabric.registry.track_process(fabric.record, procs[host].pid,
                                          f"agent:{port}:{host}")
        deadline = time.monotonic() + timeout_s
        reports, failures = [], []
        for rank, (host, proc) in enumerate(procs.items()):
            try:
                out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                stuck = [f"rank {i} ({h}): {_agent_state(path, i)}"
                         for i, (h, p) in enumerate(procs.items()) if p.poll() is None]
                raise TestbedError(f"job timed out after {timeout_s:.0f} s; still running:\n  "
                                   + "\n  ".join(stuck)) from None
            if proc.returncode != 0:
                failures.append(f"rank {rank} ({host}): {err.strip()[-500:]}")
            else:
                reports.append(json.loads(out))
        if failures:
            raise TestbedError("traffic agents failed:\n  " + "\n  ".join(failures))
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    link = topo.host_link(hosts[0])
    results = summarize(collectives, sorted(reports, key=lambda r: r["rank"]), link.rate_mbps,
                        fabric.experiment.fabric.mtu)
    results[0].agent_cpu_s = sum(r.get("cpu_s", 0.0) for r in reports)
    return results
