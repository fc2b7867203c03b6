"""Errors are never swallowed: each bad input or failing step ends in one clear error."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fabriclab.model import experiment as xp
from testbed.errors import ConfigError, TestbedError
from traffic.agents import runner
from traffic.workloads.schedules import build
from traffic.workloads.workload import Collective, Job

ROOT = Path(__file__).resolve().parents[2]


def test_a_binary_experiment_file_is_a_config_error_not_a_traceback(tmp_path):
    binary = tmp_path / "exp.yaml"
    binary.write_bytes(b"version: 1\n\xff\xfe\x00\x01garbage")
    with pytest.raises(ConfigError) as err:
        xp.load(binary)
    assert err.value.path == str(binary) and "not UTF-8" in err.value.message
    good = ROOT / "experiments" / "leaf-spine.yaml"
    proc = subprocess.run([sys.executable, "-m", "fabriclab.cli", "validate", "--json",
                           str(binary), str(good)], capture_output=True, text=True, cwd=ROOT,
                          timeout=60, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    bad_doc, good_doc = json.loads(proc.stdout)  # the good file is still validated
    assert not bad_doc["ok"] and "not UTF-8" in bad_doc["error"]
    assert good_doc["ok"] and good_doc["counts"]["hosts"] == 16


def test_a_binary_trace_is_named(tmp_path):
    (tmp_path / "t.jsonl").write_bytes(b"\x89PNG\r\n")
    (tmp_path / "exp.yaml").write_text("version: 1\nfabric: {topology: fat_tree, k: 4}\n"
                                       "workload: {trace: t.jsonl}\n")
    with pytest.raises(ConfigError) as err:
        xp.load(tmp_path / "exp.yaml")
    assert err.value.path == "workload.trace" and "not UTF-8" in err.value.message


def _jobs(n: int) -> list[Job]:
    coll = Collective("send_recv", ("a", "b"), build("send_recv", 2, 64))
    return [Job(i, (coll,), 1, 5.0) for i in range(n)]


def test_a_crashing_job_thread_is_raised_not_left_as_none(monkeypatch):
    behaviour = {}  # agent port -> what run_job does there

    def run_job(_fabric, _colls, _conns, _timeout, port, _start, _cc, _dscp, *_transport):
        if behaviour.get(port):
            raise behaviour[port]
        return []

    monkeypatch.setattr(runner, "run_job", run_job)
    behaviour[runner.AGENT_PORT + 1] = KeyError("a bug")
    with pytest.raises(KeyError, match="a bug"):  # a bug in any thread reaches the caller
        runner.run_batch(None, _jobs(3))
    behaviour[runner.AGENT_PORT + 1] = TestbedError("agents failed")
    ok, failed, also_ok = runner.run_batch(None, _jobs(3))  # a job's own failure is its outcome
    assert ok.error is None and ok.results == () and also_ok.error is None
    assert isinstance(failed.error, TestbedError) and failed.job.index == 1


def test_a_failing_teardown_after_a_failing_build_keeps_the_build_error(monkeypatch, tmp_path):
    from testbed.fabric.fabric import Fabric

    exp = xp.parse({"version": 1, "fabric": {"topology": "leaf_spine", "leaves": 2, "spines": 1,
                                             "hosts_per_leaf": 1}})
    fabric = Fabric(exp, state_dir=tmp_path)

    def up() -> None:
        raise TestbedError("the build failed")

    def down() -> None:
        raise TestbedError("and so did the teardown")

    monkeypatch.setattr(fabric, "up", up)
    monkeypatch.setattr(fabric, "down", down)
    with pytest.raises(TestbedError, match="the build failed") as err, fabric:
        pass
    assert any("and so did the teardown" in note for note in err.value.__notes__)


def test_the_first_agent_to_die_fails_the_job_at_once_naming_its_rank(tmp_path):
    """The runner watches every agent at once: a later rank dying while rank 0 still runs
    fails the job within seconds (not at the job's timeout), naming the rank and its stderr."""
    import subprocess
    import sys
    import time

    from tests.unit.fakefabric import FakeFabric

    exp = xp.parse({"version": 1, "fabric": {"topology": "leaf_spine", "leaves": 2, "spines": 1,
                                             "hosts_per_leaf": 2}})
    hosts = [h.name for h in exp.topology.hosts]
    procs = []

    class Agents(FakeFabric):
        def spawn(self, host, argv, role, **popen_kwargs):
            code = ("import sys, time; time.sleep(0.3); sys.stderr.write('boom: no route');"
                    " sys.exit(1)" if host == hosts[3] else "import time; time.sleep(60)")
            proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
            procs.append(proc)
            return proc

        def stop(self, proc, timeout_s: float = 5.0):
            proc.kill()
            return proc.wait()

    fabric = Agents(exp, tmp_path)
    fabric.up()
    coll = Collective("all_reduce", tuple(hosts), build("all_reduce", 4, 1 << 20))
    start = time.monotonic()
    with pytest.raises(TestbedError) as err:
        runner.run_job(fabric, [coll], timeout_s=600)
    assert time.monotonic() - start < 3.0
    assert "rank 3" in str(err.value) and "boom: no route" in str(err.value)
    assert all(p.poll() is not None for p in procs)  # the others were stopped


def test_run_directory_file_names_stay_inside_it():
    """What a cluster machine's actor writes or reads in its run directory is named by the
    coordinator: one plain path component, nothing hidden, nothing outside."""
    from testbed.runs.registry import run_file_name

    assert run_file_name("job-17000-1.json") == "job-17000-1.json"
    for bad in ("../x", "/etc/passwd", "a/b", ".", "..", ".hidden", "", "x\0y", "y" * 300):
        with pytest.raises(TestbedError):
            run_file_name(bad)
