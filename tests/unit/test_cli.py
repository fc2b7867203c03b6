"""The command as a thin shell: ``validate``, ``schema`` and ``--help`` load no system adapter
and answer fast; every command's handler is found and takes its typed request; a --parallel
sweep whose cell failed exits non-zero."""

from __future__ import annotations

import inspect
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fabriclab.cli import main as cli
from fabriclab.cli.output import EXIT_OK, EXIT_SYSTEM
from fabriclab.model.document import RunDocument

ROOT = Path(__file__).resolve().parents[2]
# what touches the system: these libraries, and the adapter folders' modules
HEAVY = ("mininet", "os_ken", "ray", "docker", "pyroute2", "matplotlib", "prometheus_client")
ADAPTER_FOLDERS = ("testbed.linux", "testbed.fabric", "testbed.runs", "testbed.cluster",
                   "testbed.vm", "traffic.agents", "telemetry.exporter", "telemetry.prometheus",
                   "telemetry.grafana", "controllers", "fabriclab.runner", "fabriclab.modes",
                   "fabriclab.shared", "fabriclab.report")

PROBE = """
import contextlib, io, json, sys, time
t0 = time.monotonic()
from fabriclab.cli.main import main
argv = json.loads(sys.argv[1])
out = io.StringIO()
code = None
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
    try:
        code = main(argv)
    except SystemExit as end:
        code = end.code
print(json.dumps({"code": code, "s": time.monotonic() - t0, "modules": sorted(sys.modules)}))
"""


def _probe(argv: list[str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], capture_output=True,
                          text=True, cwd=ROOT, timeout=120, check=True)
    return json.loads(proc.stdout.splitlines()[-1])


def _heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if m.split(".")[0] in HEAVY
            or any(m == f or m.startswith(f + ".") for f in ADAPTER_FOLDERS)]


@pytest.mark.parametrize("argv", [["validate", *sorted(str(p) for p in
                                                     (ROOT / "experiments").glob("*.yaml"))],
                                  ["schema"], ["--help"], ["run", "--help"]],
                         ids=["validate", "schema", "help", "run-help"])
def test_light_commands_load_no_adapter(argv):
    got = _probe(argv)
    assert got["code"] == EXIT_OK, got["code"]
    assert not _heavy(got["modules"]), _heavy(got["modules"])


def test_validate_takes_under_a_second_per_file():
    files = sorted(str(p) for p in (ROOT / "experiments").glob("*.yaml"))
    got = _probe(["validate", *files])
    assert got["code"] == EXIT_OK
    assert got["s"] < 1.0 * len(files), (got["s"], len(files))


def test_the_probe_sees_heavy_imports():
    """The check above can fail: a command that builds (``up``) imports the adapters."""
    got = _probe(["up", "--help"])  # parsing only: nothing is built
    assert not _heavy(got["modules"])
    from_handler = cli.COMMANDS["up"].handler()  # what running it would load
    assert from_handler.__module__ == "fabriclab.cli.fabric"
    assert "testbed.fabric.fabric" in sys.modules


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_every_command_has_a_handler_of_its_typed_request(name):
    handler = cli.COMMANDS[name].handler()
    params = list(inspect.signature(handler).parameters)
    assert len(params) == 2, params
    parser = cli.build_parser()
    required = {"validate": ["x.yaml"], "up": ["x.yaml"], "run": ["x.yaml", "--out", "o"],
                "telemetry": ["d"], "fail": ["core1"], "restore": ["core1"],
                "report": ["d"], "compare": ["d"], "completion": ["bash"], "graph": ["x.yaml"],
                "export": ["x.yaml"], "predict": ["x.yaml"],
                "exec": ["h1"], "capture": ["h1"],
                "ofctl": ["edge1_1", "show"]}.get(name, [])
    request = cli.to_request(parser.parse_args([name, *required]), None)
    hint = inspect.signature(handler).parameters[params[0]].annotation
    assert type(request).__name__ == str(hint).split(".")[-1].strip("'\""), (request, hint)


def test_a_parallel_sweep_whose_cell_failed_exits_non_zero(tmp_path, monkeypatch):
    """The exit status comes from every cell that ran, also when they ran on a cluster's
    machines (a cell failed there: 3)."""
    from fabriclab import modes
    from fabriclab.cli import runs

    exp = tmp_path / "sweep.yaml"
    exp.write_text("version: 1\nname: s\nfabric: {topology: leaf_spine, leaves: 2, spines: 1, "
                   "hosts_per_leaf: 1}\ncluster: {address: '127.0.0.1:1'}\nworkload:\n"
                   "  collectives: [{op: all_reduce, size: 1KiB}]\n"
                   "sweep: {axes: {controller.routing: [ecmp, dmodk]}}\n")

    def on_machines(exp, todo, out, sweep, view):
        for cell in todo:  # the first cell fails on its machine, the second completes
            ok = cell is not todo[0]
            sweep.record(cell, RunDocument("s", complete=ok),
                         None if ok else "machine1: agent died")
        sweep.save()
        return 2

    monkeypatch.setattr(modes, "run_cells_on_machines", on_machines)
    monkeypatch.setattr(modes, "write_report", lambda out, view: None)
    request = cli.to_request(cli.build_parser().parse_args(
        ["run", str(exp), "--out", str(tmp_path / "out"), "--parallel"]), None)
    assert runs.run(request, cli.console(False)) == EXIT_SYSTEM


