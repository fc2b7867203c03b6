"""What a cluster machine's actor runs for whoever calls it: a fabric plan's processes only."""

from __future__ import annotations

import sys

import pytest

from testbed.errors import TestbedError
from testbed.plan.remote import checked_argv

PY = "/opt/venv/bin/python3"


@pytest.mark.parametrize("argv, want", [
    ([sys.executable, "-m", "traffic.agents.agent", "job-0.json", "h1_1_1"],
     [PY, "-m", "traffic.agents.agent", "job-0.json", "h1_1_1"]),
    (["python3", "-m", "traffic.agents.udpflow", "recv", "10.0.1.1", "5000", "--idle-s", "2"],
     [PY, "-m", "traffic.agents.udpflow", "recv", "10.0.1.1", "5000", "--idle-s", "2"]),
    (["iperf3", "-c", "10.0.1.2", "-p", "5201", "-J"], ["iperf3", "-c", "10.0.1.2", "-p", "5201",
                                                        "-J"]),
    (["ss", "-Hltn", "sport = :5201"], ["ss", "-Hltn", "sport = :5201"]),
])
def test_a_plans_processes_are_run_with_the_actors_own_python(argv, want):
    assert checked_argv(argv, PY) == want


@pytest.mark.parametrize("argv, says", [
    (["/bin/sh", "-c", "id"], "refused to run '/bin/sh'"),
    (["bash"], "refused to run 'bash'"),
    ([sys.executable, "-c", "import os"], "only the modules"),
    ([sys.executable, "-m", "http.server"], "only the modules"),
    (["iperf3", "--logfile", "/etc/passwd"], "paths and long arguments"),
    ([sys.executable, "-m", "traffic.agents.agent", "../../etc/shadow", "h1"], "paths"),
    (["ss", "x" * 300], "paths and long arguments"),
    ([], "not a list"), ("iperf3 -s", "not a list"), ([1, 2], "not a list"),
    (["fping"] + ["-q"] * 100, "not a list"),
])
def test_anything_else_is_refused_by_name(argv, says):
    with pytest.raises(TestbedError) as err:
        checked_argv(argv, PY)
    assert says in str(err.value)
