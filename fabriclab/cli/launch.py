"""``fabriclab launch``: a program on hosts of a fabric kept up (``fabriclab up -d``), as a
distributed job: every rank in its host (network, mount and UTS namespaces, through
``nsenter``), started at one moment with torchrun's environment, rank 0's output shown, every
rank's in ``DIR/ranks/`` (:mod:`traffic.agents.programs`)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from rich.console import Console

from fabriclab.cli import tables
from fabriclab.cli.background import host_pid
from fabriclab.cli.output import EXIT_OK, emit
from fabriclab.cli.requests import LaunchRequest
from fabriclab.model.document import RunDocument
from fabriclab.programs import launcher_env, program_run
from testbed.errors import ConfigError, TestbedError
from testbed.runs.registry import Registry, TrackedProcess, proc_start_time, stop_processes
from traffic.agents import programs
from traffic.workloads.program import parse_program


def launch(req: LaunchRequest, ui: Console) -> int:
    """Run ``req.command`` as a distributed job on the running fabric's hosts; exit 0 when
    every rank exited 0 (3 otherwise, naming the first that did not)."""
    if not req.command:
        raise ConfigError("launch", "give the program after --, e.g. fabriclab launch "
                                    "--ranks 4 -- python3 bench.py")
    registry = Registry(req.state_dir)
    record = registry.running(req.run)
    topo = record.topology()
    raw: dict = {"argv": list(req.command), "per_host": req.per_host,
                 "timeout_s": req.timeout_s, "env": dict(req.env)}
    if req.hosts:
        raw["hosts"] = list(req.hosts)
    elif req.ranks is not None:
        raw["ranks"] = req.ranks
    program = parse_program(topo, raw, os.getcwd(), "launch")
    out = req.out or Path("runs") / f"launch-{record.run_id}-{time.strftime('%Y%m%d-%H%M%S')}"
    launched: dict[int, TrackedProcess] = {}

    def spawn(host: str, argv: list[str], kwargs: dict) -> subprocess.Popen:
        proc = subprocess.Popen(["nsenter", "-t", str(host_pid(record, host)), "-n", "-m",
                                 "-u", "--", *argv], start_new_session=True, **kwargs)
        tracked = TrackedProcess(proc.pid, proc_start_time(proc.pid) or 0.0, f"launch:{host}")
        launched[proc.pid] = tracked
        registry.track_process(record, proc.pid, tracked.role)  # `down` ends it too
        return proc

    def stop(proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            stop_processes([launched[proc.pid]], 5.0)
        proc.wait()

    say = ui.print if not req.json else (lambda *_a, **_k: None)
    say(f"launch: {' '.join(program.argv)} as {program.world_size} rank(s) on "
        f"{len(program.hosts)} host(s) of run {record.run_id}; rank 0 says:",
        markup=False, highlight=False)
    pids = {p.kind.which: p.pid for p in record.processes if p.kind.is_host}
    try:
        outcome = programs.run_program(
            program, {h.name: h.ip for h in topo.hosts}, spawn, stop, out,
            echo=None if req.json else lambda line: ui.print(f"  {line}", markup=False,
                                                             highlight=False),
            env=launcher_env(out, pids))
    finally:
        for pid in launched:
            registry.untrack_process(record, pid)
    run = program_run(program, outcome)
    (out / "launch.json").write_text(json.dumps({"run": record.run_id, **run.to_json()},
                                                indent=1))
    if req.json:
        emit({"run": record.run_id, "out": str(out), **run.to_json()})
    else:
        ui.print(tables.program(RunDocument(f"run {record.run_id}", program=run),
                                out=str(out)))
    if outcome.error:
        raise TestbedError(f"launch: {outcome.error}")
    return EXIT_OK

