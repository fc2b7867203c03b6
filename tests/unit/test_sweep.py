"""Sweeps: the cells an experiment's ``sweep`` section expands to, the errors it refuses before
anything runs, and the sweep loop (fabriclab.modes) (a failed cell recorded and passed, --resume keeping
the finished ones, an earlier run's directory refused) with the fabric run replaced."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from fabriclab.model.document import read
from fabriclab.modes import run_sweep
from fabriclab.options import RunRequest
from fabriclab.runner import RunView
from fabriclab.frames import compare_rows
from fabriclab.rundirs import check_out_dir
from testbed.errors import TestbedError

from fabriclab.model import sweep
from fabriclab.model import experiment as xp
from testbed.errors import ConfigError

BASE = {
    "version": 1, "name": "sw",
    "fabric": {"topology": "leaf_spine", "leaves": 2, "spines": 2, "hosts_per_leaf": 2,
               "host_link": {"rate_mbps": 10}, "fabric_link": {"rate_mbps": 10}},
    "workload": {"collectives": [{"op": "all_reduce", "size": "256KiB", "ranks": 4}]},
}


def _with(sweep_section: dict, **extra) -> dict:
    data = copy.deepcopy(BASE)
    data["sweep"] = sweep_section
    data.update(extra)
    return data


def test_the_axes_product_is_every_cell_in_order_with_its_repetitions():
    exp = xp.parse(_with({"axes": {"controller.routing": ["ecmp", "dmodk"],
                                   "workload.collectives[0].size": ["256KiB", "1MiB"]},
                          "repetitions": 2}))
    assert [c.name for c in exp.cells] == [
        "routing=ecmp,size=256KiB,r1", "routing=ecmp,size=256KiB,r2",
        "routing=ecmp,size=1MiB,r1", "routing=ecmp,size=1MiB,r2",
        "routing=dmodk,size=256KiB,r1", "routing=dmodk,size=256KiB,r2",
        "routing=dmodk,size=1MiB,r1", "routing=dmodk,size=1MiB,r2"]
    last = exp.cells[-1]
    assert str(last.experiment.controller.routing) == "dmodk"
    assert last.experiment.workload.jobs[0].collectives[0].schedule.size_bytes == 1 << 20
    assert last.plan.group == "routing=dmodk,size=1MiB" and last.plan.repetition == 2
    assert exp.cells[0].experiment is exp.cells[1].experiment  # repetitions share the parse


def test_axes_with_the_same_last_field_keep_their_whole_paths_and_variants_nest():
    data = _with({"axes": {"fabric.host_link.rate_mbps": [5],
                           "fabric.fabric_link.rate_mbps": [5, 20]}},
                 variants=[{"name": "a", "set": {"controller.routing": "ecmp"}},
                           {"name": "b", "set": {"controller.routing": "dmodk"}}])
    exp = xp.parse(data)
    assert [c.name for c in exp.cells] == [
        "a/fabric.host_link.rate_mbps=5,fabric.fabric_link.rate_mbps=5",
        "a/fabric.host_link.rate_mbps=5,fabric.fabric_link.rate_mbps=20",
        "b/fabric.host_link.rate_mbps=5,fabric.fabric_link.rate_mbps=5",
        "b/fabric.host_link.rate_mbps=5,fabric.fabric_link.rate_mbps=20"]
    assert str(exp.cells[-1].experiment.controller.routing) == "dmodk"
    assert exp.cells[-1].experiment.fabric.fabric_link.rate_mbps == 20
    # an object by its scalar values, events by their actions, anything else by its place
    assert sweep.value_label({"mode": "step"}, 2) == "step"
    assert sweep.value_label({"mode": "local_adaptive", "granularity": "packet"}, 0) == \
        "local_adaptive-packet"
    assert sweep.value_label([], 0) == "none" and sweep.value_label(True, 0) == "true"
    assert sweep.value_label([{"at_s": 1, "action": "down"}, {"at_s": 2, "action": "up"}],
                             1) == "down-up"
    assert sweep.value_label([[1], [2]], 3) == "#3" and sweep.value_label({"a": [1]}, 4) == "#4"


@pytest.mark.parametrize("section,field,words", [
    ({"axes": {"controller.routing": []}}, "sweep.axes.controller.routing", "at least one value"),
    ({"axes": {}}, "sweep.axes", "non-empty"),
    ({"axes": {"fabric.k": [4, 4]}}, "sweep.axes.fabric.k", "listed twice"),
    ({"axes": {"controller.nope": [1]}}, "controller.nope", "unknown key"),
    ({"axes": {"controller.routing": ["ecmp", "bogus"]}}, "controller.routing", "bogus"),
    ({"axes": {"workload.collectives[3].size": ["1MiB"]}}, "sweep.axes.workload.collectives[3].size",
     "does not lead anywhere"),
    # a path through a number, the field removed (null): was AttributeError (the property
    # suite's draw), an internal error
    ({"axes": {"name.x": [None]}}, "sweep.axes.name.x", "does not lead anywhere"),
    ({"axes": {"controller.routing": ["ecmp"]}, "repetitions": 0}, "sweep.repetitions", ""),
])
def test_a_bad_sweep_is_refused_before_anything_runs_naming_the_field(section, field, words):
    with pytest.raises(ConfigError) as err:
        xp.parse(_with(section))
    assert err.value.path == field and words in err.value.message, str(err.value)


def test_pending_and_the_summary_over_repetitions():
    plans = sweep.plan_cells({"axes": {"x": [1, 2]}, "repetitions": 2}, [None])
    assert [p.name for p in sweep.pending(plans, {"x=1,r1", "x=2,r2"})] == ["x=1,r2", "x=2,r1"]
    rows = [{"cell": "x=1", "values": {"x": 1}, "complete": True, "error": None,
             "jobs": [{"label": "ar", "op": "all_reduce", "busbw_GBps": 8.0, "efficiency": 0.8}]},
            {"cell": "x=1", "values": {"x": 1}, "complete": True, "error": None,
             "jobs": [{"label": "ar", "op": "all_reduce", "busbw_GBps": 9.0, "efficiency": 0.9}]},
            {"cell": "x=2", "values": {"x": 2}, "complete": False, "error": "boom", "jobs": []}]
    one, two = sweep.summarize(rows)
    eff = one["jobs"][0]["efficiency"]
    assert eff["mean"] == pytest.approx(0.85) and eff["sd"] == pytest.approx(0.0707, abs=1e-3)
    assert (one["runs"], one["failed"], two["failed"], two["errors"]) == (2, 0, 1, ["boom"])


def _doc(name: str, eff: float, complete: bool = True) -> dict:
    if not complete:  # failed before measuring anything
        return {"experiment": name, "complete": False, "error": "failed",
                "fabric": {"variant": None}, "congestion": {}, "collectives": []}
    return {"experiment": name, "complete": complete, "error": None if complete else "failed",
            "fabric": {"variant": None}, "congestion": {},
            "collectives": [{"job": 0, "repetition": 0, "op": "all_reduce", "algorithm": "ring",
                             "bytes": 262144, "communicator_size": 4,
                             "ranks": ["a", "b", "c", "d"], "time_us": 1e6,
                             "algbw_GBps": eff * 0.01, "busbw_GBps": eff * 0.015,
                             "efficiency": eff, "label": "ar",
                             "flow_end_s": {"p50": 0.5, "p99": 0.9}}]}


def _request(out: Path, resume=False) -> RunRequest:
    return RunRequest(Path("sweep.yaml"), out, out / "state", resume=resume)


def test_the_sweep_goes_on_after_a_failed_cell_and_resume_runs_only_what_is_missing(tmp_path):
    exp = xp.parse(_with({"axes": {"controller.routing": ["ecmp", "dmodk"]}, "repetitions": 2}))
    ran, failures = [], ["routing=dmodk,r1"]  # the cells that fail (once each)
    nexts = []  # each run is told the next one (whether its fabric stays up for it)

    def fake_run_one(req, cell_exp, out, view, variant=None, shared=None, then=None):
        assert shared is not None  # the cells share one pool of fabrics
        nexts.append(then.controller.routing if then is not None else None)
        ran.append(out.name)
        out.mkdir(parents=True, exist_ok=True)
        if out.name in failures:
            failures.remove(out.name)
            (out / "results.json").write_text(json.dumps(_doc("sw", 0.0, complete=False)))
            raise TestbedError("job 0 (all_reduce): agent died")
        doc = _doc("sw", 0.9 if str(cell_exp.controller.routing) == "dmodk" else 0.5)
        (out / "results.json").write_text(json.dumps(doc))
        return read(doc)

    out = tmp_path / "sweep"
    assert run_sweep(_request(out), exp, RunView(), fake_run_one).failed  # a cell failed
    assert ran == ["routing=ecmp,r1", "routing=ecmp,r2", "routing=dmodk,r1", "routing=dmodk,r2"]
    assert nexts == ["ecmp", "dmodk", "dmodk", None]
    doc = json.loads((out / "sweep.json").read_text())
    failed = [c for c in doc["cells"] if not c["complete"]]
    assert [c["name"] for c in failed] == ["routing=dmodk,r1"]
    assert "agent died" in failed[0]["error"]
    summary = {line["cell"]: line for line in doc["summary"]}
    assert summary["routing=ecmp"]["jobs"][0]["efficiency"]["mean"] == pytest.approx(0.5)
    assert summary["routing=dmodk"]["failed"] == 1
    with pytest.raises(ConfigError, match="--resume finishes it, --force overwrites it"):
        check_out_dir(out, resume=False, force=False)
    check_out_dir(out, resume=True, force=False)
    ran.clear()
    assert not run_sweep(_request(out, resume=True), exp, RunView(), fake_run_one).failed
    assert ran == ["routing=dmodk,r1"]  # only the failed cell again
    doc = json.loads((out / "sweep.json").read_text())
    assert all(c["complete"] for c in doc["cells"]) and len(doc["cells"]) == 4
    # compare puts the sweep's cells (means) and a plain run side by side
    single = tmp_path / "single"
    single.mkdir()
    (single / "results.json").write_text(json.dumps(_doc("sw", 0.7)))
    lines = compare_rows([out, single])
    assert [(line["run"].rsplit("/", 1)[-1], line["jobs"][0]["efficiency"], line["jobs"][0]["n"])
            for line in lines] == [("routing=ecmp", pytest.approx(0.5), 2),
                                   ("routing=dmodk", pytest.approx(0.9), 2),
                                   ("single", pytest.approx(0.7), 1)]
    with pytest.raises(ConfigError, match="holds no run"):
        compare_rows([tmp_path])


class _FakeFabric:
    """Records what the pool does with it."""

    log: list = []

    def __init__(self, exp, state_dir):
        self.exp, self.up = exp, False

    def __enter__(self):
        self.up = True
        self.log.append(("build", self.exp.controller.routing))
        return self

    def down(self):
        self.up = False
        self.log.append(("down", self.exp.controller.routing))

    def restart_controller(self, exp):
        self.exp = exp
        self.log.append(("restart", exp.controller.routing))


def test_runs_that_build_the_same_fabric_share_it_with_a_new_controller_each(tmp_path):
    from fabriclab.shared import SharedFabric

    exp = xp.parse(_with({"axes": {"fabric.fabric_link.rate_mbps": [10, 5],
                                   "controller.routing": ["ecmp", "dmodk"]}}))
    cells = [c.experiment for c in exp.cells]
    # the routing and the workload are the run's; a link rate is the fabric's
    assert sweep.fabric_key(cells[0].raw) == sweep.fabric_key(cells[1].raw)
    assert sweep.fabric_key(cells[1].raw) != sweep.fabric_key(cells[2].raw)
    _FakeFabric.log = []
    pool = SharedFabric(tmp_path, build=_FakeFabric)
    for i, cell in enumerate(cells):
        then = cells[i + 1] if i + 1 < len(cells) else None
        with pool.use(cell, keep=then is not None and pool.can_share(cell, then)) as fabric:
            assert fabric.exp is cell and fabric.up
    assert _FakeFabric.log == [("build", "ecmp"), ("restart", "dmodk"), ("down", "dmodk"),
                               ("build", "ecmp"), ("restart", "dmodk"), ("down", "dmodk")]
    assert (pool.builds, pool.reuses, pool.fabric) == (2, 2, None)
    # a run that failed leaves nothing up for the next one
    _FakeFabric.log = []
    with pytest.raises(RuntimeError):
        with pool.use(cells[0], keep=True):
            raise RuntimeError("agent died")
    assert _FakeFabric.log == [("build", "ecmp"), ("down", "ecmp")] and pool.fabric is None


def test_a_fabric_with_pfc_or_failures_is_never_shared(tmp_path):
    from fabriclab.shared import SharedFabric

    pfc = xp.parse(_with({"axes": {"controller.routing": ["ecmp", "dmodk"]}},
                         fabric={**BASE["fabric"], "queue": {"size_kb": 128},
                                 "traffic_classes": {"dscp_to_priority": {26: 3}},
                                 "pfc": {"priorities": [3]}}))
    failing = xp.parse(_with({"axes": {"controller.routing": ["ecmp", "dmodk"]}},
                             failures=[{"at_s": 1, "link": ["leaf1", "spine1"],
                                        "action": "down"}]))
    for exp in (pfc, failing):
        a, b = (c.experiment for c in exp.cells)
        pool = SharedFabric(tmp_path, build=_FakeFabric)
        assert not pool.can_share(a, b)
        _FakeFabric.log = []
        with pool.use(a, keep=True):
            pass
        assert not pool.reusable(b)
        with pool.use(b, keep=False):
            pass
        assert [step for step, _ in _FakeFabric.log] == ["build", "down", "build", "down"]
        pool.close()


def test_sweep_values_that_clean_into_one_folder_name_are_refused():
    import yaml

    from fabriclab.model import experiment as config
    from testbed.errors import ConfigError

    data = yaml.safe_load(
        "version: 1\nname: s\nfabric: {topology: fat_tree, k: 4}\n"
        "workload: {collectives: [{op: all_reduce, size: 1MiB, label: x}]}\n"
        "sweep:\n  axes:\n    workload.collectives[0].label: [a/b, a_b]\n")
    with pytest.raises(ConfigError) as err:
        config.parse(data)
    assert err.value.path == "sweep.axes" and "share the folder" in str(err.value)


def test_resume_refuses_a_complete_run_of_another_experiment(tmp_path):
    """``--resume`` keeps a complete run only when it ran the same experiment (the SHA-256 of
    its data, recorded in results.json); another one is named, not silently kept."""
    import json

    from fabriclab.model.rundir import experiment_document
    from fabriclab.rundirs import is_complete
    from testbed.errors import ConfigError

    raw = {"version": 1, "name": "a", "fabric": {"topology": "fat_tree", "k": 4}}
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"complete": True,
                                "experiment_sha256": experiment_document(raw)["sha256"]}))
    assert is_complete(path, raw)
    with pytest.raises(ConfigError) as err:
        is_complete(path, {**raw, "name": "b"})
    assert err.value.path == "--resume" and "different experiment" in str(err.value)
