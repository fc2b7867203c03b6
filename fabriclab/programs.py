"""The user's program in a run (``workload.program``): run on its hosts through the fabric
(:mod:`traffic.agents.programs`), rank 0's output shown as it comes, and what it reported
read back as collectives with ``fabriclab predict``'s time beside each
(:func:`fabriclab.model.prediction.program_rows`)."""

from __future__ import annotations

from pathlib import Path

from fabriclab.model import document as d
from fabriclab.model import prediction
from fabriclab.model.experiment import Experiment
from fabriclab.model.traffic import measured_links
from testbed.contract import RunningFabric
from traffic.agents import programs
from traffic.workloads.program import Program, reported


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
    outcome = programs.run_program(
        program, {h.name: h.ip for h in fabric.topo.hosts},
        lambda host, argv, kwargs: fabric.spawn(host, argv, f"program:{host}", **kwargs),
        fabric.stop, out_dir, echo=lambda line: view.say(f"  {line}"))
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
