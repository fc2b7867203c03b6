"""Collective schedules against their algorithms' definitions; NCCL-tests metrics; NCCL log import."""

from pathlib import Path

import pytest

from testbed.errors import ConfigError
from traffic.measure import metrics
from traffic.workloads.nccl_log import import_log, parse_line
from traffic.workloads.schedules import ALGORITHMS, build, chunk_sizes

NCCL_DATA = Path(__file__).resolve().parent / "data" / "nccl"  # real lines, see its README
RANKS = range(2, 17)


@pytest.mark.parametrize("n", RANKS)
def test_ring_all_reduce_sends_2_n_minus_1_over_n_of_the_size(n):
    size = 1024 * n * 3
    sched = build("all_reduce", n, size, "ring")
    assert sched.steps == 2 * (n - 1)
    for r in range(n):
        assert sched.sent_by(r) == sched.received_by(r) == 2 * (n - 1) * size // n
        assert all(dst == (src + 1) % n for _, src, dst, _ in
                   ((t.step, t.src, t.dst, t.nbytes) for t in sched.transfers))


@pytest.mark.parametrize("n", RANKS)
def test_rhd_all_reduce_moves_the_same_bytes_as_the_ring(n):
    size = 4096 * 16
    sched = build("all_reduce", n, size, "rhd")
    p2 = 1 << (n.bit_length() - 1)
    for r in range(p2 if p2 == n else 0):
        assert sched.sent_by(r) == 2 * (n - 1) * size // n
    if p2 != n:  # the extra ranks hand their data over and get the result back
        for r in range(p2, n):
            assert sched.sent_by(r) == sched.received_by(r) == size
    steps = 2 * (p2.bit_length() - 1) + (2 if p2 != n else 0)
    assert sched.steps == steps


@pytest.mark.parametrize("n", RANKS)
def test_tree_all_reduce_reduces_up_and_broadcasts_down(n):
    size = 1000
    sched = build("all_reduce", n, size, "tree")
    for r in range(1, n):
        children = [c for c in (2 * r + 1, 2 * r + 2) if c < n]
        assert sched.sent_by(r) == size * (1 + len(children))  # up once, down to each child
    assert sched.received_by(0) == size * min(2, n - 1)


@pytest.mark.parametrize("n", RANKS)
@pytest.mark.parametrize("op", ["reduce_scatter", "all_gather", "all_to_all"])
def test_n_minus_1_over_n_collectives(op, n):
    size = 512 * n
    sched = build(op, n, size)
    for r in range(n):
        assert sched.sent_by(r) == (n - 1) * size // n
    if op == "all_to_all":
        peers = {(t.src, t.dst) for t in sched.transfers}
        assert peers == {(a, b) for a in range(n) for b in range(n) if a != b}


@pytest.mark.parametrize("n", RANKS)
def test_direct_all_to_all_moves_the_pairwise_bytes_in_one_step(n):
    size = 512 * n + 7
    pairwise, direct = build("all_to_all", n, size), build("all_to_all", n, size, "direct")
    assert direct.steps == 1 and pairwise.steps == n - 1
    assert sorted((t.src, t.dst, t.nbytes) for t in direct.transfers) == sorted(
        (t.src, t.dst, t.nbytes) for t in pairwise.transfers)


@pytest.mark.parametrize("n", RANKS)
def test_pipelined_broadcast_forwards_every_byte_down_the_chain(n):
    size = 10_001
    sched = build("broadcast", n, size, chunks=4)
    assert [sched.sent_by(r) for r in range(n)] == [size] * (n - 1) + [0]
    assert sched.steps == n - 1 + 3


def test_data_dependencies_a_rank_forwards_only_what_it_has_received():
    sched = build("all_reduce", 5, 5000, "ring")
    for t in sched.transfers:
        if t.step:
            before = [p for p in sched.transfers if p.dst == t.src and p.step == t.step - 1]
            assert before, f"{t} has nothing to forward"
    program = sched.per_rank(2)
    assert (0, "send", 3, 1000) in program and (0, "recv", 1, 1000) in program
    assert [p[0] for p in program] == sorted(p[0] for p in program)


def test_uneven_sizes_are_conserved():
    assert chunk_sizes(10, 4) == [3, 3, 2, 2]
    for op, algos in ALGORITHMS.items():
        for algo in algos:
            n = 2 if op == "send_recv" else 7
            sched = build(op, n, 1_000_003, algo)
            assert sum(sched.sent_by(r) for r in range(n)) == \
                sum(sched.received_by(r) for r in range(n))


@pytest.mark.parametrize("kwargs,path,text", [
    ({"op": "all_reduce_v"}, "c.op", "unknown op 'all_reduce_v'"),
    ({"algorithm": "butterfly"}, "c.algorithm", "no algorithm 'butterfly'"),
    ({"ranks": 1}, "c.ranks", "at least 2 ranks"),
    ({"size_bytes": 0}, "c.size_bytes", "positive integer"),
    ({"size_bytes": -5}, "c.size_bytes", "positive integer"),
    ({"op": "send_recv", "ranks": 3, "algorithm": None}, "c.ranks", "between 2 ranks"),
])
def test_bad_collectives_name_the_field(kwargs, path, text):
    args = {"op": "all_reduce", "ranks": 4, "size_bytes": 1024, "algorithm": "ring", **kwargs}
    with pytest.raises(ConfigError) as err:
        build(args["op"], args["ranks"], args["size_bytes"], args["algorithm"], field_path="c")
    assert err.value.path == path and text in err.value.message


