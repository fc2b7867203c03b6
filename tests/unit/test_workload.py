"""Workload sections: sizes, rank placement, and every bad input named before anything is built."""

from pathlib import Path

import pytest

from fabriclab.model import experiment as config
from testbed.errors import ConfigError
from testbed.model.builders import fat_tree
from traffic.workloads.workload import parse_size, place_ranks

BASE = {"version": 1, "fabric": {"topology": "fat_tree", "k": 4}}


def _exp(*collectives, **workload):
    return config.parse({**BASE, "workload": {"collectives": list(collectives), **workload}})


def test_sizes_with_units():
    assert parse_size(4096, "s") == 4096
    assert parse_size("16MiB", "s") == 16 << 20
    assert parse_size("1.5 KB", "s") == 1500
    assert parse_size("1GiB", "s") == 1 << 30


def test_placements():
    topo = fat_tree(4)
    hosts = [h.name for h in topo.hosts]
    assert place_ranks(topo, 4, "r") == tuple(hosts[:4])
    assert place_ranks(topo, {"count": 4, "placement": "strided"}, "r") == tuple(hosts[::4])
    rnd = place_ranks(topo, {"count": 5, "placement": "random", "seed": 3}, "r")
    assert rnd == place_ranks(topo, {"count": 5, "placement": "random", "seed": 3}, "r")
    assert len(set(rnd)) == 5
    assert place_ranks(topo, ["h2_1_1", "h1_1_1"], "r") == ("h2_1_1", "h1_1_1")


def test_a_workload_becomes_jobs_with_repetitions():
    exp = _exp({"op": "all_reduce", "size": "1MiB", "ranks": 8, "repetitions": 3},
               {"op": "all_to_all", "size": 65536, "ranks": ["h1_1_1", "h4_2_2"]},
               connections=4, timeout_s=30)
    jobs = exp.workload.jobs
    assert [len(j.collectives) for j in jobs] == [3, 1]
    assert jobs[0].collectives[0].schedule.algorithm == "ring"
    assert (jobs[0].connections, jobs[0].timeout_s) == (4, 30.0)


@pytest.mark.parametrize("entry,path,text", [
    ({"op": "allreduce", "size": 1024}, "workload.collectives[0].op", "unknown op 'allreduce'"),
    ({"op": "all_reduce", "size": 1024, "ranks": ["h1_1_1", "h9_9_9"]},
     "workload.collectives[0].ranks[1]", "no host 'h9_9_9'"),
    ({"op": "all_reduce", "size": 1024, "ranks": ["h1_1_1"]},
     "workload.collectives[0].ranks", "at least 2 ranks"),
    ({"op": "all_reduce", "size": 1024, "ranks": 1},
     "workload.collectives[0].ranks", "at least 2 ranks"),
    ({"op": "all_reduce", "size": 0}, "workload.collectives[0].size", "> 0"),
    ({"op": "all_reduce", "size": -5}, "workload.collectives[0].size", "> 0"),
    ({"op": "all_reduce", "size": "12 parsecs"}, "workload.collectives[0].size",
     "cannot read size"),
    ({"op": "all_reduce"}, "workload.collectives[0].size", "must be a size"),
    ({"op": "all_reduce", "size": 8, "ranks": {"count": 4, "placement": "scattered"}},
     "workload.collectives[0].ranks.placement", "unknown placement"),
    ({"op": "all_reduce", "size": 8, "repetitions": 0},
     "workload.collectives[0].repetitions", ">= 1"),
    ({"op": "all_reduce", "size": 8, "colour": "red"}, "workload.collectives[0].colour",
     "unknown key"),
    ({"op": "all_reduce", "size": 8, "transport": "rocev2", "dcqcn": "cx9"},
     "workload.collectives[0].dcqcn", "cx9"),
    ({"op": "all_reduce", "size": 8, "transport": {"kind": "rocev2", "rccc": True}},
     "workload.collectives[0].transport.rccc", "not a setting of rocev2"),
    ({"op": "all_reduce", "size": 8, "transport": {"kind": "uet", "delivery": "xyz"}},
     "workload.collectives[0].transport.delivery", "xyz"),
    ({"op": "all_reduce", "size": 8, "transport": {"rccc": True}},
     "workload.collectives[0].transport.kind", "required"),
])
def test_bad_workloads_name_the_field(entry, path, text):
    with pytest.raises(ConfigError) as err:
        _exp(entry)
    assert err.value.path == path, err.value
    assert text in err.value.message


