"""The ways of running an experiment file (``fabriclab run``): one run, its variants one
after the other, a sweep's cells in turn (consecutive cells that build the same fabric share
it) or at once over a cluster's machines (``--parallel``), and any of the single ones inside
the full-kernel guest (the ``vm`` backend).

Each takes a :class:`fabriclab.options.RunRequest` and a :class:`fabriclab.runner.RunView`, and
returns an :class:`Outcome`: the document ``--json`` prints and whether anything failed. A
failing variant or cell is recorded and the rest go on.
"""

from __future__ import annotations

import dataclasses
import json
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fabriclab.model import experiment as xp
from fabriclab.model import sweep as sw
from fabriclab.model.document import RunDocument
from fabriclab.model.results import variant_row
from fabriclab.options import RunRequest
from fabriclab.runner import RunView, run_experiment
from fabriclab.rundirs import is_complete, read_document, writing_to
from fabriclab.shared import SharedFabric
from testbed.errors import ConfigError, TestbedError
from testbed.linux.files import copy_tree, make_dirs, write_bytes_atomic, write_json_atomic
from testbed.model.spec import Backend
from testbed.runs.registry import Registry


#: one run shown: ``run(req, exp, out, view, variant, shared, then) -> results document``
#: (:func:`run_one`; the tests hand in their own)
RunOne = Callable[..., dict]


@dataclass(frozen=True)
class Outcome:
    """What a way of running ended with.

    Args:
        document: what ``--json`` prints (a results document, the variants' rows, the sweep).
        failed: a run, variant or cell failed (the others' results stand).
        exit_code: the guest's exit code, relayed as it is (the vm backend); None here.
    """

    document: object
    failed: bool = False
    exit_code: int | None = None


def resolve_backend(exp: xp.Experiment, requested: str | None, state_dir: Path) -> Backend:
    """``host`` or ``vm``: the flag, else the experiment's choice; ``auto`` picks the host when
    its kernel has everything the experiment needs (qdiscs, TCP congestion controls)."""
    choice = Backend(requested or exp.emulator.backend)
    if choice != Backend.AUTO:
        return choice
    from testbed.linux import capabilities  # probes the kernel (root): only for auto

    caps = capabilities.probe(state_dir)
    missing = [need for need in exp.requirements() if not caps.has(need)]
    return Backend.VM if missing else Backend.HOST


def run_file(req: RunRequest, view: RunView) -> Outcome:
    """``fabriclab run``: the experiment file's single run, variants or sweep, where its
    backend says; a report in the output directory at the end.

    Raises:
        ConfigError: a bad file, option or output directory (nothing ran).
        TestbedError: a single run failed (its document says what it measured).
    """
    exp = xp.load(req.file, cluster=req.cluster, seed=req.seed)
    if exp.workload is None:
        raise ConfigError("workload", "'fabriclab run' needs a workload section with collectives")
    if req.out is None:  # runs/<name>, as `make run` writes
        if exp.name.startswith("."):
            raise ConfigError("name", f"{exp.name!r} names no run directory: give --out")
        req = dataclasses.replace(req, out=Path("runs") / exp.name)
        view.say(f"results go to {req.out}")
    if req.parallel and not exp.cells:
        raise ConfigError("--parallel", "runs a sweep's cells at once, one per machine of a "
                                        "cluster; this experiment has no sweep section")
    with writing_to(req.out, req.resume, req.force) as aside:
        if aside is not None:
            view.say(f"--force: the earlier run in {req.out} moved to {aside}")
        return _run_into_out(req, exp, view)


def _run_into_out(req: RunRequest, exp: xp.Experiment, view: RunView) -> Outcome:
    """:func:`run_file`'s run, its output directory locked and checked."""
    vm = resolve_backend(exp, req.backend, req.state_dir) == Backend.VM
    if exp.cells:
        if vm:
            raise ConfigError("sweep", "sweeps run on this host (--backend host); the vm "
                                       "backend runs single experiments")
        outcome = run_sweep(req, exp, view)
    elif vm:
        seed = "" if req.seed is None else f" --seed {int(req.seed)}"
        return in_vm(req.file, req.state_dir, exp, "run --backend host /job/experiment.yaml "
                     f"--out \"$FABRICLAB_OUT/results\"{seed}", view, json_doc=req.json,
                     verbose=req.verbose, accel=req.vm_accel, results_to=req.out)
    elif exp.variants:
        outcome = run_variants(req, exp, view)
    else:
        outcome = run_single(req, exp, view)
    write_tables(req.out, view)
    write_report(req.out, view)
    return outcome


