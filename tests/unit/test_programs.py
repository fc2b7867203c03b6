"""A user's program as a workload: ``workload.program`` parsed into ranks with torchrun's
environment, and run (traffic/agents/programs.py) by a spawner of local processes (the
fabric's and ``launch``'s enter host namespaces; the rest is the same): ranks start together,
their output lands in ranks/, the first failing rank or the timeout ends the others, a
program not found says so, and a launcher killed outright leaves no rank behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from fabriclab.model import experiment as xp
from fabriclab.model.document import ProgramRun, read
from testbed.errors import ConfigError
from testbed.model.builders import leaf_spine
from testbed.poll import wait_for
from traffic.agents import programs
from traffic.workloads.program import parse_program
from traffic.workloads.workload import parse_workload

TOPO = leaf_spine(2, 1, 2)  # h1_1 h1_2 h2_1 h2_2
ADDRESSES = {h.name: h.ip for h in TOPO.hosts}


def _local(host: str, argv: list[str], kwargs: dict) -> subprocess.Popen:
    return subprocess.Popen(argv, start_new_session=True, **kwargs)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(10)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_ranks_get_torchruns_environment_and_their_own_argv():
    prog = parse_program(TOPO, {"argv": ["bench", "--out", "r{rank}-{host}.txt"],
                                "ranks": 4, "per_host": 2, "env": {"OMP_NUM_THREADS": 1},
                                "master_port": 29511}, "/exp")
    assert prog.hosts == ("h1_1", "h1_2") and prog.world_size == 4
    ranks = prog.ranks(ADDRESSES)
    assert [(r.rank, r.host, r.env["LOCAL_RANK"], r.env["GROUP_RANK"]) for r in ranks] == [
        (0, "h1_1", "0", "0"), (1, "h1_1", "1", "0"), (2, "h1_2", "0", "1"),
        (3, "h1_2", "1", "1")]
    third = ranks[3]
    assert third.argv == ("bench", "--out", "r3-h1_2.txt")
    assert {k: third.env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                      "MASTER_PORT", "FABRICLAB_HOST", "OMP_NUM_THREADS")} == {
        "RANK": "3", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": ADDRESSES["h1_1"], "MASTER_PORT": "29511", "FABRICLAB_HOST": "h1_2",
        "OMP_NUM_THREADS": "1"}
    assert third.env["FABRICLAB_HOST_ADDR"] == ADDRESSES["h1_2"]
    named = parse_program(TOPO, {"argv": ["x"], "hosts": ["h2_2", "h1_1"], "cwd": "sub"},
                          "/exp")
    assert named.hosts == ("h2_2", "h1_1") and named.cwd == "/exp/sub"
    assert parse_program(TOPO, {"argv": ["x"]}).hosts == ("h1_1", "h1_2", "h2_1", "h2_2")


@pytest.mark.parametrize("raw, field", [
    ({"argv": []}, "workload.program.argv"),
    ({"argv": [""]}, "workload.program.argv[0]"),
    ({"argv": ["x"], "per_host": 0}, "workload.program.per_host"),
    ({"argv": ["x"], "ranks": 3, "per_host": 2}, "workload.program.ranks"),
    ({"argv": ["x"], "ranks": 2, "hosts": ["h1_1"]}, "workload.program"),
    ({"argv": ["x"], "hosts": ["h9_9"]}, "workload.program.hosts[0]"),
    ({"argv": ["x"], "env": {"A=B": "1"}}, "workload.program.env"),
    ({"argv": ["x"], "env": {"A": True}}, "workload.program.env.A"),
    ({"argv": ["x"], "timeout_s": 0}, "workload.program.timeout_s"),
    ({"argv": ["x"], "master_port": 80}, "workload.program.master_port")])
def test_a_bad_program_is_refused_naming_the_field(raw, field):
    with pytest.raises(ConfigError) as err:
        parse_program(TOPO, raw)
    assert err.value.path == field, err.value


def test_a_program_alone_is_a_workload_and_the_schema_takes_it():
    wl = parse_workload(TOPO, {"program": {"argv": ["true"], "ranks": 2}})
    assert wl.jobs == () and wl.program.hosts == ("h1_1", "h1_2")
    exp = xp.parse({"version": 1, "fabric": {"topology": "leaf_spine", "leaves": 2,
                                             "spines": 1, "hosts_per_leaf": 2},
                    "workload": {"program": {"argv": ["true"], "per_host": 2}}})
    assert exp.workload.program.world_size == 8
    with pytest.raises(ConfigError, match="argv"):
        xp.parse({"version": 1, "fabric": {"topology": "leaf_spine", "leaves": 2},
                  "workload": {"program": {"ranks": 2}}})


def _run(tmp_path, argv, ranks=3, timeout_s=60.0, echo=None):
    prog = parse_program(TOPO, {"argv": argv, "ranks": ranks, "timeout_s": timeout_s})
    return prog, programs.run_program(prog, ADDRESSES, _local, _stop, tmp_path, echo=echo)


def test_the_ranks_start_together_and_their_output_lands_in_ranks(tmp_path):
    said = []
    code = ("import os, sys, time; print(repr(time.time()), os.environ['RANK'], "
            "os.environ['WORLD_SIZE']); print('note', file=sys.stderr)")
    prog, out = _run(tmp_path, [sys.executable, "-c", code], echo=said.append)
    assert out.error is None and [r.exit_code for r in out.ranks] == [0, 0, 0]
    starts = []
    for rank in range(3):
        t, r, n = (tmp_path / "ranks" / f"{rank}.out").read_text().split()
        assert (r, n) == (str(rank), "3")
        assert (tmp_path / "ranks" / f"{rank}.err").read_text() == "note\n"
        starts.append(float(t))
    # each started at the common moment (its Python's start-up after it), none before it
    assert min(starts) >= out.started_unix_s
    assert max(starts) - min(starts) < 1.0
    assert said == [(tmp_path / "ranks" / "0.out").read_text().strip()]  # rank 0 streamed
    assert all(r.end_unix_s >= out.started_unix_s for r in out.ranks) and out.time_s > 0


def test_the_first_rank_that_fails_ends_the_others_naming_it(tmp_path):
    script = 'if [ "$RANK" = 1 ]; then echo "bad input" >&2; exit 3; fi; sleep 60'
    began = time.monotonic()
    _, out = _run(tmp_path, ["sh", "-c", script])
    assert time.monotonic() - began < 30  # not the sleep's 60 s
    assert out.error.startswith("rank 1 on h1_2 exited with 3 (the other ranks were ended)")
    assert "bad input" in out.error
    assert [(r.rank, r.exit_code, r.ended) for r in out.ranks] == [
        (0, None, "ended"), (1, 3, "exited"), (2, None, "ended")]


def test_a_rank_past_the_timeout_ends_and_a_missing_program_says_so(tmp_path):
    _, out = _run(tmp_path / "late", ["sh", "-c", '[ "$RANK" = 0 ] || exit 0; sleep 60'],
                  timeout_s=1.0)
    assert "rank(s) 0 still running 1 s after the start" in out.error
    assert [r.ended for r in out.ranks] == ["timed out", "exited", "exited"]
    _, missing = _run(tmp_path / "missing", ["no-such-program-fabriclab"], ranks=1)
    assert "exited with 127" in missing.error and "program not found" in missing.error


def test_a_launcher_killed_outright_leaves_no_rank_behind(tmp_path):
    """The ranks' supervisor ends its process group when its parent dies, even by SIGKILL:
    the program and what it started."""
    pids = tmp_path / "pids"
    launcher = subprocess.Popen([sys.executable, "-c", f"""