def test_the_dcqcn_profile_is_workload_wide_and_overridable_per_entry():
    exp = _exp({"op": "all_reduce", "size": 64, "ranks": 2, "transport": "rocev2"},
               {"op": "all_reduce", "size": 64, "ranks": 2, "transport": "rocev2",
                "dcqcn": "connectx"})
    assert [j.dcqcn for j in exp.workload.jobs] == ["paper", "connectx"]


def test_a_transport_object_carries_its_kinds_settings_and_the_workloads_is_the_default():
    from traffic.transports.options import TransportOptions

    exp = _exp({"op": "all_reduce", "size": 64, "ranks": 2},
               {"op": "all_reduce", "size": 64, "ranks": 2,
                "transport": {"kind": "uet", "rccc": True, "nscc": False, "delivery": "rod"}},
               {"op": "all_reduce", "size": 64, "ranks": 2, "transport": "rocev2"},
               transport={"kind": "uet", "rccc": True, "spray": False})
    jobs = exp.workload.jobs
    assert [j.transport for j in jobs] == ["uet", "uet", "rocev2"]
    assert jobs[0].transport_options == TransportOptions(rccc=True) and jobs[0].spray is False
    assert jobs[1].transport_options == TransportOptions(rccc=True, nscc=False, delivery="rod")
    assert jobs[2].transport_options == TransportOptions()
    hpcc = _exp({"op": "all_reduce", "size": 64, "ranks": 2, "transport": "rocev2",
                 "congestion_control": "hpcc"}).workload.jobs[0]
    assert hpcc.transport_options.congestion_control == "hpcc"
    assert hpcc.congestion_control is None
    with pytest.raises(ConfigError) as err:
        _exp({"op": "all_reduce", "size": 64, "ranks": 2, "congestion_control": "swift"})
    assert err.value.path == "workload.collectives[0].congestion_control"


def test_concurrent_entries_form_batches():
    from traffic.workloads.workload import batches

    exp = _exp({"op": "all_reduce", "size": 64, "ranks": 2},
               {"op": "all_reduce", "size": 64, "ranks": 2, "concurrent": True},
               {"op": "all_gather", "size": 64, "ranks": 4},
               {"op": "all_to_all", "size": 64, "ranks": 3, "concurrent": True},
               {"op": "broadcast", "size": 64, "ranks": 3, "concurrent": True})
    assert [[j.index for j in b] for b in batches(list(exp.workload.jobs))] == [[0, 1], [2, 3, 4]]
    with pytest.raises(ConfigError) as err:
        _exp({"op": "all_reduce", "size": 64, "concurrent": True})
    assert err.value.path == "workload.collectives[0].concurrent"


TRACE = """# a replayed job
{"op": "all_reduce", "size": "1MiB", "ranks": 4}

{"op": "all_to_all", "size": 65536, "ranks": 4, "concurrent": true, "t_s": 0.5}
"""


def test_trace_and_nccl_log_replay_become_jobs(tmp_path):
    from traffic.workloads.workload import batches

    (tmp_path / "job.jsonl").write_text(TRACE)
    nccl = Path(__file__).resolve().parent / "data" / "nccl"
    for name in ("allreduce-2ranks.log", "sendrecv-2ranks.log"):
        (tmp_path / name).write_text((nccl / name).read_text())
    exp_file = tmp_path / "exp.yaml"
    exp_file.write_text("version: 1\nfabric: {topology: fat_tree, k: 4}\n"
                        "workload: {trace: job.jsonl, nccl_log: allreduce-2ranks.log}\n")
    jobs = config.load(exp_file).workload.jobs  # paths relative to the experiment file
    assert [j.collectives[0].op for j in jobs] == ["all_reduce", "all_to_all"] + ["all_reduce"] * 3
    assert [[j.index for j in b] for b in batches(list(jobs))] == [[0, 1], [2], [3], [4]]
    assert jobs[1].not_before_s == 0.5
    assert [j.collectives[0].schedule.size_bytes for j in jobs[2:]] == [256, 948736, 1546240]
    exp_file.write_text("version: 1\nfabric: {topology: fat_tree, k: 4}\n"
                        "workload: {nccl_log: sendrecv-2ranks.log}\n")
    jobs = config.load(exp_file).workload.jobs
    assert {j.collectives[0].op for j in jobs} == {"send_recv"}