def run_single(req: RunRequest, exp: xp.Experiment, view: RunView) -> Outcome:
    """One run into ``req.out`` (with ``resume``, a complete one is kept)."""
    path = req.out / "results.json"
    if req.resume and is_complete(path, exp.raw):
        view.say(f"{path} is complete: nothing to resume")
        return Outcome(json.loads(path.read_text()))
    return Outcome(run_one(req, exp, req.out, view).to_json())


def run_variants(req: RunRequest, exp: xp.Experiment, view: RunView,
                 run: RunOne | None = None) -> Outcome:
    """Every variant into ``out/<variant>``, then ``out/variants.json`` side by side.
    Variants that build the same fabric share it."""
    out = req.out
    rows, failed = [], 0
    todo = [v for v in exp.variants
            if not (req.resume and is_complete(out / v.variant / "results.json", v.raw))]
    names = [v.variant for v in todo]
    shared = SharedFabric(req.state_dir)
    try:
        for variant in exp.variants:  # a failing one does not stop the rest
            view.section(f"variant {variant.variant}")
            if variant.variant not in names:
                view.say("complete: kept")
            else:
                i = names.index(variant.variant)
                then = todo[i + 1] if i + 1 < len(todo) else None
                try:
                    (run or run_one)(req, variant, out / variant.variant, view,
                                     variant.variant, shared, then)
                except (ConfigError, TestbedError) as err:
                    failed += 1
                    view.warn(f"variant {variant.variant} failed: {err}")
            rows.append(variant_row(read_document(out / variant.variant / "results.json"),
                                    variant.variant))
    finally:
        shared.close()
    doc = [r.to_json() for r in rows]
    write_json_atomic(out / "variants.json", doc)
    view.variants_done(exp.name, rows)
    view.say(f"results: {out}/<variant>/results.json; side by side: {out / 'variants.json'}")
    return Outcome(doc, failed=bool(failed))


class SweepRecords:
    """A sweep's ``DIR/sweep.json``, rewritten after every cell: each cell's values, status
    and row, and the summary over repetitions."""

    def __init__(self, exp: xp.Experiment, out: Path) -> None:
        self.exp, self.out = exp, out
        self.cells = list(exp.cells)
        self.records: dict[str, dict] = {}
        self.began = time.monotonic()
        self.lock = threading.Lock()

    def record(self, cell, doc: RunDocument | None, error: str | None) -> None:
        """A cell's outcome: its document (None: none written) and its error."""
        row = variant_row(doc).to_json() if doc else None
        self.records[cell.name] = {
            "cell": cell.plan.group, "name": cell.name, "variant": cell.plan.variant,
            "values": cell.plan.values, "repetition": cell.plan.repetition,
            "complete": bool(doc and doc.complete),
            "error": error or (doc.error if doc else None), "jobs": row["jobs"] if row else [],
            "row": row, "timings_s": (doc.timings_s if doc else None) or {},
            "fabric_reused": bool(doc and doc.fabric_reused)}

    def rows(self) -> list[dict]:
        return [self.records[c.name] for c in self.cells if c.name in self.records]

    def save(self) -> None:
        rows = self.rows()
        write_json_atomic(self.out / "sweep.json", {
            "experiment": self.exp.name, "source": self.exp.source, "cells": rows,
            "summary": sw.summarize(rows), "wall_s": round(time.monotonic() - self.began, 1),
            "timings_s": sw.total_timings(rows)})

    def failed(self, cells: list) -> bool:
        """Whether any of ``cells`` failed (or has no record)."""
        return any(c.name not in self.records or self.records[c.name]["error"] for c in cells)


