"""Programs of one's own on real fabrics (docs/programs.md): ``workload.program`` runs on
every rank with torchrun's environment, in hosts that have their own hostnames and an
``/etc/hosts`` naming every host; a rank that fails, one that hangs past ``timeout_s``, a
program not found and a SIGINT each end in their exit code with nothing left running; and
``fabriclab launch`` runs iperf3 between two named hosts of a fabric kept up (root)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from testbed.poll import wait_for
from tests.integration.conftest import ROOT

FABRIC = """version: 1
name: programs
fabric: {topology: leaf_spine, leaves: 2, spines: 1, hosts_per_leaf: 2,
         host_link: {rate_mbps: 50}, fabric_link: {rate_mbps: 50}}
emulator: {datapath: ebpf}
"""
#: a token in every test program's argv: what is left running is found by it
MARK = "fabriclab-program-test"


def _cli(state, *args: str, timeout_s: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fabriclab.cli", "--state-dir", str(state),
                           *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout_s)


def _experiment(tmp_path, program: str) -> str:
    path = tmp_path / "exp.yaml"
    path.write_text(FABRIC + f"workload:\n  program: {program}\n")
    return str(path)


def _left() -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if MARK in line and "ps -eo" not in line]


def test_a_program_runs_on_every_rank_in_hosts_that_look_like_machines(tmp_path):
    script = (f": {MARK}; echo $RANK $WORLD_SIZE $LOCAL_RANK $GROUP_RANK $(hostname) "
              "$MASTER_ADDR:$MASTER_PORT {rank}@{host}; getent hosts h2_2 | cut -f1 -d' '")
    exp = _experiment(tmp_path, json.dumps({"argv": ["sh", "-c", script], "ranks": 4}))
    out = tmp_path / "run"
    done = _cli(tmp_path / "state", "run", exp, "--out", str(out))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "rank 0 says:" in done.stdout and "0 4 0 0 h1-1" in done.stdout
    hosts = ["h1_1", "h1_2", "h2_1", "h2_2"]
    for rank, host in enumerate(hosts):
        said = (out / "ranks" / f"{rank}.out").read_text().split()
        # its hostname: its name with - for _ (a hostname has no underscores)
        assert said[:6] == [str(rank), "4", "0", str(rank), host.replace("_", "-"),
                            "10.0.1.1:29500"], said
        assert said[6:] == [f"{rank}@{host}", "10.0.2.2"], said  # argv filled, /etc/hosts
    doc = json.loads((out / "results.json").read_text())
    program = doc["program"]
    assert doc["complete"] and program["world_size"] == 4 and program["hosts"] == hosts
    assert [r["exit_code"] for r in program["ranks"]] == [0, 0, 0, 0]
    assert doc["congestion"] is not None and doc["fidelity"]["verdict"] in ("ok", "degraded")
    assert not _left()


@pytest.mark.parametrize("program, says", [
    ({"argv": ["sh", "-c", f": {MARK}; [ $RANK = 2 ] && {{ echo broken >&2; exit 1; }}; "
                           "sleep 60"]},
     "rank 2 on h2_1 exited with 1 (the other ranks were ended); the end of its stderr:\n"
     "broken"),
    ({"argv": ["sh", "-c", f": {MARK}; [ $RANK = 1 ] || exit 0; sleep 60"], "timeout_s": 3},
     "rank(s) 1 still running 3 s after the start (timeout_s)"),
    ({"argv": [f"{MARK}-not-installed"], "ranks": 2},
     f"{MARK}-not-installed: program not found")])
def test_a_failing_program_fails_the_run_and_leaves_nothing(tmp_path, program, says):
    exp = _experiment(tmp_path, json.dumps(program))
    out = tmp_path / "run"
    began = time.monotonic()
    done = _cli(tmp_path / "state", "run", exp, "--out", str(out))
    assert done.returncode == 3, done.stdout[-2000:] + done.stderr[-2000:]
    assert says in done.stderr, done.stderr[-2000:]
    assert time.monotonic() - began < 50  # not the 60 s sleeps
    doc = json.loads((out / "results.json").read_text())
    assert doc["complete"] is False and says in doc["error"]
    assert not _left()


def test_sigint_mid_program_tears_down_with_130(tmp_path):
    exp = _experiment(tmp_path, json.dumps({"argv": ["sh", "-c", f": {MARK}; sleep 60"]}))
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "fabriclab.cli", "--state-dir",
                             str(tmp_path / "state"), "run", exp, "--out", str(out)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: len([x for x in _left() if "sleep 60" in x]) >= 4, 90,
                 "every rank running")
        proc.send_signal(signal.SIGINT)
        _stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr[-2000:]
    wait_for(lambda: not _left(), 15, "nothing of the program left")


def test_launch_runs_iperf3_between_two_named_hosts_of_a_fabric_kept_up(tmp_path):
    exp = tmp_path / "bg.yaml"
    exp.write_text(FABRIC)
    state = tmp_path / "state"
    up = _cli(state, "up", "-d", str(exp))
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        host = _cli(state, "exec", "h2_1", "--", "hostname")
        assert host.stdout.strip() == "h2-1", host.stdout + host.stderr
        iperf = ("if [ $RANK = 0 ]; then exec iperf3 -s -1 -p 5201; fi; sleep 0.5; "
                 "exec iperf3 -c $MASTER_ADDR -p 5201 -t 2 -J")
        done = _cli(state, "launch", "--hosts", "h1_1,h2_2", "--timeout", "60", "--out",
                    str(tmp_path / "launch"), "--json", "--", "sh", "-c", iperf)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        summary = json.loads(done.stdout)
        assert summary["hosts"] == ["h1_1", "h2_2"] and summary["world_size"] == 2
        client = json.loads((tmp_path / "launch" / "ranks" / "1.out").read_text())
        received = client["end"]["sum_received"]["bits_per_second"] / 1e6
        assert 35 < received <= 50.5, received  # the 50 Mbit/s links' goodput
        assert client["start"]["connected"][0]["remote_host"] == "10.0.1.1"
        bad = _cli(state, "launch", "--hosts", "h1_1,nowhere", "--", "true")
        assert bad.returncode == 2 and "launch.hosts[1]" in bad.stderr, bad.stderr
    finally:
        down = _cli(state, "down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert not _left()


def test_torch_gloo_collectives_are_measured_beside_the_prediction(tmp_path):
    """examples/torch_collectives.py (PyTorch's gloo on CPUs) on 4 ranks: its all-reduce and
    all-to-all become rows of results.json with predict's time for the same collective on
    the same hosts (gloo's ring runs backwards: order=reverse)."""
    argv = ["/usr/bin/python3", str(ROOT / "examples" / "torch_collectives.py"), "--size",
            "4MiB", "--iters", "2", "--ops", "all_reduce,all_to_all"]
    exp = _experiment(tmp_path, json.dumps({"argv": argv, "ranks": 4,
                                            "env": {"OMP_NUM_THREADS": "1"}}))
    out = tmp_path / "run"
    done = _cli(tmp_path / "state", "run", exp, "--out", str(out))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    doc = json.loads((out / "results.json").read_text())
    rows = {r["label"]: r for r in doc["collectives"]}
    assert set(rows) == {"torch-all_reduce", "torch-all_to_all"}, rows
    ring = rows["torch-all_reduce"]
    assert (ring["algorithm"], ring["bytes"], ring["communicator_size"]) == ("ring", 4194304, 4)
    for row in rows.values():  # what the fabric allows, within what predict and noise allow
        assert 0.6 < row["time_us"] / 1e6 / row["predicted_s"] < 1.8, row
    assert "x pred" in done.stdout and "torch-all_reduce" not in done.stderr


def test_a_ddp_training_reports_its_iterations_and_the_fabric_its_link_bytes(tmp_path):
    argv = ["/usr/bin/python3", str(ROOT / "examples" / "torch_ddp.py"), "--iterations", "3",
            "--layers", "4"]
    exp = _experiment(tmp_path, json.dumps({"argv": argv, "ranks": 4}))
    out = tmp_path / "run"
    done = _cli(tmp_path / "state", "run", exp, "--out", str(out))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    program = json.loads((out / "results.json").read_text())["program"]
    assert sorted(program["iterations"]) == ["0", "1", "2"]
    assert all(t > 0 for t in program["iterations"].values())
    # the gradients' all-reduces crossed the spine: 4 ranks' 4 MB of parameters, ring-wise
    spine = sum(v for k, v in program["links"].items() if k.startswith("spine1->"))
    assert spine > 3 * 1e6, program["links"]


def test_mpirun_reaches_every_host_as_a_node_of_its_own(tmp_path):
    """examples/mpi_allreduce.py through Debian's Open MPI: mpirun on the first host starts
    its daemons on the others through fabriclab-rsh, each a node with its own hostname; the
    ring all-reduce it forced becomes a row beside predict's time on the hosts it names."""
    argv = ["mpirun", "-H", "h1-1,h1-2,h2-1,h2-2", "-np", "4", "--mca",
            "coll_tuned_use_dynamic_rules", "1", "--mca", "coll_tuned_allreduce_algorithm", "4",
            "/usr/bin/python3", str(ROOT / "examples" / "mpi_allreduce.py"), "--size", "4MiB",
            "--iters", "2"]
    exp = _experiment(tmp_path, json.dumps({
        "argv": argv, "ranks": 1, "timeout_s": 300,
        "env": {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}}))
    out = tmp_path / "run"
    done = _cli(tmp_path / "state", "run", exp, "--out", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "4 ranks on 4 nodes: h1-1, h1-2, h2-1, h2-2" in done.stdout
    (row,) = json.loads((out / "results.json").read_text())["collectives"]
    assert (row["label"], row["algorithm"], row["ranks"]) == (
        "mpi-all_reduce", "ring", ["h1_1", "h1_2", "h2_1", "h2_2"])
    assert 0.6 < row["time_us"] / 1e6 / row["predicted_s"] < 1.8, row
    assert not _left()
