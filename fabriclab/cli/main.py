"""``fabriclab``: the parser, one typed request per command line, the handler, the exit code.

Exit codes: 0 ok, 1 reachability loss, 2 bad experiment file or option, 3 system failure (or a
failed run, variant or cell), 130 interrupted (torn down).
"""

from __future__ import annotations

import argparse
import importlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from fabriclab.cli import requests as rq
from fabriclab.cli.output import (EXIT_CONFIG, EXIT_INTERRUPTED, EXIT_SYSTEM, console,
                                  error_console)
from fabriclab.options import TelemetryOptions, parse_exporter
from fabriclab.signals import Terminated, raise_on_stop_signals, stop_received
from telemetry.model.promconfig import DEFAULT_SCRAPE_INTERVAL_S, LOOPBACK
from testbed.errors import ConfigError, TestbedError, printable
from testbed.model.spec import Backend
from testbed.paths import DEFAULT_STATE_DIR

DESCRIPTION = ("An emulation testbed for AI-training scale-out fabrics: build a fabric from an "
               "experiment file, run its workload, write results and a report.")


@dataclass(frozen=True)
class Command:
    """A command: its handler ``module.function(request, console) -> exit code``, imported
    only when the command runs."""

    module: str  # under fabriclab.cli
    function: str
    help: str
    json: bool = True  # takes --json

    def handler(self) -> Callable[[object, Console], int]:
        return getattr(importlib.import_module(f"fabriclab.cli.{self.module}"), self.function)


COMMANDS = {
    "validate": Command("experiments", "validate",
                        "check experiment files without building anything"),
    "predict": Command("predict", "predict", "estimate every collective's time on the fabric "
                                             "as routed, without building it"),
    "up": Command("fabric", "up", "build a fabric and keep it up until Ctrl-C"),
    "run": Command("runs", "run", "build the fabric, run the workload, write results, "
                                  "tear down"),
    "telemetry": Command("telemetry", "serve", "serve a finished run's Prometheus data again",
                         json=False),
    "top": Command("telemetry", "top", "watch a running fabric: busiest links per tier, "
                                       "queues, marks, pauses, drops, and the collectives",
                   json=False),
    "ls": Command("background", "ls", "list the running fabrics"),
    "down": Command("background", "down", "tear a running fabric down (one, by id, or all)"),
    "exec": Command("background", "exec_in", "run a command (a shell by default) in a host of "
                                             "a running fabric", json=False),
    "launch": Command("launch", "launch", "run a program on hosts of a running fabric as a "
                                          "distributed job (RANK, WORLD_SIZE, MASTER_ADDR, ...)"),
    "ofctl": Command("background", "ofctl", "ovs-ofctl (OpenFlow 1.5) against one switch of a "
                                            "running fabric", json=False),
    "capture": Command("background", "capture", "capture packets on a link or port of a "
                                                "running fabric (tcpdump; a pcap with -w)",
                       json=False),
    "fail": Command("fabric", "fail", "take a link (two nodes) or a switch (one) of the "
                                      "fabric 'fabriclab up' keeps running down"),
    "restore": Command("fabric", "fail", "take a link (two nodes) or a switch (one) of the "
                                         "fabric 'fabriclab up' keeps running back up"),
    "report": Command("runs", "report", "(re)build DIR/report.html from a run directory"),
    "compare": Command("runs", "compare", "put runs side by side (run, variants or sweep "
                                          "directories)"),
    "clean": Command("fabric", "clean", "remove what earlier (killed) runs left behind"),
    "schema": Command("experiments", "schema", "print the experiment file's JSON Schema "
                                               "(--results: results.json's)",
                      json=False),
    "graph": Command("graph", "graph", "draw an experiment's topology without building it "
                                       "(dot, mermaid, png, svg)", json=False),
    "export": Command("export", "export", "write an experiment as another tool reads it "
                                          "(htsim: topology, connection matrix, command line)"),
    "completion": Command("completion", "completion", "print shell completion for bash or zsh",
                          json=False),
}


