"""Experiment files: shipped ones validate; each bad file fails with its field path."""

from pathlib import Path

import jsonschema
import pytest

from fabriclab.model import experiment as config
from testbed.errors import ConfigError
from testbed.model.spec import DEFAULT_RATE_MBPS, Requirement

ROOT = Path(__file__).resolve().parents[2]
BAD = sorted((Path(__file__).parent / "bad").glob("*.yaml"))


@pytest.mark.parametrize("path", sorted((ROOT / "experiments").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_experiments_validate(path):
    exp = config.load(path)
    assert exp.topology.counts()["hosts"] >= 2


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.stem)
def test_bad_file_names_the_field(path):
    expected = path.read_text().splitlines()[0].removeprefix("# expect: ")
    with pytest.raises(ConfigError) as err:
        config.load(path)
    assert expected in str(err.value)


def test_schema_is_valid_and_rejects_unknown_keys_everywhere():
    schema = config.schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    objects = [schema] + list(schema["$defs"].values())
    assert all(o.get("additionalProperties") is False for o in objects if o.get("type") == "object")


def test_defaults_and_overrides():
    exp = config.parse({"version": 1, "fabric": {"topology": "leaf_spine", "leaves": 2,
                                                  "spines": 1, "hosts_per_leaf": 3,
                                                  "fabric_link": {"rate_mbps": 400},
                                                  "queue": {"size_packets": 50}}})
    assert exp.fabric.host_link.rate_mbps == DEFAULT_RATE_MBPS
    assert exp.fabric.fabric_link.rate_mbps == 400
    assert (exp.fabric.queue_kb, exp.fabric.queue_packets) == (None, 50)
    assert exp.controller.routing == "ecmp" and exp.fabric.mtu == 9000
    assert exp.controller.ecmp_seed == "per_switch"
    assert exp.emulator.vswitchd_instances == "auto" and exp.emulator.fidelity == "strict"
    assert Requirement("fabric.queue", "qdisc", "pfifo") in exp.requirements()


def test_routing_seed_and_emulator_settings_are_checked():
    base = {"version": 1, "fabric": {"topology": "fat_tree", "k": 4}}
    exp = config.parse({**base, "controller": {"routing": "dmodk", "ecmp_seed": "shared",
                                               "ecmp_selection": "dp_hash"},
                        "emulator": {"vswitchd_instances": 3, "fidelity": "warn"}})
    assert (exp.controller.routing, exp.controller.ecmp_seed) == ("dmodk", "shared")
    assert exp.controller.ecmp_selection == "dp_hash"
    assert (exp.emulator.vswitchd_instances, exp.emulator.fidelity) == (3, "warn")
    for section, key, value in (("controller", "routing", "adaptive-ish"),
                                ("controller", "spray_weights", "random"),
                                ("controller", "ecmp_seed", "random"),
                                ("controller", "ecmp_selection", "random"),
                                ("emulator", "vswitchd_instances", 0),
                                ("emulator", "fidelity", "loose")):
        with pytest.raises(ConfigError) as err:
            config.parse({**base, section: {key: value}})
        assert err.value.path == f"{section}.{key}"


def test_netem_settings_are_requirements():
    exp = config.parse({"version": 1, "fabric": {"topology": "fat_tree", "k": 4,
                                                  "fabric_link": {"delay_us": 50}}})
    assert Requirement("fabric.fabric_link.delay_us", "qdisc", "netem") in exp.requirements()


def test_several_problems_are_all_listed():
    with pytest.raises(ConfigError) as err:
        config.parse({"version": 3, "fabric": {"topology": "fat_tree", "k": 4, "x": 1}})
    assert "fabric.x: unknown key" in str(err.value) and "version: must be 1" in str(err.value)


def test_missing_file():
    with pytest.raises(ConfigError, match="cannot read"):
        config.load("/nonexistent/experiment.yaml")


def test_the_schema_and_the_typed_specs_agree():
    from testbed.model.congestion import EcnMode
    from testbed.model.spec import (
        Backend,
        EcmpSeed,
        EcmpSelection,
        Fidelity,
        Granularity,
        Load,
        Routing,
        TcpCongestion,
    )
    from traffic.workloads.patterns import PATTERNS
    from traffic.workloads.training import TrainingSpec

    defs = config.schema()["$defs"]
    routing = defs["controller"]["properties"]["routing"]["oneOf"]
    assert routing[0]["enum"] == list(Routing) == routing[1]["properties"]["mode"]["enum"]
    assert routing[1]["properties"]["granularity"]["enum"] == list(Granularity)
    assert routing[1]["properties"]["load"]["enum"] == list(Load)
    assert defs["controller"]["properties"]["ecmp_seed"]["enum"] == list(EcmpSeed)
    assert defs["controller"]["properties"]["ecmp_selection"]["enum"] == list(EcmpSelection)
    assert defs["emulator"]["properties"]["fidelity"]["enum"] == list(Fidelity)
    assert defs["emulator"]["properties"]["backend"]["enum"] == list(Backend)
    assert defs["ecn_entry"]["properties"]["mode"]["enum"] == list(EcnMode)
    entry = defs["workload"]["properties"]["collectives"]["items"]["properties"]
    from traffic.transports.options import (
        DELIVERY_MODES,
        ENTROPY_CHOICES,
        ROCE_CONGESTION_CONTROLS,
    )
    assert entry["congestion_control"]["enum"] == [*TcpCongestion, *ROCE_CONGESTION_CONTROLS]
    transport = defs["transport"]["else"]["properties"]
    assert transport["congestion_control"]["enum"] == list(ROCE_CONGESTION_CONTROLS)
    assert transport["delivery"]["enum"] == list(DELIVERY_MODES)
    assert transport["entropy"]["enum"] == list(ENTROPY_CHOICES)
    training = defs["workload"]["properties"]["training"]["properties"]
    assert set(training) == set(TrainingSpec.keys()) | {"ranks", "preset"}
    for name in PATTERNS:
        assert name in defs["workload"]["properties"]["collectives"]["items"]["properties"][
            "pattern"]["description"]


def test_the_workload_is_parsed_once_and_typed(tmp_path, monkeypatch):
    import traffic.workloads.workload as workload

    (tmp_path / "t.jsonl").write_text('{"op": "all_reduce", "size": "1MiB", "ranks": 4}\n')
    (tmp_path / "e.yaml").write_text("version: 1\nfabric: {topology: fat_tree, k: 4}\n"
                                     "workload: {trace: t.jsonl}\n")
    reads = []
    real_read = workload._read
    monkeypatch.setattr(workload, "_read", lambda *a: reads.append(a) or real_read(*a))
    exp = config.load(tmp_path / "e.yaml")
    (job,) = exp.workload.jobs
    assert exp.workload.collective_count == 1 and job.collectives[0].schedule.ranks == 4
    assert exp.workload.batches() == [[job]] and len(reads) == 1


def test_a_trace_line_is_checked_by_the_schema(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"op": "all_reduce", "size": "1MiB", "ranks": "four"}\n')
    (tmp_path / "e.yaml").write_text("version: 1\nfabric: {topology: fat_tree, k: 4}\n"
                                     "workload: {trace: t.jsonl}\n")
    with pytest.raises(ConfigError) as err:
        config.load(tmp_path / "e.yaml")
    assert err.value.path == "t.jsonl line 1.ranks" and "must be of type" in err.value.message


def test_variants_are_whole_experiments_with_their_overrides():
    exp = config.parse({"version": 1, "name": "base",
                        "fabric": {"topology": "fat_tree", "k": 4,
                                   "host_link": {"ecn": {"mode": "step"}}},
                        "workload": {"collectives": [{"op": "all_reduce", "size": "1MiB"}]},
                        "variants": [
                            {"name": "lossy", "set": {"fabric.host_link.ecn": None}},
                            {"name": "big", "set": {"workload.collectives[0].size": "4MiB",
                                                    "controller.routing": "dmodk"}},
                            {"name": "same", "set": {}}]})
    assert exp.variant is None and exp.fabric.marks_ecn
    lossy, big, same = exp.variants
    assert (lossy.variant, lossy.fabric.marks_ecn, lossy.name) == ("lossy", False, "base")
    assert big.workload.jobs[0].collectives[0].schedule.size_bytes == 4 << 20
    assert big.controller.routing == "dmodk" and exp.controller.routing == "ecmp"
    assert same.fabric == exp.fabric and same.fabric_summary()["variant"] == "same"
    assert not lossy.variants  # variants do not nest


@pytest.mark.parametrize("variant,path,text", [
    ({"name": "v", "set": {"fabric.k": 5}}, "fabric.k", "in variant 'v', variants[0]"),
    ({"name": "v", "set": {"fabric.host_link.speed": 5}}, "fabric.host_link.speed",
     "unknown key"),
    ({"name": "v", "set": {"workload.collectives[3].size": 5}},
     "variants[0].set.workload.collectives[3].size", "does not lead anywhere"),
    ({"name": "v", "set": {"fabric..k": 5}}, "variants[0].set.fabric..k", "cannot read"),
])
def test_a_bad_variant_names_its_field_and_itself(variant, path, text):
    with pytest.raises(ConfigError) as err:
        config.parse({"version": 1, "fabric": {"topology": "fat_tree", "k": 4},
                      "workload": {"collectives": [{"op": "all_reduce", "size": 64}]},
                      "variants": [variant]})
    assert err.value.path == path and text in err.value.message, err.value


def test_repeated_variant_names_are_refused():
    with pytest.raises(ConfigError) as err:
        config.parse({"version": 1, "fabric": {"topology": "fat_tree", "k": 4},
                      "variants": [{"name": "a", "set": {}}, {"name": "a", "set": {}}]})
    assert err.value.path == "variants"


def test_failures_resolve_to_links_in_time_order():
    from fabriclab.model.experiment import parse
    exp = parse({"version": 1, "fabric": {"topology": "fat_tree", "k": 4},
                 "workload": {"collectives": [{"op": "all_reduce", "size": 64, "ranks": 2}]},
                 "failures": [{"at_s": 5, "switch": "core1", "action": "down"},
                              {"at_s": 1, "link": ["agg1_1", "core2"], "action": "down"}]})
    first, second = exp.failures
    assert (first.at_s, first.target, first.links) == (1.0, "link agg1_1-core2",
                                                      (("agg1_1", "core2"),))
    assert second.target == "switch core1" and len(second.links) == 4  # one per pod
    half = parse({"version": 1, "fabric": {"topology": "fat_tree", "k": 4},
                  "workload": {"collectives": [{"op": "all_reduce", "size": 64, "ranks": 2}]},
                  "failures": [{"at_s": 1, "link": ["agg1_1", "core2"], "action": "degrade",
                                "rate_factor": 0.5}]}).failures[0]
    assert (half.action, half.rate_factor) == ("degrade", 0.5)


def test_samples_too_few_to_tell_a_move_off_say_so_instead_of_never():
    from testbed.plan.failplan import move_off_unmeasured
    every_ms = [1.0 + i * 0.001 for i in range(200)]
    assert move_off_unmeasured(every_ms, 1.0) is None
    assert move_off_unmeasured(every_ms[:70], 1.0) is None  # 69 ms: enough to tell
    why = move_off_unmeasured(every_ms[:20], 1.0)  # the next event came 20 ms in
    assert why.startswith("20 samples over 19 ms") and "55 ms" in why
    assert "0 samples" in move_off_unmeasured([0.5, 0.9], 1.0)


@pytest.mark.parametrize("item,path,text", [
    ({"at_s": 1, "link": ["agg1_1", "core9"], "action": "down"}, "failures[0].link[1]",
     "no node 'core9'"),
    ({"at_s": 1, "link": ["edge1_1", "core1"], "action": "down"}, "failures[0].link",
     "share no link"),
    ({"at_s": 1, "switch": "h1_1_1", "action": "down"}, "failures[0].switch", "no switch"),
    ({"at_s": -1, "switch": "core1", "action": "down"}, "failures[0].at_s", ""),
    ({"at_s": 1, "switch": "core1", "action": "flap"}, "failures[0].action", ""),
    ({"at_s": 1, "switch": "core1", "action": "degrade"}, "failures[0].rate_factor",
     "share of the rate left"),
    ({"at_s": 1, "switch": "core1", "action": "down", "rate_factor": 0.5},
     "failures[0].rate_factor", "only a degrade"),
    ({"at_s": 1, "switch": "core1", "action": "degrade", "rate_factor": 0},
     "failures[0].rate_factor", ""),
])
def test_bad_failures_name_the_field(item, path, text):
    from fabriclab.model.experiment import parse
    with pytest.raises(ConfigError) as err:
        parse({"version": 1, "fabric": {"topology": "fat_tree", "k": 4},
               "workload": {"collectives": [{"op": "all_reduce", "size": 64, "ranks": 2}]},
               "failures": [item]})
    assert err.value.path == path, err.value
    assert text in err.value.message


def test_fail_targets_are_checked_against_the_running_fabric():
    from testbed.plan.failplan import live_links
    from testbed.model.builders import fat_tree

    topo = fat_tree(4)
    assert live_links(topo, ["agg1_1", "core1"]) == ("link agg1_1-core1", (("agg1_1", "core1"),))
    what, links = live_links(topo, ["core2"])
    assert what == "switch core2" and len(links) == 4
    for target, text in ((["agg1_1", "core9"], "no node 'core9'"),
                         (["edge1_1", "core1"], "share no link"),
                         (["h1_1_1"], "no switch"), (["a", "b", "c"], "two nodes")):
        with pytest.raises(ConfigError) as err:
            live_links(topo, target)
        assert err.value.path == "target" and text in err.value.message


def test_a_controller_of_ones_own_is_an_app_file_or_a_remote_address(tmp_path):
    app = tmp_path / "apps" / "mine.py"
    app.parent.mkdir()
    app.write_text("# an os-ken app\n")
    exp_file = tmp_path / "exp.yaml"
    exp_file.write_text("version: 1\nfabric: {topology: fat_tree, k: 4}\n"
                        "controller: {app: apps/mine.py, settle_s: 1}\n")
    ctl = config.load(exp_file).controller
    assert (ctl.app, ctl.own, ctl.kind, ctl.settle_s) == (str(app), False, "app mine.py", 1.0)
    remote = config.parse({"version": 1, "fabric": {"topology": "fat_tree", "k": 4},
                           "controller": {"remote": "10.0.0.5:6653"}}).controller
    assert (remote.remote_address, remote.kind) == (("10.0.0.5", 6653), "remote 10.0.0.5:6653")
    assert config.parse({"version": 1, "fabric": {"topology": "fat_tree", "k": 4}}
                        ).controller.kind == "fabriclab (ecmp)"


@pytest.mark.parametrize("controller,path,text", [
    ({"app": "nowhere.py"}, "controller.app", "no Python file"),
    ({"app": "x.py", "remote": "h:1"}, "controller.remote", "exclude each other"),
    ({"remote": "h:1", "routing": "dmodk"}, "controller.routing", "that controller decides"),
    ({"remote": "h:1", "restart": True}, "controller.restart", "that controller decides"),
    ({"remote": "6653"}, "controller.remote", "is not HOST:PORT"),
    ({"remote": "h:99999"}, "controller.remote", "is not HOST:PORT"),
    ({"remote": "h:1", "tls": True}, "controller.tls", "not a remote one"),
    ({"settle_s": -1}, "controller.settle_s", ""),
])
def test_a_bad_controller_of_ones_own_names_the_field(controller, path, text):
    with pytest.raises(ConfigError) as err:
        config.parse({"version": 1, "fabric": {"topology": "fat_tree", "k": 4},
                      "controller": controller})
    assert err.value.path == path and text in err.value.message, err.value


def test_a_cluster_refuses_a_controller_of_ones_own():
    from testbed.model.partition import check_cluster_spec

    exp = config.parse({"version": 1, "fabric": {"topology": "fat_tree", "k": 4},
                        "controller": {"remote": "10.0.0.5:6653"}})
    with pytest.raises(ConfigError) as err:
        check_cluster_spec(exp)
    assert err.value.path == "controller.remote" and "cluster" in err.value.message


def test_capture_targets_resolve_to_one_interface_and_its_namespace():
    from testbed.model.builders import fat_tree
    from testbed.plan.capture import capture_point

    topo = fat_tree(4)
    uplink = capture_point(topo, ["edge1_1", "agg1_1"])
    assert (uplink.ifname, uplink.host) == ("edge1_1-eth3", None)
    assert capture_point(topo, ["agg1_1", "edge1_1"]).ifname == "agg1_1-eth1"
    nic = capture_point(topo, ["h1_1_1", "edge1_1"])
    assert (nic.ifname, nic.host) == ("h1_1_1-eth0", "h1_1_1")
    alone = capture_point(topo, ["h1_1_2"])
    assert (alone.ifname, alone.host) == ("h1_1_2-eth0", "h1_1_2")
    port = capture_point(topo, ["core2-eth3"])
    assert (port.ifname, port.host, port.what) == ("core2-eth3", None,
                                                    "port core2-eth3 of core2 (core2-eth3)")
    for target, text in ((["edge1_1"], "edge1_1 has 4 links: name one (edge1_1 h1_1_1"),
                         (["core9"], "no node or port 'core9'"),
                         (["edge1_1", "core1"], "share no link"),
                         (["edge1_1", "x9"], "no node 'x9'"), ([], "give a link")):
        with pytest.raises(ConfigError) as err:
            capture_point(topo, target)
        assert err.value.path == "target" and text in err.value.message, err.value.message


def test_throughput_before_during_and_after_a_failure():
    from testbed.plan.failplan import SAMPLE_S, rate_mbps, throughput_around

    # 10 Mbit/s (1.25 MB/s) for 4 s, nothing for 0.5 s after the failure at 4 s, then 5 Mbit/s
    def delivered(t: float) -> float:
        if t <= 4:
            return 1.25e6 * t
        if t <= 4.5:
            return 5e6
        return 5e6 + 0.625e6 * (t - 4.5)
    samples = [(round(i * SAMPLE_S, 2), int(delivered(i * SAMPLE_S))) for i in range(41)]
    doc = throughput_around(samples, 4.0)
    assert doc["before_mbps"] == pytest.approx(10, rel=0.01)
    assert doc["during_mbps"] == pytest.approx(2.5, rel=0.01)  # half the second at 5
    assert doc["after_mbps"] == pytest.approx(5, rel=0.01)
    assert doc["during_vs_before"] == pytest.approx(0.25, abs=0.01)
    assert doc["after_vs_before"] == pytest.approx(0.5, abs=0.01)
    assert doc["windows_s"] == {"before": [1.0, 4.0], "during": [4.0, 5.0],
                                "after": [5.0, 8.0]}
    # windows clipped to what was sampled; too little sampled gives None, not a number
    early = throughput_around(samples, 0.1)
    assert early["before_mbps"] is None and early["during_vs_before"] is None
    assert early["during_mbps"] == pytest.approx(10, rel=0.01)
    late = throughput_around(samples, 9.9)
    assert late["after_mbps"] is None and late["during_mbps"] is None
    assert rate_mbps(samples[:1], 0, 1) is None


def test_hosts_cut_off_by_down_ports_or_dead_switches():
    from testbed.plan.failplan import unreachable_pairs
    from testbed.model.builders import fat_tree

    topo = fat_tree(4)
    hosts = ["h1_1_1", "h1_1_2", "h2_1_1", "h3_1_1"]
    assert unreachable_pairs(topo, {}, set(), hosts) == []
    # one core gone, or one uplink: other paths remain
    assert unreachable_pairs(topo, {}, {"core1"}, hosts) == []
    up1 = topo.find_link("edge1_1", "agg1_1")
    assert unreachable_pairs(topo, {up1.end("edge1_1").ifname: False}, set(), hosts) == []
    # both of edge1_1's uplinks: its hosts still reach each other, not the rest
    up2 = topo.find_link("edge1_1", "agg1_2")
    down = {up1.end("agg1_1").ifname: False, up2.end("edge1_1").ifname: False}
    assert unreachable_pairs(topo, down, set(), hosts) == [("h1_1_1", "h2_1_1"),
                                                          ("h1_1_1", "h3_1_1")]
    # a dead edge switch cuts its hosts off from everyone, each other included
    assert unreachable_pairs(topo, {}, {"edge2_1"}, hosts) == [("h1_1_1", "h2_1_1")]
    # a host link whose switch end lost its carrier
    h = topo.host_link("h3_1_1")
    assert unreachable_pairs(topo, {h.end("edge3_1").ifname: False}, set(), hosts) == [
        ("h1_1_1", "h3_1_1")]
    from testbed.plan.failplan import cut_off_reason
    assert cut_off_reason(topo, {}, {"core1"}, hosts) is None
    assert cut_off_reason(topo, {h.end("edge3_1").ifname: False}, {"core1"}, hosts) == (
        f"h1_1_1 cannot reach h3_1_1; links down: {h.name}; switches without vswitchd: core1")


def test_a_job_fails_only_once_its_ranks_stay_cut_off_for_the_grace(monkeypatch):
    from traffic.agents import runner

    clock = [100.0]
    monkeypatch.setattr(runner.time, "monotonic", lambda: clock[0])

    class Fabric:
        reason: str | None = None

        def cut_off(self, hosts):
            return self.reason

    fabric = Fabric()
    watch = runner.CutOffWatch(fabric, ["a", "b"], grace_s=3.0)
    assert watch.check() is None
    fabric.reason = "a cannot reach b"
    assert watch.check() is None  # just now
    clock[0] += 2.0
    assert watch.check() is None
    fabric.reason = None  # the link came back: the grace starts again next time
    clock[0] += 0.5
    assert watch.check() is None
    fabric.reason = "a cannot reach b"
    assert watch.check() is None
    clock[0] += 3.0
    assert watch.check() == "ranks cut off for 3 s: a cannot reach b"


def test_a_job_fails_at_once_when_a_fabric_service_dies_during_it():
    from traffic.agents import runner

    class Fabric:
        service_errors = ["pfc agent: OSError: an earlier run's"]

        def cut_off(self, hosts):
            return None

    fabric = Fabric()
    watch = runner.CutOffWatch(fabric, ["a", "b"])
    assert watch.check() is None  # what failed before the job is not the job's
    fabric.service_errors.append("pfc agent: OSError: [Errno 105] No buffer space available")
    assert watch.check() == ("a fabric service failed: pfc agent: OSError: [Errno 105] No "
                             "buffer space available")


def test_the_ebpf_datapath_takes_every_feature():
    fabric = {"topology": "leaf_spine", "leaves": 2, "spines": 1, "hosts_per_leaf": 1}
    base = {"version": 1, "fabric": fabric, "emulator": {"datapath": "ebpf"}}
    assert config.parse(base).emulator.datapath == "ebpf"
    # a cluster, PFC, adaptive routing and failures
    assert config.parse({**base, "cluster": {"address": "10.0.0.1:6379"}}).cluster is not None
    assert config.parse({**base, "fabric": {**fabric, "traffic_classes": {
        "dscp_to_priority": {26: 3}}, "pfc": {"priorities": [3]}}}).pfc is not None
    assert config.parse({**base, "controller": {"routing": "adaptive"},
                         "workload": {"collectives": [{"op": "all_reduce", "size": 64}]},
                         "failures": [{"at_s": 1, "link": ["leaf1", "spine1"],
                                       "action": "down"}]}).failures


def test_every_file_the_schema_names_exists():
    """The schema's descriptions point readers at docs and modules: none of them is gone."""
    import re

    root = Path(__file__).resolve().parents[2]
    text = (root / "fabriclab" / "schema" / "experiment.schema.json").read_text()
    named = set(re.findall(r"\b((?:docs|fabriclab|testbed|traffic|controllers|telemetry|"
                           r"examples|experiments)/[\w/.-]+\.(?:md|py|yaml|json|c))\b", text))
    assert named and not [p for p in named if not (root / p).exists()]