@pytest.mark.parametrize("text,path,message", [
    ('{"op": "all_reduce", "size": 64}\n{"op": "all_reduce", size: 64}\n', "t.jsonl line 2",
     "not JSON"),
    ('{"op": "all_reduce", "size": 64, "when": 3}\n', "t.jsonl line 1.when", "unknown key"),
    ('{"op": "all_reduce", "size": 64, "t_s": -1}\n', "t.jsonl line 1.t_s", ">= 0"),
    ('[1, 2]\n', "t.jsonl line 1", "one JSON object"),
    ('{"op": "all_gatherv", "size": 64}\n', "t.jsonl line 1.op", "unknown op"),
    ('{"op": "all_reduce", "size": 0}\n', "t.jsonl line 1.size", "> 0"),
    ("# only a comment\n", "t.jsonl", "no collectives"),
])
def test_malformed_trace_lines_are_reported_with_their_number(tmp_path, text, path, message):
    (tmp_path / "t.jsonl").write_text(text)
    exp_file = tmp_path / "exp.yaml"
    exp_file.write_text("version: 1\nfabric: {topology: fat_tree, k: 4}\n"
                        "workload: {trace: t.jsonl}\n")
    with pytest.raises(ConfigError) as err:
        config.load(exp_file)
    assert err.value.path == path and message in err.value.message


def test_a_missing_trace_file_is_named(tmp_path):
    exp_file = tmp_path / "exp.yaml"
    exp_file.write_text("version: 1\nfabric: {topology: fat_tree, k: 4}\n"
                        "workload: {trace: nope.jsonl}\n")
    with pytest.raises(ConfigError) as err:
        config.load(exp_file)
    assert err.value.path == "workload.trace" and "cannot read nope.jsonl" in err.value.message


def test_background_flows_from_patterns():
    from traffic.workloads.patterns import pattern_pairs

    topo = fat_tree(4)
    assert pattern_pairs(topo, "incast", fan_in=3) == [("h1_1_2", "h1_1_1"), ("h1_2_1", "h1_1_1"),
                                                        ("h1_2_2", "h1_1_1")]
    exp = _exp({"op": "flows", "pattern": "incast", "fan_in": 4, "size": "1MiB"},
               {"op": "flows", "pattern": "permutation", "seed": 3, "size": 4096,
                "concurrent": True})
    incast, perm = exp.workload.jobs
    sched = incast.collectives[0].schedule
    assert incast.collectives[0].hosts[1] == "h1_1_1"
    assert sched.received_by(1) == 4 << 20 and sched.steps == 1
    assert len(perm.collectives[0].hosts) == 16 and perm.concurrent
    assert len(perm.collectives[0].schedule.transfers) == 16


@pytest.mark.parametrize("entry,path,text", [
    ({"op": "flows", "size": 64}, "workload.collectives[0].pattern", "needs a pattern"),
    ({"op": "flows", "pattern": "shuffle", "size": 64}, "workload.collectives[0].pattern",
     "unknown pattern"),
    ({"op": "flows", "pattern": "incast", "fan_in": 16, "size": 64},
     "workload.collectives[0].pattern", "fan_in must be between 1 and 15"),
])
def test_bad_flow_entries(entry, path, text):
    with pytest.raises(ConfigError) as err:
        _exp(entry)
    assert err.value.path == path and text in err.value.message