def test_nccl_tests_bus_bandwidth_definitions():
    assert metrics.bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert metrics.bus_factor("all_gather", 8) == metrics.bus_factor("all_to_all", 8) == 0.875
    assert metrics.bus_factor("broadcast", 8) == 1.0
    # 16 MiB all-reduce over 8 ranks in 2.5 s
    algbw = metrics.algbw_GBps(16 << 20, 2.5)
    assert algbw == pytest.approx(16 * 2**20 / 2.5 / 1e9)  # GB/s, as NCCL-tests
    assert metrics.busbw_GBps("all_reduce", 8, 16 << 20, 2.5) == pytest.approx(algbw * 1.75)
    ideal = metrics.ideal_time_s("all_reduce", 8, 16 << 20, 100)
    assert metrics.efficiency("all_reduce", 8, 16 << 20, ideal, 100) == pytest.approx(1.0)
    assert metrics.percentile([5, 1, 3, 2, 4], 50) == 3
    assert metrics.percentile([5, 1, 3, 2, 4], 99) == 5


def test_nccl_log_import_groups_ranks_into_collectives():
    text = (NCCL_DATA / "allreduce-2ranks.log").read_text()
    calls = import_log(text)
    assert [(c.op, c.op_count, c.nranks, c.reporters) for c in calls] == [
        ("all_reduce", 0x1A, 2, 2), ("all_reduce", 0x1B, 2, 2), ("all_reduce", 0x1C, 2, 2)]
    assert [c.size_bytes for c in calls] == [64 * 4, 237184 * 4, 386560 * 4]  # float32


def test_nccl_log_import_send_recv_and_prefixed_lines():
    text = (NCCL_DATA / "sendrecv-2ranks.log").read_text()
    prefixed = "\n".join(f"(Worker pid=1, ip=10.0.0.1) {line}" for line in text.splitlines())
    calls = import_log("some other INFO line\n" + prefixed)
    assert {c.op for c in calls} == {"send", "recv"}
    assert all(c.size_bytes == 2420736 * 4 and c.nranks == 2 for c in calls)


def test_nccl_log_bad_lines():
    with pytest.raises(ConfigError, match="no NCCL collective lines"):
        import_log("hello\nworld\n")
    bad = ("h:1:2 [0] NCCL INFO AllReduce: opCount 1 sendbuff 0x1 recvbuff 0x2 count 4 "
           "datatype 42 op 0 root 0 comm 0x3 [nranks=2] stream 0x4")
    with pytest.raises(ConfigError) as err:
        parse_line(bad, 7)
    assert err.value.path == "line 7" and "datatype 42" in err.value.message


def test_runner_summary_uses_the_slowest_rank_and_nccl_tests_metrics():
    from traffic.protocol import (AgentReport, AgentSpec, CollectiveTiming, FlowTiming,
                                  SendTiming)
    from traffic.measure.results import job_spec, summarize
    from traffic.workloads.workload import Collective

    hosts = ("a", "b")
    coll = Collective("all_reduce", hosts, build("all_reduce", 2, 1_000_000))
    spec = job_spec([coll], {"a": "10.0.0.1", "b": "10.0.0.2"}, connections=4, start_at=5.0)
    assert [(r.host, r.ip) for r in spec.ranks] == [("a", "10.0.0.1"), ("b", "10.0.0.2")]
    assert spec.connections == 4 and len(spec.collectives[0].transfers) == 4
    assert AgentSpec.from_json(spec.to_json()) == spec  # what the agents read back
    reports = [AgentReport(0, "a", (CollectiveTiming(0, 10.0, 11.5, (
                   FlowTiming(1, 0, 0, 500_000, 10.8),), sends=(
                   SendTiming(0, 1, 1, 500_000, 10.9, 2),)),), cpu_s=0.5),
               AgentReport(1, "b", (CollectiveTiming(0, 10.0, 12.0, (
                   FlowTiming(0, 1, 1, 500_000, 12.0),), sends=(
                   SendTiming(1, 0, 0, 500_000, 10.0, None),)),), cpu_s=0.25)]
    reports = [AgentReport.from_json(r.to_json()) for r in reports]
    (res,) = summarize([coll], reports, rate_mbps=10, mtu=9000,
                       ideal_fct=lambda src, dst, n: (n * 8 / 10e6, n * 8 / 9e6))
    # each transfer from its sender's start: b's step 0 (0.8 s), a's step 1 (1.1 s); alone,
    # each takes 0.4 s at 10 Mbit/s
    assert [(f.src, f.dst, f.start_s, f.end_s, f.retransmitted) for f in res.flows] == [
        ("a", "b", 0.9, 2.0, 2), ("b", "a", 0.0, 0.8, None)]
    assert res.flows[0].line_rate_fct_s == pytest.approx(500_000 * 8 / 9e6)
    assert res.fct_s == {"p50": pytest.approx(0.8), "p99": pytest.approx(1.1),
                         "max": pytest.approx(1.1)}
    assert res.slowdown == {"p50": pytest.approx(2.0), "p99": pytest.approx(2.75),
                            "max": pytest.approx(2.75)}
    assert res.time_us == pytest.approx(2.0e6)
    assert res.algbw_GBps == pytest.approx(1_000_000 / 2.0 / 1e9)  # NCCL-tests: GB/s
    assert res.busbw_GBps == pytest.approx(res.algbw_GBps)  # 2(n-1)/n = 1 for n = 2
    assert res.efficiency == pytest.approx(res.busbw_GBps * 8e3 / 10)  # 10 Mbit/s links
    assert res.flow_end_s == {"p50": pytest.approx(0.8), "p99": pytest.approx(2.0),
                              "max": pytest.approx(2.0)}
    assert res.agent_cpu_s == pytest.approx(0.75)
    with pytest.raises(ValueError):
        job_spec([coll, Collective("all_reduce", ("b", "a"), coll.schedule)],
                 {"a": "1", "b": "2"}, 1, 0.0)