import subprocess, sys, time
from traffic.agents import programs
from traffic.workloads.program import parse_program
from testbed.model.builders import leaf_spine
topo = leaf_spine(2, 1, 2)
prog = parse_program(topo, {{"argv": ["sh", "-c", "sleep 60 & echo $$ $! >> {pids}; wait"],
                            "ranks": 2}})
programs.run_program(prog, {{h.name: h.ip for h in topo.hosts}},
                     lambda h, argv, kw: subprocess.Popen(argv, start_new_session=True, **kw),
                     lambda p: p.kill(), "{tmp_path}")
"""], cwd=os.getcwd())
    try:
        wait_for(lambda: pids.exists() and len(pids.read_text().split()) == 4, 30,
                   "both ranks and their children")
        started = [int(p) for p in pids.read_text().split()]
        assert all(_alive(p) for p in started)
    finally:
        launcher.kill()
        launcher.wait()
    wait_for(lambda: not any(_alive(p) for p in started), 15, "the ranks to end")


def test_a_programs_run_reads_back_from_results_json():
    run = ProgramRun(["python3", "bench.py"], 2, 1, ["h1_1", "h1_2"], 100.0, 2.5)
    doc = read({"experiment": "p", "complete": True, "program": run.to_json()})
    assert doc.program == run


def test_what_a_program_reports_becomes_rows_beside_the_prediction():
    """``#fabriclab`` lines of rank 0's: NCCL-tests' figures from the program's own time,
    and predict's time for the same collective on its hosts (a reverse ring: gloo's)."""
    from fabriclab.model.prediction import program_rows
    from traffic.workloads.program import reported

    text = ("warming up\n"
            "#fabriclab op=all_reduce bytes=4194304 time_us=900000 algorithm=ring "
            "order=reverse label=gloo\n"
            "#fabriclab op=all_to_all bytes=4194304 time_us=700000.5\n"
            "#fabriclab op=all_reduce bytes=many time_us=1\n"
            "#fabriclab op=reduce bytes=8 time_us=1\n"
            "#fabriclab bytes=8 time_us=1\n")
    reports, unread, iterations = reported(text + "#fabriclab iteration=2 time_s=0.5\n")
    assert iterations == {"2": 0.5}
    assert [(r.op, r.bytes, r.algorithm, r.reverse) for r in reports] == [
        ("all_reduce", 4194304, "ring", True), ("all_to_all", 4194304, None, False)]
    assert unread == ["rank 0's stdout line 4: invalid literal for int() with base 10: 'many'",
                      "rank 0's stdout line 5: op=reduce is not one of all_reduce, "
                      "reduce_scatter, all_gather, all_to_all, broadcast, send_recv",
                      "rank 0's stdout line 6: no op="]
    exp = xp.parse({"version": 1, "fabric": {"topology": "leaf_spine", "leaves": 2,
                                             "spines": 1, "hosts_per_leaf": 2,
                                             "host_link": {"rate_mbps": 100},
                                             "fabric_link": {"rate_mbps": 100}},
                    "controller": {"routing": "dmodk"},
                    "workload": {"program": {"argv": ["x"], "ranks": 4}}})
    ring, a2a = program_rows(exp, exp.workload.program, reports, 0)
    assert (ring.label, ring.algorithm, ring.communicator_size, ring.ranks) == (
        "gloo", "ring", 4, ["h1_1", "h1_2", "h2_1", "h2_2"])
    assert ring.busbw_GBps == pytest.approx(4194304 / 0.9 / 1e9 * 1.5)
    assert ring.efficiency == pytest.approx(ring.busbw_GBps * 8e3 / 100)
    # 4 MiB ring all-reduce on 100 Mbit/s: 2 (n-1)/n x 4 MiB at the payload rate, ~0.5 s
    assert 0.5 < ring.predicted_s < 0.6 and ring.ideal_s < ring.predicted_s
    assert a2a.label == "program all_to_all" and a2a.predicted_s > 0
    assert (ring.repetition, a2a.repetition, ring.job) == (0, 1, 0)


def test_hosts_have_hostnames_a_launcher_takes_and_etc_hosts_names_both():
    from testbed.model.builders import fat_tree
    from testbed.model.topology import hostname

    assert (hostname("h1_1_1"), hostname("s1g2"), hostname("h1.x-y")) == (
        "h1-1-1", "s1g2", "h1.x-y")
    lines = fat_tree(4).etc_hosts().splitlines()
    assert lines[:2] == ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    assert "10.1.1.1\th1_1_1 h1-1-1" in lines and len(lines) == 2 + 16


def test_the_remote_shell_finds_a_host_by_name_or_hostname_and_refuses_others(
        tmp_path, monkeypatch, capsys):
    """fabriclab-rsh as Open MPI calls it (ssh's options, then the host, then the command):
    the host's namespaces entered through nsenter, the command run by sh -c."""
    import json as json_

    from fabriclab.cli import rsh

    hosts = tmp_path / "hosts.json"
    hosts.write_text(json_.dumps({"h1_1": 4242}))
    monkeypatch.setenv("FABRICLAB_HOSTS_FILE", str(hosts))
    ran = []
    monkeypatch.setattr(rsh.os, "execvp", lambda prog, argv: ran.append(argv))
    for host in ("h1_1", "h1-1", "root@h1-1"):
        rsh.main(["-x", "-o", "BatchMode=yes", host, "PATH=/usr/bin", ";", "orted", "-mca", "x"])
    assert ran == [["nsenter", "-t", "4242", "-n", "-m", "-u", "--", "sh", "-c",
                    "PATH=/usr/bin ; orted -mca x"]] * 3
    assert rsh.main(["h9_9", "true"]) == 255 and "no host 'h9_9'" in capsys.readouterr().err
    monkeypatch.delenv("FABRICLAB_HOSTS_FILE")
    assert rsh.main(["h1_1", "true"]) == 255
    assert "FABRICLAB_HOSTS_FILE is not set" in capsys.readouterr().err


def test_a_program_gets_a_remote_shell_for_mpi_launchers(tmp_path):
    from fabriclab.programs import launcher_env

    env = launcher_env(tmp_path, {"h1_1": 11, "h1_2": 12})
    assert env["OMPI_MCA_plm_rsh_agent"] == env["HYDRA_LAUNCHER_EXEC"]
    assert env["OMPI_MCA_plm_rsh_agent"].endswith("fabriclab-rsh")
    assert json.loads((tmp_path / "ranks" / "hosts.json").read_text()) == {"h1_1": 11,
                                                                            "h1_2": 12}
