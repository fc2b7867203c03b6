"""The Python API's pure parts and the pytest plugin's choices, without a fabric: results
read back typed (a run, variants, an older results.json), what run() refuses, and the
fixture's experiment file named by marker, option or ini, or a usage error naming all three."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import fabriclab
from fabriclab import api
from testbed.errors import ConfigError

ROW = {"job": 0, "repetition": 1, "label": "", "op": "all_reduce", "algorithm": "ring",
       "ranks": ["h1", "h2"], "bytes": 1024, "time_us": 500.0, "algbw_GBps": 0.002,
       "busbw_GBps": 0.002, "ideal_s": 0.0004, "efficiency": 0.8,
       "flow_end_s": {"p50": 0.0003}, "start_unix_s": 1.0, "communicator_size": 2}


def test_the_package_offers_the_api_by_name():
    assert fabriclab.load is api.load and fabriclab.run is api.run and fabriclab.up is api.up
    with pytest.raises(AttributeError):
        fabriclab.nothing_of_that_name  # noqa: B018


def test_results_read_back_typed(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps(
        {"experiment": "x", "complete": True, "collectives": [ROW]}))
    res = api.Results.read(tmp_path)
    (c,) = res.collectives
    assert (res.experiment, res.complete, res.error) == ("x", True, None)
    assert (c.op, c.time_us, c.busbw_GBps, c.ranks, c.flow_end_s.p50) == (
        "all_reduce", 500.0, 0.002, ["h1", "h2"], 0.0003)
    assert res.document.collectives[0].start_unix_s == 1.0  # the whole document, typed


def test_variants_and_older_results_read_back(tmp_path):
    old = {k: v for k, v in ROW.items() if k not in ("time_us", "algbw_GBps", "busbw_GBps")}
    old |= {"duration_s": 0.5, "algbw_gbps": 0.016, "busbw_gbps": 0.016}
    for name, doc in (("a", {"experiment": "x", "complete": True, "collectives": [ROW]}),
                      ("b", {"experiment": "x", "complete": False, "error": "boom",
                             "collectives": [old]})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(doc))
    res = api.Results.read(tmp_path)
    assert list(res.runs) == ["a", "b"] and not res.complete and res.error == "b: boom"
    assert res.runs["b"].collectives[0].time_us == pytest.approx(5e5)
    assert res.runs["b"].collectives[0].busbw_GBps == pytest.approx(0.002)
    with pytest.raises(ConfigError, match="no results"):
        api.Results.read(tmp_path / "a" / "nothing")


def test_run_needs_an_experiment_from_a_file():
    from fabriclab.model import experiment as xp

    exp = xp.parse({"version": 1, "fabric": {"topology": "fat_tree", "k": 4},
                    "workload": {"collectives": [{"op": "all_reduce", "size": 64}]}})
    with pytest.raises(ConfigError) as err:
        api.run(exp)
    assert err.value.path == "experiment" and "fabriclab.load(path)" in err.value.message


def _pytest(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), *args, str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)


def test_the_plugin_takes_the_file_from_marker_option_or_ini(tmp_path):
    (tmp_path / "test_it.py").write_text(
        "import pytest\nfrom fabriclab.pytest_plugin import experiment_path\n\n"
        "@pytest.mark.fabriclab('by_marker.yaml')\n"
        "def test_marker(request):\n"
        "    assert experiment_path(request).name == 'by_marker.yaml'\n\n"
        "def test_option(request):\n"
        "    assert experiment_path(request).name == 'by_option.yaml'\n")
    done = _pytest(tmp_path, "--fabriclab-experiment", "by_option.yaml")
    assert "2 passed" in done.stdout, done.stdout + done.stderr
    (tmp_path / "pytest.ini").write_text("[pytest]\nfabriclab_experiment = by_ini.yaml\n")
    done = _pytest(tmp_path)
    assert "1 failed, 1 passed" in done.stdout and "by_ini.yaml" in done.stdout


def test_the_fixture_without_an_experiment_says_how_to_name_one(tmp_path):
    (tmp_path / "test_it.py").write_text("def test_it(fabric):\n    pass\n")
    done = _pytest(tmp_path)
    assert done.returncode != 0
    assert "@pytest.mark.fabriclab('FILE'), --fabriclab-experiment FILE" in done.stdout + \
        done.stderr


def test_fail_returns_once_the_controller_lists_the_link_down_and_restore_once_it_does_not():
    """Fabric.fail/restore wait for fabriclab's controller to take the link into its routes
    (its status's links_down), time out naming the link, and do not wait on a controller
    that keeps no such status (a user's app)."""
    from testbed.model.builders import leaf_spine

    class Running:
        def __init__(self, statuses):
            self.topo = leaf_spine(2, 2, 1)
            self.statuses, self.reads, self.sets = list(statuses), 0, []

        def set_links(self, pairs, up):
            self.sets.append((sorted(pairs), up))

        def controller_status(self):
            self.reads += 1
            return self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]

    fabric = api.Fabric.__new__(api.Fabric)
    name = leaf_spine(2, 2, 1).find_link("leaf1", "spine1").name
    fabric.running = Running([{"links_down": []}, {"links_down": []}, {"links_down": [name]}])
    fabric.fail("leaf1", "spine1")
    assert fabric.running.reads == 3 and fabric.running.sets == [([("leaf1", "spine1")], False)]
    fabric.running = Running([{"links_down": [name]}, {"links_down": []}])
    fabric.restore("leaf1", "spine1")
    fabric.running = Running([{}])  # a user's controller: nothing to wait for
    fabric.fail("leaf1", "spine1")
    assert fabric.running.reads == 1
    fabric.running = Running([{"links_down": []}])
    with pytest.raises(api.TestbedError, match=f"controller to see {name} down"):
        fabric._await_controller({name}, up=False, timeout_s=0.2)