def run_sweep(req: RunRequest, exp: xp.Experiment, view: RunView,
              run: RunOne | None = None) -> Outcome:
    """Every cell of the sweep, in order or (``parallel``) at once over the cluster's
    machines; a failed cell is recorded with its error and the sweep goes on; ``resume``
    keeps the cells already complete. Consecutive cells that build the same fabric share it
    (:class:`fabriclab.shared.SharedFabric`: a new controller each)."""
    out = req.out
    sweep = SweepRecords(exp, out)
    cells = sweep.cells
    finished = {c.name for c in cells
                if req.resume and is_complete(out / c.name / "results.json", c.experiment.raw)}
    todo = sw.pending(cells, finished)
    view.say(f"sweep: {len(cells)} cells ({len(finished)} complete already), "
             f"{len(todo)} to run into {out}")
    make_dirs(out)
    for cell in cells:
        if cell.name in finished:
            sweep.record(cell, read_document(out / cell.name / "results.json"), None)
    if req.parallel:
        machines = run_cells_on_machines(exp, todo, out, sweep, view)
        builds = f"{len(todo)} cell(s) on {machines} machine(s) at once"
    else:
        builds = _run_cells_in_turn(req, todo, len(finished), sweep, view, run or run_one)
    sweep.save()
    rows = [sweep.records[c.name] for c in cells]
    view.sweep_done(exp.name, sw.summarize(rows))
    phases = sw.total_timings(rows)
    view.say(f"wall time {time.monotonic() - sweep.began:.0f} s; over the cells: "
             + ", ".join(f"{k.replace('_', '-')} {v:.0f} s" for k, v in phases.items())
             + f"; {builds}")
    view.say(f"results: {out}/<cell>/results.json; all cells: {out / 'sweep.json'}")
    return Outcome(json.loads((out / "sweep.json").read_text()), failed=sweep.failed(todo))


def _run_cells_in_turn(req: RunRequest, todo: list, done_before: int, sweep: SweepRecords,
                       view: RunView, run: RunOne) -> str:
    """The cells one after the other on this machine; returns how many fabrics were built."""
    durations: list[float] = []
    shared = SharedFabric(req.state_dir)
    try:
        for n, cell in enumerate(todo, start=1):
            eta = ""
            if durations:
                left = sum(durations) / len(durations) * (len(todo) - n + 1)
                eta = f", about {time.strftime('%H:%M:%S', time.gmtime(left))} left"
            view.section(f"cell {done_before + n}/{len(sweep.cells)}: {cell.name}{eta}")
            start = time.monotonic()
            doc, error = None, None
            then = todo[n].experiment if n < len(todo) else None
            try:
                doc = run(req, cell.experiment, req.out / cell.name, view, cell.plan.variant,
                          shared, then)
            except (ConfigError, TestbedError) as err:
                error = str(err)
                view.warn(f"cell {cell.name} failed: {err}")
                doc = read_document(req.out / cell.name / "results.json")
            durations.append(time.monotonic() - start)
            sweep.record(cell, doc, error)
            sweep.save()
    finally:
        shared.close()
    return f"{shared.builds} fabric build(s) for {len(todo)} cell(s)"


