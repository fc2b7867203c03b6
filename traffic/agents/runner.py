"""Run collectives on a fabric: one agent per rank host, a shared start, results per collective.

The runner (this adapter) writes the job's :class:`traffic.protocol.AgentSpec` into the run
directory, starts ``python -m traffic.agents.agent`` in every participating host's namespace as a
fabric service (:meth:`testbed.fabric.fabric.Fabric.spawn`: tracked by PID, ended by PID), waits with a
hard timeout, and turns the agents' reports into per-collective results with NCCL-tests'
metrics. A job that times out names the ranks that had not finished and what each waits for.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from testbed.contract import TrafficFabric
from testbed.errors import TestbedError
from traffic.measure.flows import IdealFct
from traffic.measure.results import AGENT_PORT, CollectiveResult, job_spec, summarize
from traffic.measure.transport import goodput_fraction
from traffic.predict.ideal import FluidModel
from traffic.protocol import AgentReport, Connection
from traffic.transports.packet import ahead_of_the_wire_bytes, mss_for, wire_bytes
from traffic.workloads.workload import DEFAULT_CONNECTIONS, DEFAULT_TIMEOUT_S, Collective, Job

START_DELAY_S = 1.0


@dataclass(frozen=True)
class JobOutcome:
    """What one job of a batch gave: its results, or the error that stopped it."""

    job: Job
    results: tuple[CollectiveResult, ...] = ()
    error: TestbedError | None = None
    connections: tuple[Connection, ...] = ()  # the TCP connections its ranks sent on


#: While a job runs, whether its ranks still reach each other is checked this often; cut off
#: for longer than the grace (a link that flaps back is no reason to give up), it fails.
CUT_OFF_CHECK_S = 1.0
POLL_SLICE_S = 0.02  # each agent's turn at being waited for (all are, in turn)
STACKS_WAIT_S = 0.5  # a stuck agent's time to dump its stacks
STACK_FRAMES = 4  # the innermost frames of its main thread in the report
CUT_OFF_GRACE_S = 3.0


class CutOffWatch:
    """Why a running job cannot finish, if it cannot: its hosts cut off from each other for
    longer than the grace, or a fabric service (the PFC agent: queues it paused stay paused)
    that died since the job began."""

    def __init__(self, fabric: TrafficFabric, hosts: list[str],
                 grace_s: float = CUT_OFF_GRACE_S) -> None:
        self.fabric, self.hosts, self.grace_s = fabric, hosts, grace_s
        self.since: float | None = None
        self.services_failed = len(getattr(fabric, "service_errors", []))

    def check(self) -> str | None:
        """The reason, once the hosts have stayed cut off for the grace or at once for a
        failed service; else None."""
        failed = getattr(self.fabric, "service_errors", [])[self.services_failed:]
        if failed:
            return f"a fabric service failed: {failed[0]}"
        reason = self.fabric.cut_off(self.hosts)
        now = time.monotonic()
        if reason is None:
            self.since = None
            return None
        if self.since is None:
            self.since = now
        return f"ranks cut off for {self.grace_s:.0f} s: {reason}" \
            if now - self.since >= self.grace_s else None


def batch_start_at(jobs: list[Job]) -> float:
    """When a batch of jobs started now starts its traffic (wall clock): time for its agents
    to start and connect, :data:`START_DELAY_S` and a tenth of a second per rank of each
    job."""
    hosts = {h for job in jobs for h in job.collectives[0].hosts}
    return time.time() + START_DELAY_S + 0.1 * len(hosts) * len(jobs)


def run_batch(fabric: TrafficFabric, jobs: list[Job],
              start_at: float | None = None) -> list[JobOutcome]:
    """Run several jobs at once, each on its own agent port, all starting together at
    ``start_at`` (wall clock; None: :func:`batch_start_at`), each after its offset.

    Returns:
        One outcome per job, in order: a job that failed (an agent error, a timeout) carries
        its error and the others still run to their end.

    Raises:
        Exception: anything other than a TestbedError (a bug) is raised again here, after
            every job's thread has ended.
    """
    start_at = batch_start_at(jobs) if start_at is None else start_at
    outcomes: list[JobOutcome | None] = [None] * len(jobs)
    crashes: list[BaseException] = []

    def one(i: int) -> None:
        job = jobs[i]
        try:
            seen: list[Connection] = []
            results = run_job(fabric, list(job.collectives), job.connections, job.timeout_s,
                              AGENT_PORT + i, start_at + job.offset_s, job.congestion_control,
                              job.dscp,
                              job.transport, job.spray, job.dcqcn,
                              job.transport_options.to_dict(), seen, f"{job.seed}/{job.index}")
            outcomes[i] = JobOutcome(job, tuple(results), connections=tuple(seen))
        except TestbedError as err:
            outcomes[i] = JobOutcome(job, error=err)
        except BaseException as err:  # noqa: BLE001 - re-raised below, in the caller's thread
            crashes.append(err)
            outcomes[i] = JobOutcome(job, error=TestbedError(f"crashed: {err!r}"))

    if len(jobs) == 1:
        one(0)
    else:
        threads = [threading.Thread(target=one, args=(i,), name=f"job{i}")
                   for i in range(len(jobs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if crashes:
        raise crashes[0]
    return [o for o in outcomes if o is not None]


def _agent_state(fabric: TrafficFabric, spec_name: str, rank: int, host: str) -> str:
    try:
        return fabric.read_file(f"{spec_name}.rank{rank}", host)
    except OSError:
        return "no state published"


def _stacks(fabric: TrafficFabric, spec_name: str,
            pending: dict[str, tuple[int, subprocess.Popen]]) -> dict[str, str]:
    """Where each stuck agent's main thread is: every thread's stack dumped on SIGUSR1 (the
    agent's faulthandler), the main thread's innermost frames kept (empty where none came)."""
    for _rank, proc in pending.values():
        try:
            proc.send_signal(signal.SIGUSR1)
        except OSError:
            pass
    time.sleep(STACKS_WAIT_S)
    out = {}
    for host, (rank, _proc) in pending.items():
        try:
            text = fabric.read_file(f"{spec_name}.rank{rank}.stacks", host)
        except OSError:
            continue
        blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", text)
        main = next((b for b in reversed(blocks) if re.search(r"agent\.py\", line \d+ in main",
                                                               b)), "")
        frames = [re.sub(r'File ".*/(traffic/[^"]+)", line (\d+) in (\w+)', r"\3 (\1:\2)",
                         line.strip()) for line in main.splitlines()
                  if line.strip().startswith("File")]
        if frames:
            out[host] = "; main thread at: " + " <- ".join(frames[:STACK_FRAMES])
    return out


def _wait_agents(fabric: TrafficFabric, procs: dict[str, subprocess.Popen], name: str, port: int,
                 timeout_s: float) -> list[AgentReport]:
    """Every agent's report, all watched at once: the first to fail, a cut-off that lasts, or
    the deadline ends the job with an error naming the ranks (the caller stops the rest)."""
    deadline = time.monotonic() + timeout_s
    watch = CutOffWatch(fabric, list(procs))
    rank_of = {host: rank for rank, host in enumerate(procs)}
    reports: list[AgentReport] = []
    pending = dict(procs)
    next_check = time.monotonic() + CUT_OFF_CHECK_S
    while pending:  # every agent watched at once: the first to fail ends the job
        # a round over every agent within about half a second, however many there are
        slice_s = max(0.002, min(POLL_SLICE_S, 0.5 / len(pending)))
        for host, proc in list(pending.items()):
            try:
                out, err = proc.communicate(timeout=slice_s)
            except subprocess.TimeoutExpired:
                continue
            del pending[host]
            rank = rank_of[host]
            if err:  # the agent's own log: the run directory keeps it
                logs = Path(fabric.run_dir) / "logs"
                logs.mkdir(exist_ok=True)
                with open(logs / f"agent-{port}-{host}.log", "a", encoding="utf-8") as fh:
                    fh.write(err)
            if proc.returncode != 0:
                raise TestbedError(f"traffic agent rank {rank} ({host}) exited with "
                                   f"{proc.returncode}: {err.strip()[-500:]}")
            try:
                reports.append(AgentReport.from_json(out))
            except (ValueError, KeyError, TypeError) as exc:
                raise TestbedError(f"traffic agent rank {rank} ({host}): unreadable report "
                                   f"({exc!r}): {out[-200:]!r}") from None
        now = time.monotonic()
        if not pending or now < next_check:
            continue
        next_check = now + CUT_OFF_CHECK_S
        expired = now >= deadline
        reason = None if expired else watch.check()
        if expired or reason is not None:
            stacks = _stacks(fabric, name, {h: (rank_of[h], p) for h, p in pending.items()})
            stuck = [f"rank {rank_of[h]} ({h}): {_agent_state(fabric, name, rank_of[h], h)}"
                     + stacks.get(h, "") for h in pending]
            head = (f"the job cannot finish, {reason}" if reason else
                    f"job timed out after {timeout_s:.0f} s")
            raise TestbedError(f"{head}; still running:\n  " + "\n  ".join(stuck))
    return reports


def run_job(fabric: TrafficFabric, collectives: list[Collective], connections: int = DEFAULT_CONNECTIONS,
            timeout_s: float = DEFAULT_TIMEOUT_S, port: int = AGENT_PORT,
            start_at: float | None = None, congestion_control: str | None = None,
            dscp: int = 0, transport: str = "tcp",
            spray: bool | None = None, dcqcn: str = "paper",
            options: dict | None = None,
            connections_seen: list[Connection] | None = None,
            seed: str | None = None) -> list[CollectiveResult]:
    """Run ``collectives`` (in order, on the same ranks) over ``fabric``.

    Jobs that run at once need their own ``port`` (their agents may share hosts) and can share a
    ``start_at`` wall-clock time. ``connections_seen`` gets the TCP connections the ranks sent
    on (their 5-tuples: the paths an ECMP fabric gave them follow from those); ``seed`` draws
    their source ports (the run seed and the job: :class:`traffic.agents.connect.SourcePorts`;
    None: the kernel's choice).

    Raises:
        TestbedError: when an agent fails or the job outlives ``timeout_s`` (naming the ranks).
    """
    topo = fabric.topo
    hosts = collectives[0].hosts
    ips = {h.name: h.ip for h in topo.hosts}
    start_at = start_at or time.time() + START_DELAY_S + 0.1 * len(hosts)
    scale = None
    if transport != "tcp":
        link = topo.host_link(hosts[0])
        scale = {"rate_bps": link.rate_mbps * 1e6, "base_rtt_s": fabric.spec.base_rtt_s,
                 "mss": mss_for(fabric.spec.fabric.mtu)}
        if fabric.spec.fabric.delay_line == "agents":  # the links' delay, held by the agents
            delays, rtts = fabric.spec.path_timing_s(list(hosts))
            scale["delays_s"] = [[round(d, 9) for d in row] for row in delays]
            scale["rtts_s"] = [[round(d, 9) for d in row] for row in rtts]
    planes = {h: tuple(topo.nodes[n].ip for n in topo.nics(h)[1:]) for h in hosts}
    servers = {h: topo.server_of(h).index for h in hosts if topo.server_of(h)}
    spec = job_spec(collectives, ips, connections, start_at, port, congestion_control, dscp,
                    transport, spray, scale, dcqcn, planes, servers, options, seed)
    name = f"job-{port}-{time.time_ns()}.json"  # in the run directory (each machine's)
    fabric.write_file(name, spec.to_json())
    procs: dict[str, subprocess.Popen] = {}
    try:
        for host in hosts:
            procs[host] = fabric.spawn(host, [sys.executable, "-m", "traffic.agents.agent", name, host],
                                       f"agent:{port}:{host}", cwd=str(fabric.run_dir))
        reports = _wait_agents(fabric, procs, name, port, timeout_s)
    finally:
        for proc in procs.values():
            fabric.stop(proc)
    if connections_seen is not None:
        connections_seen.extend(c for r in sorted(reports, key=lambda r: r.rank)
                                for c in r.connections)
    # a rank's scale-out rate: its NIC's, times the planes its ports are on
    rate = sum(topo.host_link(nic).rate_mbps for nic in topo.nics(hosts[0]))
    mtu = fabric.spec.fabric.mtu
    goodput = (goodput_fraction(mtu) if transport == "tcp"
               else mss_for(mtu) / wire_bytes(mss_for(mtu)))
    ideal = IdealFct(topo, {tier: fabric.spec.fabric.link(tier).delay_us
                            for tier in ("host", "fabric")}, mtu, goodput,
                     None if transport == "tcp" else ahead_of_the_wire_bytes(rate, mss_for(mtu)))
    return summarize(collectives, sorted(reports, key=lambda r: r.rank), rate,
                     mtu, FluidModel(topo) if topo.servers else None, ideal)
