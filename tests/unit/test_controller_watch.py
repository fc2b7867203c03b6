"""The controller's watch waits on a pidfd: also when the run holds more than 1024 descriptors
(128 agents' pipes), where select() cannot."""

import os
import resource
import subprocess
import sys

import pytest

from testbed.fabric.controller import _exited


def test_the_watch_sees_an_exit_past_descriptor_1024():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the descriptor limit here is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = []
    try:
        while not held or held[-1] < 1100:
            held.append(os.open(os.devnull, os.O_RDONLY))
        proc = subprocess.Popen([sys.executable, "-c", "pass"])
        assert _exited(proc, 10.0)  # its pidfd is past 1024
        sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
        try:
            assert not _exited(sleeper, 0.05)
        finally:
            sleeper.kill()
            sleeper.wait()
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