def run_cells_on_machines(exp: xp.Experiment, todo: list, out: Path, sweep: SweepRecords,
                          view: RunView) -> int:
    """``--parallel``: the cells at once, one per machine of the cluster, each built whole on
    its machine by that machine's actor (:meth:`testbed.cluster.agent.MachineAgent.run_cell`);
    its run directory comes back into ``out/<cell>``. A failed cell is recorded and the rest
    go on; a machine that dies fails its cell, and the others take the cells left. Returns
    the number of machines."""
    from fabriclab.cellagent import CellAgent
    from testbed.cluster.machines import Cluster  # Ray: only for a cluster

    if exp.cluster is None:
        raise ConfigError("--parallel", "runs a sweep's cells on the machines of a cluster: "
                                        "give --cluster ADDRESS or the cluster section")
    cluster = Cluster(exp.cluster.address, agent=CellAgent)
    for warning in cluster.warnings:
        view.warn(warning)
    cells: queue.Queue = queue.Queue()
    for cell in todo:
        cells.put(cell)
    done: list[str] = []

    def machine_loop(name: str) -> None:
        machine = cluster.machine(name)
        while True:
            try:
                cell = cells.get_nowait()
            except queue.Empty:
                return
            view.say(f"cell {cell.name}: on {name}")
            doc = {k: v for k, v in cell.experiment.raw.items() if k != "cluster"}
            error, lost = None, False
            try:
                got = machine.run_cell(doc, cell.experiment.source, cell.name)
                error = got["error"]
                for rel, data in got["files"].items():
                    path = out / cell.name / rel
                    make_dirs(path.parent)
                    write_bytes_atomic(path, data)
            except Exception as err:  # noqa: BLE001 - the machine died: its cell failed
                error, lost = f"machine {name}: {type(err).__name__}: {err}"[:2000], True
            doc = read_document(out / cell.name / "results.json")
            if doc is not None:  # the document says where it ran
                doc.machine = name
                write_json_atomic(out / cell.name / "results.json", doc.to_json())
            with sweep.lock:
                if error:
                    view.warn(f"cell {cell.name} failed on {name}: {error}")
                sweep.record(cell, doc, error)
                done.append(cell.name)
                sweep.save()
                view.say(f"{len(done)}/{len(todo)} cells done")
            if lost:
                return

    try:
        threads = [threading.Thread(target=machine_loop, args=(n,), name=f"cells-{n}")
                   for n in sorted(cluster.machines)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        cluster.close()
    for cell in [c for c in todo if c.name not in done]:  # every machine died
        sweep.record(cell, None, "no machine of the cluster was left to run it")
    sweep.save()
    return len(threads)


def run_one(req: RunRequest, exp: xp.Experiment, out: Path, view: RunView,
            variant: str | None = None, shared: SharedFabric | None = None,
            then: xp.Experiment | None = None) -> RunDocument:
    """One run of ``exp`` into ``out`` (:func:`fabriclab.runner.run_experiment`), shown."""
    try:
        doc = run_experiment(exp, out, req.state_dir, view,
                             dataclasses.replace(req.telemetry, variant=variant), shared, then)
    finally:
        view.closed()
    view.run_done(doc, out)
    return doc


def write_tables(out: Path, view: RunView) -> None:
    """The tidy tables across the runs in ``out`` (:func:`fabriclab.frames.write_tables`);
    a failure says so and leaves the runs' own files as they are."""
    from fabriclab.frames import write_tables as write

    try:
        written = write(out)
        if written:
            view.say(f"tables: {', '.join(written)}")
    except Exception as err:  # noqa: BLE001 - each run's files stand without them
        view.warn(f"tables not written: {type(err).__name__}: {err}")


def write_report(out: Path, view: RunView) -> None:
    """Write ``out/report.html``; a failure to draw says so and leaves the results as they
    are."""
    from fabriclab.report import write_report as write  # matplotlib: only once results exist

    try:
        view.say(f"report: {write(out)}")
    except Exception as err:  # noqa: BLE001 - the results stand without their report
        view.warn(f"report not written: {type(err).__name__}: {err} (the results are in "
                  f"{out}; fabriclab report {out} tries again)")


def in_vm(file: Path, state_dir: Path, exp: xp.Experiment, cli_args: str, view: RunView,
          json_doc: bool = False, verbose: bool = False, accel: str = "tcg",
          results_to: Path | None = None) -> Outcome:
    """Run ``fabriclab CLI_ARGS`` inside the full-kernel guest and relay its exit code; what it
    wrote under ``$FABRICLAB_OUT/results`` is copied to ``results_to``. With ``json_doc`` the
    guest's JSON document (written to ``$FABRICLAB_OUT/cli.json``) is the outcome's, with the
    guest run's figures under ``vm``."""
    from testbed.vm import guest

    files = {"experiment.yaml": Path(file)}
    job = ""
    if any(e.fabric.needs_marker for e in (exp, *exp.variants)):
        # the guest has no compiler: the marker is built here and carried in with the job
        from testbed.fabric.ecn import OBJECT
        from testbed.linux import bpf

        obj = bpf.build(OBJECT, state_dir)
        files[f"bpf/{obj.parent.name}/{obj.name}"] = obj
        job += "mkdir -p /run/fabriclab && cp -r /job/bpf /run/fabriclab/\n"
    job += f"python3 -m fabriclab.cli {cli_args}"
    job += ' --json > "$FABRICLAB_OUT/cli.json"\n' if json_doc else "\n"
    view.say("preparing the guest image ...")
    image = guest.ensure_image(log=view.say)
    work = state_dir / "vm" / time.strftime("%Y%m%d-%H%M%S")
    view.say(f"booting the full-kernel guest ({image.directory.name}); this machine emulates "
             "its CPU, so expect minutes")
    result = guest.run(image, job, files, work, Registry(state_dir), accel=accel,
                       on_console=(lambda line: view.say(f"guest| {line}")) if verbose
                       else None)
    if not verbose:
        view.say(result.output.rstrip())
    if results_to is not None and (result.out_dir / "results").is_dir():
        copy_tree(result.out_dir / "results", results_to)
        view.say(f"results copied to {results_to}")
    view.say(f"guest run: exit {result.returncode} after {result.duration_s:.0f} s; "
             f"console log {result.console}")
    doc = None
    if json_doc:
        try:
            doc = json.loads((result.out_dir / "cli.json").read_text())
        except (OSError, ValueError) as err:
            raise TestbedError(f"the guest wrote no JSON document ({err})",
                               stderr=result.output[-2000:]) from None
        if isinstance(doc, dict):
            doc["backend"] = "vm"
            doc["vm"] = {"exit": result.returncode, "duration_s": result.duration_s,
                         "console": str(result.console)}
    return Outcome(doc, failed=result.returncode != 0, exit_code=result.returncode)

