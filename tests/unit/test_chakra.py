"""Chakra execution traces (traffic/workloads/chakra.py): a generated sample trace set, read
back through the protobuf wire format, replayed as workload entries in dependency order with
compute as gaps; bad traces named."""

import pytest

from fabriclab.model import experiment as config
from testbed.errors import ConfigError
from traffic.workloads.chakra import COLL, COMP, SEND, Node, encode_trace, entries, read_trace

MiB = 1 << 20


def sample(rank: int, ranks: int = 4) -> list[Node]:
    """One rank of a small training step: forward compute, a gradient all-reduce that waits
    for it, then (two branches) 2 ms and 0.5 ms of compute, both before an all-to-all; rank
    1 also sends 64 KiB to rank 2 once its forward compute is done."""
    nodes = [Node(1, "fwd", COMP, [], 3000),
             Node(2, "allreduce", COLL, [1], 0, {"comm_type": 0, "comm_size": 4 * MiB}),
             Node(3, "bwd_a", COMP, [2], 2000), Node(4, "bwd_b", COMP, [2], 500),
             Node(5, "alltoall", COLL, [3, 4], 0, {"comm_type": 6, "comm_size": MiB,
                                                   "involved_dim": True})]
    if rank == 1:
        nodes.append(Node(6, "pp_send", SEND, [1], 0, {"comm_size": 64 << 10, "comm_dst": 2,
                                                       "comm_tag": 7}))
    return nodes


def test_a_generated_trace_reads_back_node_by_node():
    nodes = sample(1)
    back = read_trace(encode_trace(nodes), "t.1.et")
    assert [(n.id, n.name, n.type, n.deps, n.duration_us) for n in back] == [
        (n.id, n.name, n.type, n.deps, n.duration_us) for n in nodes]
    assert back[4].attrs == {"comm_type": 6, "comm_size": MiB, "involved_dim": True}


def test_communication_replays_in_dependency_order_with_compute_as_gaps():
    got = entries([sample(r) for r in range(4)], "t")
    assert [(e["op"], e["size"], round(e["gap_s"], 6)) for e, _w in got] == [
        ("all_reduce", 4 * MiB, 0.003), ("send_recv", 64 << 10, 0.0),
        ("all_to_all", MiB, 0.002)]  # the longer branch is the critical path
    assert got[1][0]["rank_ids"] == [1, 2] and got[0][0]["ranks"] == 4
    assert got[1][1] == "t.1.et node 6"


def test_a_trace_set_in_an_experiment_runs_on_the_first_hosts_in_nccls_order(tmp_path):
    for r in range(4):
        (tmp_path / f"step.{r}.et").write_bytes(encode_trace(sample(r)))
    (tmp_path / "x.yaml").write_text("version: 1\nfabric: {topology: fat_tree, k: 4}\n"
                                     "workload: {chakra: step, replay: {size_scale: 0.5}}\n")
    wl = config.load(tmp_path / "x.yaml").workload
    colls = [j.collectives[0] for j in wl.jobs]
    assert [c.op for c in colls] == ["all_reduce", "send_recv", "all_to_all"]
    assert colls[0].hosts == ("h1_1_1", "h1_1_2", "h1_2_1", "h1_2_2")
    assert colls[1].hosts == ("h1_1_2", "h1_2_1")  # rank 1 to rank 2
    assert colls[0].schedule.size_bytes == 2 * MiB and colls[0].gap_s == pytest.approx(0.003)
    assert wl.replay["size_scale"] == 0.5 and wl.replay["entries"] == 3


@pytest.mark.parametrize("traces,text", [
    ([[Node(1, "x", COMP, [9], 10)]], "depends on node 9"),
    ([[Node(1, "a", COMP, [2], 1), Node(2, "b", COMP, [1], 1)]], "cycle"),
    ([[Node(1, "c", COLL, [], 0, {"comm_type": 9, "comm_size": 8})]], "collective type 9"),
    ([[Node(1, "c", COLL, [], 0, {"comm_type": 0, "comm_size": 8})], []], "different numbers"),
    ([[Node(1, "s", SEND, [], 0, {"comm_size": 8, "comm_dst": 5})]], "to rank 5"),
])
def test_a_trace_fabriclab_cannot_replay_says_why(traces, text):
    with pytest.raises(ConfigError, match=text):
        entries(traces, "t")


def test_a_file_that_is_no_trace_is_named():
    with pytest.raises(ConfigError) as err:
        read_trace(b"\x05\x0a\x03abc\xff\xff", "t.0.et")
    assert err.value.path == "t.0.et" and "not a Chakra execution trace" in err.value.message
