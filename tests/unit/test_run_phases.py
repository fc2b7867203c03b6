"""A run of an experiment, phase by phase, on a fake fabric (tests/unit/fakefabric.py): the
results document at each step, a failing job, an interrupt; and the contracts a run relies
on: every fabric keeps :class:`RunningFabric`, a cluster machine's handle keeps its actor's
methods."""

from __future__ import annotations

import inspect
import json
import time

import pytest

from fabriclab.model import experiment as xp
from fabriclab.model.document import VERSION, read
from fabriclab.runner import run_experiment
from fabriclab.shared import SharedFabric
from fabriclab.signals import Terminated
from testbed.cluster.coordinator import ClusterFabric
from testbed.cluster.machines import MachineHandle
from testbed.cluster.agent import MachineAgent
from testbed.errors import TestbedError
from testbed.contract import RunningFabric
from testbed.fabric.fabric import Fabric
from traffic.agents.runner import JobOutcome
from traffic.measure.flows import FlowResult
from traffic.measure.results import CollectiveResult

from tests.unit.fakefabric import FakeFabric

EXPERIMENT = {"version": 1, "name": "phases",
              "fabric": {"topology": "leaf_spine", "leaves": 2, "spines": 2,
                         "hosts_per_leaf": 2, "host_link": {"rate_mbps": 10},
                         "fabric_link": {"rate_mbps": 10}},
              "workload": {"collectives": [
                  {"op": "all_reduce", "size": 1024, "repetitions": 2, "label": "ar"},
                  {"op": "all_to_all", "size": 2048, "label": "a2a"}]}}


def _protocol_members() -> dict[str, object]:
    """Every member of RunningFabric's roles (its protocol bases in testbed.contract)."""
    members: dict[str, object] = {}
    for role in RunningFabric.__mro__:
        if role.__module__ != RunningFabric.__module__:
            continue
        for name, value in vars(role).items():
            if not name.startswith("_") or name in ("__enter__", "__exit__"):
                members.setdefault(name, value)
        for name in getattr(role, "__annotations__", {}):
            members.setdefault(name, None)
    members.pop("_is_protocol", None)
    return members


def test_the_roles_together_are_the_running_fabric():
    """Each role's members are the running fabric's; no member is in no role."""
    from testbed import contract

    roles = (contract.FabricDescription, contract.TrafficFabric, contract.TelemetryFabric,
             contract.FailureFabric, contract.FabricLifecycle)
    assert set(RunningFabric.__mro__) >= set(roles)
    assert {"spawn", "congestion", "set_links", "restart_controller", "run_dir", "spec"} <= \
        set(_protocol_members())


@pytest.mark.parametrize("cls", [Fabric, ClusterFabric, FakeFabric])
def test_every_fabric_keeps_the_running_fabric_contract(cls, tmp_path):
    spec = xp.parse(EXPERIMENT)
    instance = (ClusterFabric(spec, "127.0.0.1:1", tmp_path) if cls is ClusterFabric
                else cls(spec, state_dir=tmp_path))
    drift = []
    for name, member in _protocol_members().items():
        if member is None:  # a data attribute
            try:
                inspect.getattr_static(instance, name)
            except AttributeError:
                drift.append(f"{name}: missing")
            continue
        theirs = inspect.getattr_static(cls, name, None)
        if isinstance(member, property):
            if not isinstance(theirs, property):
                drift.append(f"{name}: not a property")
            continue
        if theirs is None or not callable(theirs):
            drift.append(f"{name}: missing")
            continue
        want = list(inspect.signature(member).parameters.values())[1:]
        have = inspect.signature(theirs).parameters
        takes_any = any(p.kind == p.VAR_KEYWORD for p in have.values())
        for p in want:
            if p.kind in (p.VAR_POSITIONAL,):
                continue
            if p.kind == p.VAR_KEYWORD:
                if not takes_any:
                    drift.append(f"{name}: no **{p.name}")
                continue
            if p.name not in have:
                drift.append(f"{name}: no parameter {p.name}")
            elif p.default is not p.empty and have[p.name].default is p.empty:
                drift.append(f"{name}: {p.name} has no default")
        extra = [q for q in have.values() if q.name not in {p.name for p in want} | {"self"}
                 and q.default is q.empty and q.kind not in (q.VAR_POSITIONAL, q.VAR_KEYWORD)]
        if extra:
            drift.append(f"{name}: requires {', '.join(q.name for q in extra)}")
    assert not drift, f"{cls.__name__} drifted from RunningFabric: {drift}"


