"""The user's program in a run (``workload.program``): run on its hosts through the fabric
(:mod:`traffic.agents.programs`), rank 0's output shown as it comes, and what it reported
read back as collectives with ``fabriclab predict``'s time beside each
(:func:`fabriclab.model.prediction.program_rows`)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from fabriclab.model import document as d
from fabriclab.model import prediction
from fabriclab.model.experiment import Experiment
from fabriclab.model.traffic import measured_links
from testbed.contract import RunningFabric
from traffic.agents import programs
from traffic.workloads.program import Program, reported


def launcher_env(out_dir: Path, host_pids: dict[str, int]) -> dict[str, str]:
    """What every rank's environment gets for launchers that reach other nodes through a
    remote shell (Open MPI's ``mpirun``, MPICH's Hydra): ``fabriclab-rsh``
    (:mod:`fabriclab.cli.rsh`), which enters a host by its name, and the hosts' PIDs it
    reads (``out_dir/ranks/hosts.json``)."""
    ranks = Path(out_dir) / "ranks"
    ranks.mkdir(parents=True, exist_ok=True)
    (ranks / "hosts.json").write_text(json.dumps(host_pids, indent=1, sort_keys=True))
    agent = Path(sys.executable).parent / "fabriclab-rsh"
    if not agent.exists():  # not installed as a command: the module through this Python
        agent = Path(shutil.which("fabriclab-rsh") or agent)
    # Open MPI's ranks poll for progress; on an emulation's few cores they yield, so that the
    # fabric's own work gets the CPU (a program's env can say otherwise)
    return {"FABRICLAB_HOSTS_FILE": str(ranks / "hosts.json"),
            "OMPI_MCA_plm_rsh_agent": str(agent), "OMPI_MCA_mpi_yield_when_idle": "1",
            "HYDRA_LAUNCHER": "ssh", "HYDRA_LAUNCHER_EXEC": str(agent)}


def program_run(program: Program, outcome: programs.ProgramOutcome) -> d.ProgramRun:
    """What ``results.json`` (or ``launch.json``) says of a program that ran."""
    return d.ProgramRun(
        list(program.argv), program.world_size, program.per_host, list(program.hosts),
        round(outcome.started_unix_s, 6), round(outcome.time_s, 6),
        [d.RankRun(r.rank, r.host, r.exit_code, r.end_unix_s and round(r.end_unix_s, 6),
                   round(r.end_unix_s - outcome.started_unix_s, 6) if r.end_unix_s else None,
                   r.ended) for r in outcome.ranks], outcome.error)


def run_on(fabric: RunningFabric, exp: Experiment, program: Program, out_dir: Path,
           view) -> tuple[d.ProgramRun, list[d.CollectiveRow]]:
    """Run ``program`` on ``fabric``'s hosts, its ranks' output into ``out_dir/ranks``.

    Returns:
        The program's run (``error`` set when a rank failed or it timed out), and the rows of
        the collectives rank 0 reported (``#fabriclab`` lines).
    """
    view.say(f"program: {' '.join(program.argv)} as {program.world_size} rank(s) on "
             f"{len(program.hosts)} host(s); rank 0 says:")
    before = fabric.congestion()
    pids = {p.kind.which: p.pid for p in fabric.record.processes if p.kind.is_host}
    outcome = programs.run_program(
        program, {h.name: h.ip for h in fabric.topo.hosts},
        lambda host, argv, kwargs: fabric.spawn(host, argv, f"program:{host}", **kwargs),
        fabric.stop, out_dir, echo=lambda line: view.say(f"  {line}"),
        env=launcher_env(out_dir, pids))
    run = program_run(program, outcome)
    run.links = measured_links(fabric.topo, before, fabric.congestion())
    try:
        said = (Path(out_dir) / "ranks" / "0.out").read_text(errors="replace")
    except OSError:
        said = ""
    reports, unread, iterations = reported(said)
    run.iterations = iterations or None
    if unread:
        run.unread = unread
        for line in unread:
            view.warn(f"program: {line}")
    rows = prediction.program_rows(exp, program, reports, len(exp.workload.jobs)) \
        if reports else []
    return run, rows