def version_text() -> str:
    """``fabriclab X.Y.Z`` (the installed distribution's version)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"fabriclab {version('fabriclab')}"
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "fabriclab (not installed)"


def _target_arguments(p: dict[str, argparse.ArgumentParser]) -> None:
    """``exec HOST`` and ``ofctl SWITCH``: the node, then a command for it."""
    for name, what, example, rest in (
            ("exec", "host", "h1_1_1, s1g0, ...", "the command and its arguments (after --; "
                                                  "default: a shell)"),
            ("ofctl", "switch", "edge1_1, leaf2, core1, ...", "the ovs-ofctl command and its "
                                                              "arguments (dump-flows, "
                                                              "dump-groups, show, ...)")):
        p[name].add_argument(what, help=f"the {what}'s name ({example})")
        p[name].add_argument("args", nargs=argparse.REMAINDER, help=rest)
        p[name].add_argument("--run", help="the run id, when several fabrics are up")


def _launch_arguments(p: dict[str, argparse.ArgumentParser]) -> None:
    """``launch``: where the ranks go, how long they may run, then the program."""
    p["launch"].add_argument("--run", help="the run id, when several fabrics are up")
    p["launch"].add_argument("--ranks", type=int, metavar="N",
                             help="ranks on the first N/per-host hosts (default: every host)")
    p["launch"].add_argument("--hosts", metavar="H1,H2,...",
                             help="the hosts in rank order (instead of --ranks)")
    p["launch"].add_argument("--per-host", type=int, default=1, metavar="M",
                             help="ranks on each host (LOCAL_RANK 0 .. M-1; default 1)")
    p["launch"].add_argument("--timeout", type=float, default=600.0, metavar="S",
                             help="end every rank still running S seconds after the start "
                                  "(default 600)")
    p["launch"].add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                             help="an environment variable of every rank (repeatable)")
    p["launch"].add_argument("--out", type=Path, help="where the ranks' output goes (default "
                                                      "runs/launch-RUN-TIME)")
    p["launch"].add_argument("args", nargs=argparse.REMAINDER,
                             help="-- then the program and its arguments ({rank} and {host} "
                                  "are replaced in each rank's)")


def _run_only_arguments(run: argparse.ArgumentParser) -> None:
    """``fabriclab run``'s own options (beside those it shares with ``up``)."""
    run.add_argument("--out", type=Path, help="directory for results.json, the report "
                                              "and the run's files (default runs/NAME, "
                                              "NAME the experiment's)")
    run.add_argument("--resume", action="store_true",
                     help="finish an interrupted run in --out: complete cells and variants "
                          "are kept, the rest run")
    run.add_argument("--force", action="store_true",
                     help="overwrite the run --out already holds")
    run.add_argument("--seed", type=int, default=None, metavar="N",
                     help="the run seed every random choice derives from (permutations, "
                          "placements, the connections' source ports and so ECMP paths); "
                          "the file's seed by default, else 1")
    run.add_argument("--parallel", action="store_true",
                     help="a sweep's cells at once, one per machine of the cluster, each "
                          "built whole on its machine")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fabriclab", description=DESCRIPTION,
                                     epilog=__doc__.split("\n\n", 1)[1].strip())
    parser.add_argument("--version", action="version", version=version_text(),
                        help="print fabriclab's version and exit")
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR,
                        help=f"run records and caches (default {DEFAULT_STATE_DIR})")
    parser.add_argument("--max-input-mb", type=int, default=None, metavar="N",
                        help="the largest trace or NCCL log an experiment may read (default 64)")
    parser.add_argument("--insecure-cluster", action="store_true",
                        help="join a Ray cluster without its token authentication (whoever "
                             "reaches the cluster is then root on every machine)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = {}
    for name, command in COMMANDS.items():
        p[name] = sub.add_parser(name, help=command.help)
        p[name].set_defaults(json=False)
        if command.json:
            p[name].add_argument("--json", action="store_true", help="print one JSON document "
                                 "on stdout (the rest goes to stderr)")
    _launch_arguments(p)
    p["schema"].add_argument("--results", action="store_true",
                             help="the JSON Schema of results.json (fabriclab/schema/"
                                  "results.schema.json) instead of the experiment file's")
    p["validate"].add_argument("files", nargs="+", type=Path, metavar="FILE",
                               help="experiment files (YAML)")
    p["validate"].add_argument("--machines", type=int, default=0,
                               help="also show how the fabric would be partitioned over N "
                                    "machines like this one (each at the fidelity model's "
                                    "headroom)")
    p["predict"].add_argument("files", nargs="+", type=Path, metavar="FILE",
                              help="experiment files (YAML)")
    p["predict"].add_argument("--draws", type=int, default=16, metavar="N",
                              help="ECMP hash draws simulated (default %(default)s; their "
                              "busiest-link bounds draw 1,024 more)")
    p["predict"].add_argument("--share-cv", type=float, default=None, metavar="CV",
                              help="how unevenly TCP's flows share a link: the spread of a "
                                   "flow's share around the fair one (default 0.6, measured; "
                                   "0: every flow its fair share)")
    for name in ("up", "run"):
        _run_arguments(p[name])
    p["up"].add_argument("--check", action="store_true",
                         help="test all-pairs reachability, tear down, exit non-zero on any loss")
    p["up"].add_argument("--count", type=int, default=2, help="probes per pair with --check")
    p["up"].add_argument("-v", "--verbose", action="store_true", help="print step timings")
    p["up"].add_argument("-d", "--detach", action="store_true",
                         help="keep the fabric up in the background and return once it is up, "
                              "printing its run id ('fabriclab ls', 'fabriclab down ID')")
    p["down"].add_argument("run", nargs="?", metavar="ID",
                           help="the run id ('fabriclab ls'); none: the one running fabric")
    p["down"].add_argument("--all", action="store_true", help="every running fabric")
    _target_arguments(p)
    p["up"].add_argument("--out", type=Path, help="with --telemetry: where Prometheus stores "
                                                  "(default runs/up-<time>)")
    _run_only_arguments(p["run"])
    p["telemetry"].add_argument("dir", type=Path,
                                help="the run's output directory (or a variant's)")
    p["telemetry"].add_argument("--port", type=int, default=0,
                                help="Prometheus's port (default: a free one)")
    p["telemetry"].add_argument("--grafana", action="store_true",
                                help="also start Grafana (Docker) with the repository's "
                                     "dashboards")
    p["top"].add_argument("--run", help="the run id, when several fabrics are up")
    p["top"].add_argument("--interval", type=float, default=1.0, metavar="S",
                          help="seconds between refreshes (default %(default)s)")
    p["top"].add_argument("--links", type=int, default=4, help="links shown per tier "
                                                               "(default 4)")
    p["top"].add_argument("--once", action="store_true", help="print one frame and exit")
    _other_arguments(p)
    return parser


def _other_arguments(p: dict[str, argparse.ArgumentParser]) -> None:
    """The arguments of the commands after ``top``."""
    for name in ("fail", "restore"):
        p[name].add_argument("target", nargs="+", help="agg1_1 core1 (a link) or core1 "
                                                       "(a switch)")
        p[name].add_argument("--run", help="the run id, when several fabrics are up")
    p["capture"].add_argument("target", nargs="+", metavar="LINK|PORT",
                              help="a link as two nodes (edge1_1 agg1_1: captured at the "
                                   "first's end), a port (edge1_1-eth3) or a host (its NIC)")
    p["capture"].add_argument("-w", "--write", type=Path, metavar="FILE",
                              help="write a pcap (Wireshark reads it) instead of printing")
    p["capture"].add_argument("-c", "--count", type=int, metavar="N",
                              help="stop after N packets (default: at Ctrl-C)")
    p["capture"].add_argument("--filter", default="", metavar="EXPR",
                              help="a pcap filter ('tcp port 5201')")
    p["capture"].add_argument("--run", help="the run id, when several fabrics are up")
    p["report"].add_argument("dir", metavar="DIR", type=Path,
                             help="a run, variants or sweep directory (fabriclab run's --out)")
    p["compare"].add_argument("dirs", nargs="+", metavar="DIR", type=Path,
                              help="run, variants or sweep directories")
    p["compare"].add_argument("--baseline", metavar="RUN", default=None,
                              help="the run the others' changes are given against (the end of "
                                   "its name, as the table prints it; default: the first)")
    p["graph"].add_argument("file", type=Path, metavar="FILE", help="the experiment file (YAML)")
    p["graph"].add_argument("--format", choices=("png", "svg", "dot", "mermaid", "json"),
                            default="png", help="a picture, text for Graphviz or Mermaid, or "
                            "the topology file a controller app reads (default png)")
    p["graph"].add_argument("-o", "--out", type=Path, metavar="PATH",
                            help="where to write it (default: text to stdout, a picture to "
                                 "NAME.FORMAT here, NAME the file's)")
    p["export"].add_argument("file", type=Path, metavar="FILE", help="the experiment file (YAML)")
    p["export"].add_argument("--format", choices=("htsim", "containerlab", "networkx", "gml",
                                                  "hpcc", "mininet"), default="htsim",
                             help="htsim: ultraethernet/uet-htsim's topology and connection "
                                  "matrix files and command line, per variant (default); "
                                  "containerlab, networkx (node-link JSON), gml, hpcc: the "
                                  "topology; mininet: a module for mn --custom")
    p["export"].add_argument("-o", "--out", type=Path, metavar="DIR",
                             help="where to write them (default export-NAME, NAME the "
                                  "experiment's)")
    p["completion"].add_argument("shell", choices=("bash", "zsh"),
                                 help="the shell: source the output, or put it in its "
                                      "completion folder")
    p["clean"].add_argument("--all", action="store_true",
                            help="also runs whose process is still alive")


def _run_arguments(p: argparse.ArgumentParser) -> None:
    """What ``up`` and ``run`` share: the file, where, and the telemetry."""
    p.add_argument("file", type=Path, metavar="FILE", help="the experiment file (YAML)")
    p.add_argument("--backend", choices=list(Backend),
                   help="where to run (default: the experiment's emulator.backend)")
    p.add_argument("--cluster", metavar="ADDRESS",
                   help="partition the fabric over the Ray cluster whose head is ADDRESS "
                        "(host:port), as the experiment's cluster.address would")
    p.add_argument("--vm-accel", choices=("tcg", "kvm"), default="tcg",
                   help="vm backend: CPU emulation (default; works everywhere) or KVM")
    p.add_argument("--telemetry", action="store_true",
                   help="run a Prometheus (127.0.0.1) scraping the fabric's, the workload's and "
                        "the controller's exporters, storing in the output directory")
    p.add_argument("--scrape-interval", type=float, default=DEFAULT_SCRAPE_INTERVAL_S,
                   metavar="S", help="seconds between scrapes (default %(default)s)")
    p.add_argument("--keep", action="store_true",
                   help="with --telemetry: after the workload, keep fabric and telemetry up "
                        "until Ctrl-C")
    p.add_argument("--exporter", default=f"{LOOPBACK}:0", metavar="HOST:PORT",
                   help="where the fabric's exporter listens (default %(default)s: loopback, "
                        "a port from the OS)")


def telemetry_options(args: argparse.Namespace, ui: Console) -> TelemetryOptions:
    """The telemetry flags of ``up`` and ``run``, checked (each bad one named)."""
    host, port = parse_exporter(args.exporter)
    keep = None
    if args.keep:
        from fabriclab.cli.telemetry import keep_until_stopped  # the command's own module

        keep = keep_until_stopped(ui)
    return TelemetryOptions(args.telemetry, args.scrape_interval, keep, None, host, port)


def to_request(args: argparse.Namespace, ui: Console) -> object:
    """The typed request of a parsed command line (the namespace goes no further)."""
    name = args.command
    if name == "validate":
        return rq.ValidateRequest(args.files, args.machines, args.json)
    if name == "schema":
        return rq.SchemaRequest(args.results)
    if name == "predict":
        if args.draws < 1:
            raise ConfigError("--draws", f"must be at least 1, got {args.draws}")
        if args.share_cv is not None and not 0 <= args.share_cv <= 3:
            raise ConfigError("--share-cv", f"must be between 0 and 3, got {args.share_cv}")
        return rq.PredictRequest(args.files, args.draws, args.json, args.share_cv)
    if name == "up":
        return rq.UpRequest(args.file, args.state_dir, args.check, args.count, args.verbose,
                            args.backend, args.cluster, args.vm_accel, args.out,
                            telemetry_options(args, ui), args.json, args.detach)
    if name == "ls":
        return rq.ListRequest(args.state_dir, args.json)
    if name == "launch":
        env = []
        for item in args.env:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise ConfigError("--env", f"NAME=VALUE, got {item!r}")
            env.append((key, value))
        if args.ranks is not None and args.hosts:
            raise ConfigError("--hosts", "give --ranks or --hosts, not both")
        rest = tuple(args.args[1:] if args.args[:1] == ["--"] else args.args)
        return rq.LaunchRequest(rest, args.run, args.state_dir, args.ranks,
                                tuple(h for h in (args.hosts or "").split(",") if h),
                                args.per_host, args.timeout, tuple(env), args.out, args.json)
    if name in ("exec", "ofctl"):
        rest = tuple(args.args[1:] if args.args[:1] == ["--"] else args.args)
        target = args.host if name == "exec" else args.switch
        return (rq.ExecRequest if name == "exec" else rq.OfctlRequest)(
            target, rest, args.run, args.state_dir)
    if name == "capture":
        return rq.CaptureRequest(tuple(args.target), args.write, args.count, args.filter,
                                 args.run, args.state_dir)
    if name == "down":
        return rq.DownRequest(args.run, args.all, args.state_dir, args.json)
    if name == "run":
        return rq.RunRequest(args.file, args.out, args.state_dir, args.backend, args.cluster,
                             args.resume, args.force, args.parallel,
                             telemetry_options(args, ui), args.json, False, args.vm_accel,
                             args.seed)
    if name in ("fail", "restore"):
        return rq.FailRequest(args.target, name == "restore", args.run, args.state_dir,
                              args.json)
    if name == "clean":
        return rq.CleanRequest(args.state_dir, args.all, args.json)
    if name == "report":
        return rq.ReportRequest(args.dir, args.json)
    if name == "compare":
        return rq.CompareRequest(args.dirs, args.json, args.baseline)
    if name == "telemetry":
        return rq.ServeRequest(args.dir, args.port, args.grafana)
    if name == "top":
        return rq.TopRequest(args.state_dir, args.run, args.interval, args.links, args.once)
    if name == "completion":
        return rq.CompletionRequest(args.shell)
    if name == "graph":
        return rq.GraphRequest(args.file, args.format, args.out)
    if name == "export":
        return rq.ExportRequest(args.file, args.format, args.out, args.json)
    raise AssertionError(f"no request for {name}")  # the parser knows only COMMANDS


def main(argv: list[str] | None = None) -> int:
    raise_on_stop_signals()
    try:
        code = _handle(build_parser().parse_args(argv))
    except (KeyboardInterrupt, Terminated):  # before the handler's own try, or after it
        return EXIT_INTERRUPTED
    lost = stop_received()
    if code == 0 and lost is not None:  # dropped where no exception could unwind (a library)
        error_console().print(f"[red]{lost} arrived but could not interrupt the command:[/red] "
                              "it went on to the end; exit 130 all the same")
        return EXIT_INTERRUPTED
    return code


def _handle(args: argparse.Namespace) -> int:
    """The command's handler on its request; every error turned into its exit code."""
    ui = console(to_stderr=args.json)
    verbose = args.command == "up" and args.verbose
    if args.insecure_cluster:
        from testbed.cluster import machines
        machines.INSECURE_ALLOWED = True
    if args.max_input_mb is not None:
        from traffic.workloads import workload
        workload.MAX_INPUT_BYTES = max(1, args.max_input_mb) << 20
    errors = error_console()
    try:
        request = to_request(args, ui)
        return COMMANDS[args.command].handler()(request, ui)
    except ConfigError as err:
        errors.print(f"[red]config error:[/red] {escape(printable(str(err)))}")
        return EXIT_CONFIG
    except TestbedError as err:
        errors.print(f"[red]testbed error:[/red] {escape(printable(str(err)))}")
        for note in getattr(err, "__notes__", []):
            errors.print(f"  {escape(printable(note))}")
        return EXIT_SYSTEM
    except OSError as err:  # the system refused (a full disk, a permission): named, not a bug
        where = getattr(err, "filename", None)
        errors.print(f"[red]system error:[/red] {escape(printable(err.strerror or str(err)))}"
                     + (f": {escape(printable(str(where)))}" if where else ""))
        return EXIT_SYSTEM
    except (KeyboardInterrupt, Terminated) as err:
        if verbose:
            ui.print_exception()
        ui.print(f"interrupted ({type(err).__name__}); torn down")
        return EXIT_INTERRUPTED
    except Exception as err:  # noqa: BLE001 - a bug: one line here, the traceback in a file
        where = _save_traceback(args.state_dir)
        errors.print(f"[red]internal error:[/red] {escape(type(err).__name__)}: "
                     f"{escape(printable(str(err)))}"
                 f" (a bug in fabriclab; the traceback: {where})")
        return EXIT_SYSTEM


#: the newest tracebacks kept in ``STATE_DIR/errors`` (older ones are removed)
KEPT_TRACEBACKS = 20


def _save_traceback(state_dir: Path) -> str:
    """The current exception's traceback in ``STATE_DIR/errors/`` (the oldest beyond
    :data:`KEPT_TRACEBACKS` removed), or the temporary folder where that is not writable;
    returns where."""
    import tempfile
    import traceback

    from testbed.linux.files import make_dirs, write_text_atomic

    text = traceback.format_exc()
    name = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt"
    for folder in (Path(state_dir) / "errors", Path(tempfile.gettempdir())):
        try:
            make_dirs(folder)
            write_text_atomic(folder / name, text, mode=0o600)
        except (OSError, TestbedError):
            continue
        if folder.name == "errors":
            for old in sorted(folder.glob("*-*.txt"))[:-KEPT_TRACEBACKS]:
                old.unlink(missing_ok=True)
        return str(folder / name)
    return "not saved: " + text.strip().splitlines()[-1]


if __name__ == "__main__":
    raise SystemExit(main())