def test_the_contract_check_sees_a_drift(tmp_path):
    class Broken(FakeFabric):
        def congestion(self, other=None):  # the netlink parameter renamed
            return {}

    with pytest.raises(AssertionError, match="congestion: no parameter netlink"):
        test_every_fabric_keeps_the_running_fabric_contract(Broken, tmp_path)


def test_a_machine_handle_offers_every_method_of_its_actor_with_its_parameters():
    def public(cls) -> dict:
        return {n: f for n, f in vars(cls).items() if callable(f) and not n.startswith("_")}

    from fabriclab.cellagent import CellAgent

    actor = {**public(MachineAgent), **public(CellAgent)}  # (--parallel's actors run cells)
    handle = public(MachineHandle)
    assert set(handle) == set(actor) - {"probe"}  # the cluster probes each actor itself
    for name, method in handle.items():
        want = [p for p in inspect.signature(actor[name]).parameters if p != "self"]
        have = [p for p in inspect.signature(method).parameters if p not in ("self",)]
        assert have[:len(want)] == want, name
        assert set(have[len(want):]) <= {"timeout_s"}, name


def _runner(calls: list, fail_batch: int | None = None, raise_error=None):
    """A batch runner whose jobs move 1 MB each over the fake fabric's ports."""
    def run(fabric, batch, start_at):
        calls.append([job.index for job in batch])
        if raise_error is not None and len(calls) - 1 == fail_batch:
            raise raise_error
        out = []
        for job in batch:
            if len(calls) - 1 == fail_batch:
                out.append(JobOutcome(job, error=TestbedError("rank h1_1 stopped")))
                continue
            fabric.sent_bytes += 1_000_000
            rows = tuple(CollectiveResult(c.op, "ring", list(c.hosts), c.schedule.size_bytes,
                                          0.5, 0.01, 0.015, 0.4, 0.8, {"p50": 0.2, "p99": 0.4},
                                          c.label,
                                          flows=[FlowResult("h1_1", "h2_1", 0, 100, 0.0, 0.3)])
                         for c in job.collectives)
            out.append(JobOutcome(job, rows))
        return out
    return run


def _pool(tmp_path, fabrics: list) -> SharedFabric:
    def build(exp, state_dir):
        fabrics.append(FakeFabric(exp, state_dir))
        return fabrics[-1]
    return SharedFabric(tmp_path / "state", build=build)


def test_a_run_keeps_its_document_and_files_through_every_phase(tmp_path):
    exp = xp.parse(EXPERIMENT)
    fabrics, calls = [], []
    out = tmp_path / "run"
    typed = run_experiment(exp, out, tmp_path / "state", shared=_pool(tmp_path, fabrics),
                           runner=_runner(calls))
    doc = typed.to_json()  # as results.json holds it, and as it reads back
    assert read(json.loads((out / "results.json").read_text())) == typed
    assert typed.version == VERSION and doc["version"] == VERSION
    fabric = fabrics[0]
    assert calls == [[0], [1]]  # one job per batch, in order
    assert fabric.log[0] == "up" and fabric.log[-1] == "down" and fabric.monitor.stopped
    saved = json.loads((out / "results.json").read_text())
    assert saved == doc and doc["complete"] and not doc.get("error")
    assert [r["label"] for r in doc["collectives"]] == ["ar", "ar", "a2a"]
    assert doc["controller"]["routing"] == "ecmp" and doc["controller"]["links_down"] == []
    # 2 MB spread over every switch port of a 10 Mbit/s fabric, over the measurement's time
    util = doc["congestion"]["utilization"]
    assert set(util) == {"leaf->spine", "spine->leaf", "leaf->host"}
    assert all(0 < v["max"] == v["mean"] for v in util.values())
    assert doc["fidelity"]["verdict"] == "ok"
    assert {"bring_up", "measurement", "teardown", "total"} <= set(doc["timings_s"])
    for name in ("experiment.json", "environment.json", "collectives.csv", "flows.csv",
                 "timeline.json", "logs/controller.log"):
        assert (out / name).is_file(), name
    assert len((out / "collectives.csv").read_text().splitlines()) == 4  # header + 3 rows
    assert json.loads((out / "experiment.json").read_text())["sha256"] == \
        doc["experiment_sha256"]