def test_training_iteration_phases():
    from traffic.workloads import training

    raw = {"layers": 4, "hidden": 256, "seq_len": 128, "micro_batches": 2, "tp": 2, "pp": 2,
           "dp": 2, "params": 8_000_000, "compute_ms": 8, "iterations": 1}
    phases = training.phases(training.TrainingSpec(**raw))
    assert {p.iteration for p in phases} == {0}
    tp_phases = [p for p in phases if "tp all_reduce" in p.label]
    # 2 all-reduces per layer of the stage (2 layers), fwd and bwd, 2 stages, 2 micro-batches
    assert len(tp_phases) == 2 * 2 * 2 * 2 * 2
    act = 128 * 1 * 256 * 2
    assert {p.schedule.size_bytes for p in tp_phases} == {act}
    assert {p.schedule.communicator_size for p in tp_phases} == {2}
    assert tp_phases[0].gap_s == pytest.approx(0.008 / 4)
    sends = [p for p in phases if "pp send_recv" in p.label]
    assert len(sends) == 2 * 2 and all(len(p.schedule.transfers) == 4 for p in sends)
    (dp_phase,) = [p for p in phases if "dp all_reduce" in p.label]
    assert dp_phase.schedule.size_bytes == 8_000_000 // 4 * 4
    # every rank of every DP group sends 2(n-1)/n of the gradient: n = 2 -> all of it once
    assert all(dp_phase.schedule.sent_by(r) == 2_000_000 * 4 for r in range(8))
    with pytest.raises(ConfigError) as err:
        training.phases(training.TrainingSpec(**{**raw, "pp": 3}))
    assert err.value.path == "workload.training.pp"
    for key, value, message in (("layerz", 3, "unknown key"), ("tp", 0, ">= 1"),
                                ("compute_ms", "slow", "must be of type number"),
                                ("moe_every", -1, ">= 0")):
        with pytest.raises(ConfigError) as err:  # the schema checks every field's type
            config.parse({**BASE, "workload": {"training": {**raw, key: value}}})
        assert err.value.path == f"workload.training.{key}" and message in err.value.message
    with pytest.raises(ConfigError) as err:
        config.parse({**BASE, "workload": {"training": {**raw, "ranks": 4}}})
    assert err.value.path == "workload.training.ranks"


def test_flows_by_pairs_and_per_entry_dscp_and_congestion_control():
    exp = _exp({"op": "flows", "pairs": [["h2_1_1", "h1_1_1"], ["h3_1_1", "h1_1_1"]],
                "size": "1MiB", "dscp": 26},
               {"op": "send_recv", "size": 64, "ranks": ["h4_1_1", "h1_1_2"],
                "concurrent": True}, dscp=10, congestion_control="reno")
    flows_job, victim = exp.workload.jobs
    assert flows_job.collectives[0].hosts == ("h2_1_1", "h1_1_1", "h3_1_1")
    assert flows_job.collectives[0].schedule.received_by(1) == 2 << 20
    assert (flows_job.dscp, victim.dscp) == (26, 10)
    assert flows_job.congestion_control == victim.congestion_control == "reno"


@pytest.mark.parametrize("entry,path,text", [
    ({"op": "flows", "pairs": [["h1_1_1", "h9_9_9"]], "size": 64},
     "workload.collectives[0].pairs[0][1]", "no host 'h9_9_9'"),
    ({"op": "flows", "pairs": [["h1_1_1", "h1_1_1"]], "size": 64},
     "workload.collectives[0].pairs[0]", "cannot send to itself"),
    ({"op": "flows", "pairs": [["h1_1_1", "h1_1_2"]], "pattern": "incast", "size": 64},
     "workload.collectives[0].pairs", "not both"),
    ({"op": "all_reduce", "size": 64, "dscp": 64}, "workload.collectives[0].dscp", "<= 63"),
    ({"op": "all_reduce", "size": 64, "congestion_control": "vegas"},
     "workload.collectives[0].congestion_control", "must be one of"),
])
def test_bad_pairs_dscp_and_congestion_control(entry, path, text):
    with pytest.raises(ConfigError) as err:
        _exp(entry)
    assert err.value.path == path and text in err.value.message, err.value


