"""Integration fixtures: real fabrics (netns, veth, OVS, os-ken), checked for leaks.

Every test under this folder carries the ``integration`` marker (``-m "not integration"``
deselects them) and is skipped, with the reason, when not run as root.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from fabriclab.model import experiment as config
from testbed.fabric.fabric import Fabric
from testbed.runs import leaks
from testbed.runs.leaks import machine_state

ROOT = Path(__file__).resolve().parents[2]


HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    """Mark the tests of this folder only (the hook sees every collected item)."""
    skip = pytest.mark.skip(reason="integration tests need root")
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.integration)
            if os.geteuid() != 0:
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def no_leaks():
    """Every integration test must leave the machine as it found it."""
    before = machine_state()
    yield
    deadline = time.monotonic() + 10
    while True:
        leaked = leaks.leaked(before, machine_state())
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not leaked, f"left behind: {leaked}"


def _not_copied(directory: str, names: list[str]) -> set[str]:
    """copytree ignore: the daemons' unix sockets (only regular files and folders are kept),
    and the files that were gone by the time they were looked at (the fabric is still up: a
    controller's status written through a temporary file renamed into place)."""
    def passed_over(name: str) -> bool:
        try:
            return stat.S_ISSOCK(os.lstat(os.path.join(directory, name)).st_mode)
        except FileNotFoundError:
            return True
    return {n for n in names if n.endswith(".tmp") or passed_over(n)}


def _copy_if_there(src: str, dst: str) -> None:
    """copytree's copy, for a file of a live run directory that may be renamed away first."""
    try:
        shutil.copy2(src, dst)
    except FileNotFoundError:
        pass


@pytest.fixture
def state_dir(tmp_path) -> Path:
    return tmp_path / "state"


def experiment(text: str, datapath: str = "ovs") -> config.Experiment:
    """An experiment from YAML ``text``, on ``datapath`` (merged into its ``emulator``)."""
    import yaml
    data = yaml.safe_load(text)
    emulator = data.setdefault("emulator", {})
    if datapath != "ovs":
        emulator["datapath"] = datapath
    else:  # the text's own choice, else Open vSwitch (the default is auto)
        emulator.setdefault("datapath", "ovs")
    return config.parse(data)


#: a test that runs on each datapath (its ``datapath`` argument)
DATAPATHS = pytest.mark.parametrize("datapath", ["ovs", "ebpf"])


def keep_artifacts(fabric: Fabric, into: Path) -> None:
    """The run directory (logs, controller status) and every qdisc's counters, for a post-mortem."""
    shutil.copytree(fabric.run_dir, into / "run", dirs_exist_ok=True, ignore=_not_copied,
                    copy_function=_copy_if_there)
    (into / "tc.txt").write_text(subprocess.run(
        ["tc", "-s", "qdisc", "show"], capture_output=True, text=True, check=False).stdout)


@pytest.fixture
def make_fabric(state_dir, tmp_path):
    """Build fabrics that are always torn down; keep their logs and tc state in tmp_path."""
    errors: list[str] = []

    def post_mortem(fabric: Fabric) -> None:
        if fabric.record is not None:  # still up (a test may have taken it down itself)
            errors.extend(fabric.controller_status().get("errors", []))
            keep_artifacts(fabric, tmp_path)

    with ExitStack() as stack:
        def _make(exp: config.Experiment) -> Fabric:
            fabric = stack.enter_context(Fabric(exp, state_dir=state_dir))
            stack.callback(post_mortem, fabric)  # runs first: before the fabric goes down
            return fabric

        yield _make
    assert not errors, f"controller errors: {errors}"