def test_a_failing_job_fails_the_run_and_keeps_what_was_measured(tmp_path):
    exp = xp.parse(EXPERIMENT)
    fabrics, calls = [], []
    out = tmp_path / "run"
    with pytest.raises(TestbedError, match=r"job 1 \(all_to_all .*\): rank h1_1 stopped"):
        run_experiment(exp, out, tmp_path / "state", shared=_pool(tmp_path, fabrics),
                       runner=_runner(calls, fail_batch=1))
    doc = json.loads((out / "results.json").read_text())
    assert not doc["complete"] and "rank h1_1 stopped" in doc["error"]
    assert [r["label"] for r in doc["collectives"]] == ["ar", "ar"]  # the first batch's
    assert fabrics[0].log[-1] == "down"


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt("ctrl-c"), Terminated("signal 15")])
def test_an_interrupt_tears_down_and_is_recorded(tmp_path, interrupt):
    exp = xp.parse(EXPERIMENT)
    fabrics, calls = [], []
    out = tmp_path / "run"
    with pytest.raises(type(interrupt)):
        run_experiment(exp, out, tmp_path / "state", shared=_pool(tmp_path, fabrics),
                       runner=_runner(calls, fail_batch=0, raise_error=interrupt))
    doc = json.loads((out / "results.json").read_text())
    assert doc["error"] == f"{type(interrupt).__name__}: {interrupt}"
    assert fabrics[0].log[-1] == "down" and "total" in doc["timings_s"]


def test_sigterm_is_not_swallowed_by_except_exception():
    with pytest.raises(Terminated):
        try:
            raise Terminated("signal 15")
        except Exception:  # noqa: BLE001 - what the test is about
            pytest.fail("except Exception caught SIGTERM's Terminated")


def test_failure_times_count_from_the_traffic_start_not_from_the_agents(tmp_path):
    """The agents take a second or more to start and connect before the ranks start together
    at the batch's ``start_at``: an event 0.1 s into the workload comes 0.1 s after that,
    not while the agents connect."""
    exp = xp.parse({**EXPERIMENT, "failures": [
        {"at_s": 0.1, "link": ["leaf1", "spine1"], "action": "degrade", "rate_factor": 0.5}]})
    fabrics, calls, seen = [], [], {}
    run = _runner(calls)

    def traffic(fabric, batch, start_at):
        if not seen:  # the first batch: nothing applied before its traffic starts
            seen["start_at"], seen["called"] = start_at, time.time()
            time.sleep(max(0.0, start_at - time.time() - 0.05))
            seen["before"] = [e for e in fabric.log if e.startswith("set_rates")]
            deadline = time.monotonic() + 10
            while not any(e.startswith("set_rates") for e in fabric.log) \
                    and time.monotonic() < deadline:
                time.sleep(0.01)
            seen["applied"] = time.time()
        return run(fabric, batch, start_at)

    doc = run_experiment(exp, tmp_path / "run", tmp_path / "state",
                         shared=_pool(tmp_path, fabrics), runner=traffic).to_json()
    assert seen["start_at"] - seen["called"] >= 1.0  # the agents' time to start and connect
    assert seen["before"] == []
    assert seen["start_at"] + 0.1 <= seen["applied"] + 0.01, seen
    (event,) = doc["failures"]
    assert 0.1 <= event["applied_s"] < 1.0, event