def test_workload_files_must_be_regular_files_under_the_size_cap(tmp_path, monkeypatch):
    """A FIFO (which would block validate) and a device (which never ends) are refused by
    field; a file over the cap is refused with the flag that lifts it."""
    import os

    from traffic.workloads import workload

    def load(trace: str):
        exp = tmp_path / "x.yaml"
        exp.write_text("version: 1\nname: x\nfabric: {topology: fat_tree, k: 4}\n"
                       f"workload: {{trace: {trace}}}\n")
        return config.load(exp)

    os.mkfifo(tmp_path / "fifo")
    for trace in ("fifo", "/dev/zero"):
        with pytest.raises(ConfigError) as err:
            load(trace)
        assert err.value.path == "workload.trace" and "not a regular file" in str(err.value)
    (tmp_path / "big.jsonl").write_text('{"op": "all_reduce", "size": 1024}\n' * 100)
    monkeypatch.setattr(workload, "MAX_INPUT_BYTES", 1000)
    with pytest.raises(ConfigError) as err:
        load("big.jsonl")
    assert "--max-input-mb" in str(err.value)
    monkeypatch.setattr(workload, "MAX_INPUT_BYTES", 1 << 20)
    assert load("big.jsonl").workload is not None


def test_nccl_lines_parse_behind_a_launchers_prefix_and_hostile_lines_cost_little():
    import time

    from traffic.workloads.nccl_log import parse_line

    line = ("gpu1:1234:1290 [0] NCCL INFO AllReduce: opCount 3 sendbuff 0x7f recvbuff 0x7f "
            "count 1048576 datatype 7 op 0 root 0 comm 0x55 [nranks=8] stream 0x56")
    call = parse_line(line, 1)
    assert (call.host, call.pid, call.op, call.count, call.nranks) == (
        "gpu1", 1234, "AllReduce", 1048576, 8)
    assert parse_line("[1,0]<stdout>:" + line, 2).host == "gpu1"  # mpirun --tag-output
    start = time.monotonic()
    for hostile in ("a" * 4000 + " NCCL INFO " + "b" * 90, "a:" * 2000, "1:" * 2047 + " NCCL INFO",
                    "x" * 100_000):
        assert parse_line(hostile, 3) is None
    assert time.monotonic() - start < 0.5


def test_an_nccl_count_of_thousands_of_digits_is_no_line_not_a_crash(tmp_path):
    """``int()`` of a 5,000-digit count raised Python's digit-limit ValueError: such a line is
    no collective line (past the line cap, or past the count's digits), and a log of nothing
    else is refused by name."""
    from traffic.workloads.nccl_log import parse_line

    for digits in (400, 4_000, 5_000):
        line = ("gpu1:1234:1290 [0] NCCL INFO AllReduce: opCount 3 sendbuff 0x7f recvbuff 0x7f "
                f"count {'9' * digits} datatype 7 op 0 root 0 comm 0x55 [nranks=2] stream 0x56")
        assert parse_line(line, 1) is None
        (tmp_path / "big.log").write_text(line + "\n")
        (tmp_path / "exp.yaml").write_text("version: 1\nfabric: {topology: fat_tree, k: 4}\n"
                                           "workload: {nccl_log: big.log}\n")
        with pytest.raises(ConfigError) as err:
            config.load(tmp_path / "exp.yaml")
        assert "no NCCL collective lines" in str(err.value)


@pytest.mark.parametrize("size, says", [
    ("1" + "0" * 4000, "cannot read size"),  # a long number YAML gives as a string: was inf
    (10 ** 30, "more than the 1 TiB"),
    ("3.5e99GiB", "cannot read size"),
])
def test_a_size_past_reason_is_refused_by_field(size, says):
    from traffic.workloads.workload import parse_size

    with pytest.raises(ConfigError) as err:
        parse_size(size, "workload.collectives[1].size")
    assert err.value.path == "workload.collectives[1].size" and says in err.value.message
    assert len(err.value.message) < 200


def test_a_job_on_hpcc_has_the_switches_stamp_int():
    plain = _exp({"op": "all_reduce", "size": 64, "ranks": 2, "transport": "rocev2"})
    hpcc = _exp({"op": "all_reduce", "size": 64, "ranks": 2,
                 "transport": {"kind": "rocev2", "congestion_control": "hpcc"}})
    assert not plain.fabric.int_telemetry and hpcc.fabric.int_telemetry
    assert hpcc.fabric.needs_marker and hpcc.topology is not None
