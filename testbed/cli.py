"""The ``fabriclab`` command: validate, up (with --check), clean, schema."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from testbed import cleanup, config
from testbed.errors import ConfigError, TestbedError
from testbed.fidelity import assess
from testbed.registry import DEFAULT_STATE_DIR, Registry

console = Console(stderr=False, highlight=False, soft_wrap=True)  # logs stay grep-able
if not console.is_terminal:
    console.width = max(console.width, 120)  # tables in logs and CI output stay whole


class Terminated(Exception):
    """SIGTERM arrived: unwind through every ``finally`` so the fabric is torn down."""


def _on_sigterm(signum, _frame) -> None:
    raise Terminated(f"signal {signum}")


def _link_text(link: config.LinkSpec) -> str:
    text = f"{link.rate_mbps:g} Mbit/s"
    if link.delay_us:
        text += f" {link.delay_us:g} us"
    if link.loss_percent:
        text += f" {link.loss_percent:g} % loss"
    return text


def _summary_table(exp: config.Experiment, fabric) -> Table:
    topo = exp.topology
    counts = topo.counts()
    table = Table(title=f"fabric {exp.name} ({topo.kind})", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    table.add_row("switches", ", ".join(f"{counts[r]} {r}" for r in
                                        ("core", "agg", "edge", "spine", "leaf") if r in counts))
    table.add_row("hosts", str(counts["hosts"]))
    table.add_row("links", f"{counts['links']} (host {_link_text(exp.fabric.host_link)}, "
                           f"fabric {_link_text(exp.fabric.fabric_link)})")
    table.add_row("oversubscription", f"{topo.oversubscription():g}:1")
    queue = (f"{exp.fabric.queue_packets} packets" if exp.fabric.queue_packets
             else f"{exp.fabric.queue_kb} KiB")
    table.add_row("queue / MTU", f"{queue} / {exp.fabric.mtu}")
    table.add_row("datapath", f"Open vSwitch {fabric.caps.datapath_type}"
                              + (f", {len(fabric.instances)} private vswitchd"
                                 if fabric.instances else ""))
    table.add_row("controller", f"os-ken on 127.0.0.1:{fabric.of_port}, "
                                f"{exp.controller.routing}")
    if fabric.fidelity is not None:
        v = fabric.fidelity
        table.add_row("fidelity", f"full load {v.load:.0%} of this machine's budget "
                                  f"({'fits' if v.fits else 'OVER the headroom'}; "
                                  f"<= {v.max_rate_mbps:.1f} Mbit/s per host fits)")
    table.add_row("up in", f"{fabric.timings['up_total']:.2f} s")
    hosts = topo.hosts
    table.add_row("first hosts", ", ".join(f"{h.name}={h.ip}" for h in hosts[:3]) + ", ...")
    return table


def cmd_validate(args) -> int:
    for path in args.files:
        exp = config.load(path)
        counts = exp.topology.counts()
        console.print(f"{path}: ok ({exp.topology.kind}, {counts['switches']} switches, "
                      f"{counts['hosts']} hosts, {counts['links']} links)")
        verdict = assess(exp.topology, exp.fabric.mtu)
        console.print(f"  on the userspace datapath: {verdict.explain()}"
                      + ("" if verdict.fits else " -- over the headroom"))
    return 0


def resolve_backend(exp: config.Experiment, requested: str | None, state_dir: Path) -> str:
    """``host`` or ``vm``: the flag, else the experiment's choice; ``auto`` picks the host when
    its kernel has every qdisc the experiment needs."""
    choice = requested or exp.emulator.backend
    if choice != "auto":
        return choice
    from testbed import capabilities  # probes the kernel (root)

    caps = capabilities.probe(state_dir)
    missing = [kind for _, kind in exp.required_qdiscs() if not caps.has_qdisc(kind)]
    return "vm" if missing else "host"


def cmd_up(args) -> int:
    from testbed.fabric import Fabric  # system adapters only when a fabric is built

    exp = config.load(args.file)
    if resolve_backend(exp, args.backend, args.state_dir) == "vm":
        return _up_in_vm(args)
    start = time.monotonic()
    fabric = Fabric(exp, state_dir=args.state_dir,
                    log=(lambda m: console.print(f"[dim]{m}[/dim]")) if args.verbose else
                    (lambda _m: None))
    with console.status("building the fabric ..."):
        fabric.__enter__()
    try:
        console.print(_summary_table(exp, fabric))
        for warning in fabric.warnings:
            console.print(f"[yellow]warning:[/yellow] {warning}")
        if args.check:
            result = fabric.reachability(count=args.count)
            console.print(result.summary())
            reach_s = time.monotonic() - start
            console.print(f"all pairs reachable {reach_s:.2f} s after start"
                          if result.complete else
                          "unreachable: " + ", ".join(f"{s}->{d}" for s, d in result.failed[:20]))
            return 0 if result.complete else 1
        console.print("fabric is up; Ctrl-C (or SIGTERM) tears it down")
        while True:
            time.sleep(3600)
    finally:
        with console.status("tearing down ..."):
            t0 = time.monotonic()
            fabric.down()
        console.print(f"torn down in {time.monotonic() - t0:.2f} s")


def _up_in_vm(args) -> int:
    """Run ``up --check`` inside the full-kernel guest and relay its output and exit code."""
    if not args.check:
        raise ConfigError("emulator.backend", "the vm backend runs a job and powers off: use "
                          "'fabriclab up --check' (an interactive guest is the lab VM's job)")
    return _in_vm(args, f"up --check --backend host --count {int(args.count)} "
                        f"{'-v ' if args.verbose else ''}/job/experiment.yaml")


def _in_vm(args, cli_args: str, results_to: Path | None = None) -> int:
    """Run ``fabriclab CLI_ARGS`` inside the full-kernel guest, relay its output and exit code,
    and copy what it wrote under ``$FABRICLAB_OUT/results`` to ``results_to``."""
    import shutil

    from testbed import vm

    job = f"python3 -m testbed.cli {cli_args}\n"
    with console.status("preparing the guest image ..."):
        image = vm.ensure_image(log=console.print)
    work = args.state_dir / "vm" / time.strftime("%Y%m%d-%H%M%S")
    console.print(f"booting the full-kernel guest ({image.directory.name}); this machine "
                  "emulates its CPU, so expect minutes")
    result = vm.run(image, job, {"experiment.yaml": Path(args.file)}, work,
                    Registry(args.state_dir), accel=getattr(args, "vm_accel", "tcg"),
                    on_console=(lambda line: console.print(f"[dim]guest| {line}[/dim]"))
                    if getattr(args, "verbose", False) else None)
    if not getattr(args, "verbose", False):
        console.print(result.output.rstrip())
    if results_to is not None and (result.out_dir / "results").is_dir():
        shutil.copytree(result.out_dir / "results", results_to, dirs_exist_ok=True)
        console.print(f"results copied to {results_to}")
    console.print(f"guest run: exit {result.returncode} after {result.duration_s:.0f} s; "
                  f"console log {result.console}")
    return result.returncode


def _write_results(path: Path, doc: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)


def cmd_run(args) -> int:
    """Build the fabric, run the workload, write DIR/results.json, tear down."""
    from dataclasses import asdict

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from testbed.fabric import Fabric
    from traffic.runner import run_batch
    from traffic.workload import batches

    exp = config.load(args.file)
    jobs = exp.jobs()
    if not jobs:
        raise ConfigError("workload", "'fabriclab run' needs a workload section with collectives")
    if resolve_backend(exp, args.backend, args.state_dir) == "vm":
        return _in_vm(args, "run --backend host /job/experiment.yaml "
                            "--out \"$FABRICLAB_OUT/results\"", Path(args.out))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.json"
    doc = {"experiment": exp.name, "source": str(args.file), "complete": False,
           "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "fabric": {"topology": exp.topology.kind, **exp.fabric.shape,
                      "host_rate_mbps": exp.fabric.host_link.rate_mbps,
                      "fabric_rate_mbps": exp.fabric.fabric_link.rate_mbps,
                      "mtu": exp.fabric.mtu, "routing": exp.controller.routing},
           "collectives": []}
    _write_results(results, doc)
    total = sum(len(j.collectives) for j in jobs)
    with console.status("building the fabric ..."):
        fabric = Fabric(exp, state_dir=args.state_dir)
        fabric.__enter__()
    try:
        for warning in fabric.warnings:
            console.print(f"[yellow]warning:[/yellow] {warning}")
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn(
                "{task.completed}/{task.total}"), TimeElapsedColumn(), console=console) as bar:
            task = bar.add_task("collectives", total=total)
            began = time.monotonic()
            for batch in batches(jobs):
                wait_s = batch[0].not_before_s - (time.monotonic() - began)
                if wait_s > 0:  # a replayed trace's timestamp
                    time.sleep(wait_s)
                first = batch[0].collectives[0]
                bar.update(task, description=f"{first.op} {first.schedule.size_bytes} B "
                                             f"x{len(batch[0].collectives)} on "
                                             f"{len(first.hosts)} ranks"
                                             + (f" (+{len(batch) - 1} at once)"
                                                if len(batch) > 1 else ""))
                outcome = run_batch(fabric, [(list(j.collectives), j.connections, j.timeout_s)
                                             for j in batch])
                errors = []
                for job, measured in zip(batch, outcome):
                    if isinstance(measured, TestbedError):
                        errors.append(f"workload.collectives[{job.index}]: {measured}")
                        continue
                    doc["collectives"] += [{"job": job.index, "repetition": i,
                                            "concurrent_jobs": len(batch), **asdict(r)}
                                           for i, r in enumerate(measured)]
                    bar.advance(task, len(measured))
                _write_results(results, doc)
                if errors:
                    doc["error"] = "\n".join(errors)
                    _write_results(results, doc)
                    raise TestbedError("\n".join(errors))
        iterations: dict[str, float] = {}
        for row in doc["collectives"]:  # training: an iteration is its phases and their gaps
            if row["label"].startswith("iter "):
                key = row["label"].split()[1]
                iterations[key] = iterations.get(key, 0.0) + row["duration_s"] + row["gap_s"]
        if iterations:
            doc["iterations"] = [{"iteration": int(k), "time_s": v} for k, v in iterations.items()]
            for item in doc["iterations"]:
                console.print(f"training iteration {item['iteration']}: {item['time_s']:.2f} s")
        doc["complete"] = True
        _write_results(results, doc)
    finally:
        with console.status("tearing down ..."):
            fabric.down()
    console.print(_results_table(doc))
    console.print(f"results: {results}")
    return 0


def _results_table(doc: dict) -> Table:
    """An nccl-tests-like table: one row per job, times averaged over its repetitions."""
    table = Table(title=f"{doc['experiment']}: collectives",
                  caption="bytes: NCCL-tests size; count: float32 elements; algbw, busbw: Mbit/s;"
                          " eff: busbw / link rate; cpu_s: all agents' CPU seconds", box=None)
    for col in ("op", "algo", "n", "bytes", "count", "reps", "time_ms", "algbw", "busbw",
                "eff", "cpu_s"):
        table.add_column(col, justify="left" if col in ("op", "algo") else "right",
                         no_wrap=True)
    jobs: dict[tuple, list[dict]] = {}
    for row in doc["collectives"]:
        key = (row["job"], row["op"], row["algorithm"], row["bytes"], row["communicator_size"])
        jobs.setdefault(key, []).append(row)
    for rows in jobs.values():
        r0 = rows[0]
        mean_s = sum(r["duration_s"] for r in rows) / len(rows)
        algbw = r0["bytes"] * 8 / mean_s / 1e6
        factor = r0["busbw_gbps"] / r0["algbw_gbps"]
        table.add_row(r0["op"], r0["algorithm"], str(r0["communicator_size"]), str(r0["bytes"]),
                      str(r0["bytes"] // 4), str(len(rows)), f"{mean_s * 1e3:.0f}",
                      f"{algbw:.2f}", f"{algbw * factor:.2f}",
                      f"{sum(r['efficiency'] for r in rows) / len(rows):.3f}",
                      f"{sum(r.get('agent_cpu_s', 0.0) for r in rows):.1f}")
    return table


def cmd_clean(args) -> int:
    report = cleanup.clean(Registry(args.state_dir), include_live=args.all)
    console.print(f"removed {len(report.runs)} run(s): {report.bridges} bridge(s), "
                  f"{report.links} link(s), {report.processes} process(es)")
    for item in report.skipped:
        console.print(f"skipped live run {item} (use --all to remove it too)")
    for err in report.errors:
        console.print(f"[red]error:[/red] {err}")
    return 1 if report.errors else 0


def cmd_schema(_args) -> int:
    print(json.dumps(config.schema(), indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fabriclab", description=__doc__)
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR,
                        help=f"run records and caches (default {DEFAULT_STATE_DIR})")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("validate", help="check experiment files without building anything")
    p.add_argument("files", nargs="+")
    p.set_defaults(func=cmd_validate)
    p = sub.add_parser("up", help="build a fabric and keep it up until Ctrl-C")
    p.add_argument("file")
    p.add_argument("--check", action="store_true",
                   help="test all-pairs reachability, tear down, exit non-zero on any loss")
    p.add_argument("--count", type=int, default=2, help="probes per pair with --check")
    p.add_argument("-v", "--verbose", action="store_true", help="print step timings")
    p.add_argument("--backend", choices=("auto", "host", "vm"),
                   help="where to run (default: the experiment's emulator.backend)")
    p.add_argument("--vm-accel", choices=("tcg", "kvm"), default="tcg",
                   help="vm backend: CPU emulation (default; works everywhere) or KVM")
    p.set_defaults(func=cmd_up)
    p = sub.add_parser("run", help="build the fabric, run the workload, write results, tear down")
    p.add_argument("file")
    p.add_argument("--out", required=True, help="directory for results.json")
    p.add_argument("--backend", choices=("auto", "host", "vm"),
                   help="where to run (default: the experiment's emulator.backend)")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("clean", help="remove what earlier (killed) runs left behind")
    p.add_argument("--all", action="store_true", help="also runs whose process is still alive")
    p.set_defaults(func=cmd_clean)
    p = sub.add_parser("schema", help="print the experiment file's JSON Schema")
    p.set_defaults(func=cmd_schema)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return args.func(args)
    except ConfigError as err:
        console.print(f"[red]config error:[/red] {err}")
        return 2
    except TestbedError as err:
        console.print(f"[red]testbed error:[/red] {err}")
        return 3
    except (KeyboardInterrupt, Terminated) as err:
        if getattr(args, "verbose", False):
            console.print_exception()
        console.print(f"interrupted ({type(err).__name__}); torn down")
        return 130


if __name__ == "__main__":
    sys.exit(main())