def test_an_internal_error_exits_3_with_one_line_and_the_traceback_in_a_file(tmp_path, capsys,
                                                                            monkeypatch):
    """A bug (any exception that is not a config or testbed error) is not exit 1, which means
    unreachable hosts: exit 3, one console line naming it, the traceback kept."""
    from fabriclab.cli import experiments
    from fabriclab.cli import main as cli

    def boom(*_a, **_k):
        raise OverflowError("int too large to convert")
    monkeypatch.setattr(experiments, "validate", boom)
    code = cli.main(["--state-dir", str(tmp_path), "validate", "x.yaml"])
    printed = capsys.readouterr()
    assert not printed.out  # errors go to stderr
    out = printed.err
    assert code == 3, out
    assert "internal error: OverflowError: int too large to convert" in out
    saved = list((tmp_path / "errors").glob("*.txt"))
    assert len(saved) == 1 and "Traceback" in saved[0].read_text() and str(saved[0]) in \
        out.replace("\n", "")


STOPS_IN_A_CHILD = (
    "import os, signal, time\n"
    "from fabriclab.signals import Terminated, raise_on_stop_signals\n"
    "raise_on_stop_signals()\n"
    "for name in {names}:\n"
    "    sig = signal.Signals[name]\n"
    "    try:\n"
    "        os.kill(os.getpid(), sig); time.sleep(0.5); print('outlived', name)\n"
    "    except (Terminated, KeyboardInterrupt) as exc:\n"
    "        print(type(exc).__name__, name)\n")


def _stops_in_a_child(names: list[str], ignored: signal.Signals) -> list[str]:
    """What a process started with ``ignored`` ignored, its stop handlers installed, does with
    each of the signals ``names`` sent to itself in turn: a line each."""
    proc = subprocess.run([sys.executable, "-c", STOPS_IN_A_CHILD.format(names=names)],
                          capture_output=True, text=True, timeout=30, cwd=ROOT,
                          preexec_fn=lambda: signal.signal(ignored, signal.SIG_IGN))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_sighup_and_sigint_tear_down_even_from_a_shell_that_ignores_sigint():
    """``raise_on_stop_signals``: SIGHUP (an ssh session ending) is Terminated like SIGTERM, and
    SIGINT is KeyboardInterrupt although the process started with SIGINT ignored (what a
    non-interactive shell does to its background jobs)."""
    assert _stops_in_a_child(["SIGHUP", "SIGINT"], signal.SIGINT) == [
        "Terminated SIGHUP", "KeyboardInterrupt SIGINT"]


def test_a_command_started_under_nohup_keeps_ignoring_sighup():
    """``nohup fabriclab run ...``: SIGHUP was ignored when the process started, and stays
    ignored (the run outlives its terminal); SIGTERM still tears it down."""
    assert _stops_in_a_child(["SIGHUP", "SIGTERM"], signal.SIGHUP) == [
        "outlived SIGHUP", "Terminated SIGTERM"]


def test_small_things_a_user_expects(tmp_path):
    """--version; every argument has help; bash completion made from the parser completes
    commands, options and choices; every shipped experiment names the schema for editors."""
    import subprocess
    import sys

    from fabriclab.cli.main import build_parser, version_text

    assert version_text().startswith("fabriclab 0.")
    parser = build_parser()
    for name, sub in parser._actions[-1].choices.items():
        for action in sub._actions:
            assert action.help, (name, action.dest)
    script = tmp_path / "fabriclab.bash"
    script.write_text(subprocess.run([sys.executable, "-m", "fabriclab.cli", "completion",
                                      "bash"], capture_output=True, text=True, check=True,
                                     cwd=ROOT).stdout)

    def complete(*words: str) -> list[str]:
        line = " ".join(f"'{w}'" for w in ("fabriclab", *words))
        out = subprocess.run(["bash", "-c", f"source {script}; COMP_WORDS=({line}); "
                              f"COMP_CWORD={len(words)}; _fabriclab; "
                              "printf '%s\\n' \"${COMPREPLY[@]}\""],
                             capture_output=True, text=True, check=True).stdout
        return out.split()

    assert complete("ru") == ["run"]
    assert complete("run", "--ba") == ["--backend"]
    assert complete("run", "--backend", "") == ["auto", "host", "vm"]
    assert complete("completion", "") == ["bash", "zsh"]
    assert "--machines" in complete("validate", "--")
    for path in sorted((ROOT / "experiments").glob("*.yaml")):
        first = path.read_text().splitlines()[0]
        assert first == "# yaml-language-server: $schema=../fabriclab/schema/experiment.schema.json"
        assert (path.parent / first.split("=", 1)[1]).is_file()


def test_run_writes_to_runs_name_unless_told_where(tmp_path, monkeypatch):
    from fabriclab import modes
    from fabriclab.options import RunRequest
    from fabriclab.runner import RunView
    from testbed.errors import ConfigError

    exp = tmp_path / "e.yaml"
    body = ("fabric: {topology: leaf_spine, leaves: 2, spines: 1, hosts_per_leaf: 1}\n"
            "workload: {collectives: [{op: all_reduce, size: 1MiB}]}\n")
    exp.write_text("version: 1\nname: mine\n" + body)
    seen = []
    monkeypatch.setattr(modes, "run_single",
                        lambda req, _exp, _view: seen.append(req.out) or modes.Outcome({}, False))
    monkeypatch.setattr(modes, "write_report", lambda *_a: None)
    monkeypatch.setattr(modes, "resolve_backend", lambda *_a: "host")
    monkeypatch.chdir(tmp_path)
    modes.run_file(RunRequest(exp, None), RunView())
    modes.run_file(RunRequest(exp, tmp_path / "elsewhere"), RunView())
    assert seen == [Path("runs") / "mine", tmp_path / "elsewhere"]
    exp.write_text("version: 1\nname: ..\n" + body)
    with pytest.raises(ConfigError) as err:
        modes.run_file(RunRequest(exp, None), RunView())
    assert err.value.path == "name" and "--out" in err.value.message
