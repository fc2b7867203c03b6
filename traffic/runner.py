"""Run collectives on a fabric: one agent per rank host, a shared start, results per collective.

The runner (this adapter) writes the job spec into the run directory, starts ``python -m traffic.agent`` in
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
from pathlib import Path

from testbed.errors import TestbedError
from traffic.results import AGENT_PORT, CollectiveResult, job_spec, summarize
from traffic.workload import Collective

START_DELAY_S = 1.0


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
