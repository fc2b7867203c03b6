"""Several jobs on one fabric: placements (traffic/workloads/jobs.py), the jobs section parsed
into concurrent jobs and their alone copies, and the per-job results (fabriclab/model/jobs.py)."""

from pathlib import Path

import pytest

from fabriclab.model import experiment as config
from fabriclab.model import jobs as jobs_out
from fabriclab.model.document import read
from testbed.errors import ConfigError
from testbed.model.builders import leaf_spine
from traffic.workloads.jobs import place

TRAIN = {"tp": 1, "dp": 8, "pp": 1, "layers": 2, "hidden": 64, "seq_len": 64,
         "micro_batches": 1, "params": 100_000, "compute_ms": 10}
ROOT = Path(__file__).resolve().parents[2]
FABRIC = {"topology": "leaf_spine", "leaves": 4, "spines": 2, "hosts_per_leaf": 4}


def test_packed_fills_leaves_spread_deals_them_out_random_is_seeded():
    topo = leaf_spine(4, 2, 4)
    a = place(topo, 8, "packed", set(), 1, "j")
    assert a == tuple(f"h{leaf}_{i}" for leaf in (1, 2) for i in (1, 2, 3, 4))
    assert place(topo, 8, "packed", set(a), 1, "j")[0] == "h3_1"
    s = place(topo, 8, "spread", set(), 1, "j")
    assert s[:4] == ("h1_1", "h2_1", "h3_1", "h4_1") and len(set(s)) == 8
    assert place(topo, 5, "random", set(), 7, "j") == place(topo, 5, "random", set(), 7, "j")
    with pytest.raises(ConfigError) as err:
        place(topo, 8, "rail_aligned", set(), 1, "j")
    assert err.value.path == "j.placement"
    with pytest.raises(ConfigError) as err:
        place(topo, 12, "packed", set(a), 1, "j")
    assert err.value.path == "j.count" and "8 hosts are free" in err.value.message


def test_rail_aligned_takes_whole_servers_in_nccl_order():
    exp = config.parse({"version": 1, "fabric": {
        "topology": "rail_optimized", "spines": 2,
        "servers": {"count": 4, "gpus_per_server": 4,
                    "scale_up": {"kind": "switch", "rate_mbps": 400}}}})
    topo = exp.topology
    hosts = place(topo, 8, "rail_aligned", set(topo.servers[0].gpus), 1, "j")
    assert hosts == (*topo.servers[1].gpus, *topo.servers[2].gpus)


def test_the_jobs_section_runs_them_together_then_each_alone():
    exp = config.parse({"version": 1, "fabric": FABRIC, "workload": {"jobs": [
        {"name": "a", "training": TRAIN, "ranks": {"count": 8, "placement": "spread"}},
        {"name": "b", "collective": {"op": "all_reduce", "size": "1MiB", "ranks": 4},
         "start_s": 0.5, "dscp": 10}]}})
    wl = exp.workload
    assert [(j.index, j.name, j.alone_of, j.concurrent) for j in wl.jobs] == [
        (0, "a", "", False), (1, "b", "", True), (2, "a", "a", False), (3, "b", "b", False)]
    assert [[j.index for j in b] for b in wl.batches()] == [[0, 1], [2], [3]]
    a_hosts, b_hosts = wl.jobs[0].collectives[0].hosts, wl.jobs[1].collectives[0].hosts
    assert not set(a_hosts) & set(b_hosts) and len(b_hosts) == 4
    assert wl.jobs[1].offset_s == 0.5 and wl.jobs[3].offset_s == 0.0 and wl.jobs[1].dscp == 10
    assert wl.jobs[2].collectives == wl.jobs[0].collectives  # alone: the same job


@pytest.mark.parametrize("jobs,extra,path,text", [
    ([{"name": "a"}], {}, "workload.jobs[0]", "one workload"),
    ([{"name": "a", "training": TRAIN}, {"name": "a", "training": TRAIN}], {}, "workload.jobs",
     "repeat"),
    ([{"name": "a", "training": TRAIN, "ranks": ["h1_1"]}], {}, "workload.jobs[0].ranks",
     "8 ranks"),
    ([{"name": "a", "training": TRAIN}], {"collectives": []}, "workload.collectives", "not both"),
    ([{"name": "a", "training": TRAIN}], {"baseline": "nowhere"}, "workload.baseline",
     "run directory"),
    ([{"name": "a", "collective": {"op": "all_reduce", "size": 64}, "ranks": ["h1_1", "h1_2"]},
      {"name": "b", "collective": {"op": "all_reduce", "size": 64}, "ranks": ["h1_2", "h2_1"]}],
     {}, "workload.jobs[1].ranks[0]", "job before"),
])
def test_a_bad_jobs_section_names_its_field(jobs, extra, path, text):
    with pytest.raises(ConfigError) as err:
        config.parse({"version": 1, "fabric": FABRIC, "workload": {"jobs": jobs, **extra}})
    assert err.value.path == path, err.value
    assert text is None or text in err.value.message


def test_a_jobs_line_has_its_slowdown_measured_and_predicted_and_its_shared_links():
    row = lambda job, start, seconds: {  # noqa: E731
        "job": job, "op": "all_reduce", "bytes": 1, "start_unix_s": start,
        "time_us": seconds * 1e6, "algbw_GBps": 0.0, "busbw_GBps": 0.0, "efficiency": 0.0,
        "gap_s": 0.0, "released_unix_s": start - 1.0}
    predicted = lambda job, seconds: {"job": job, "index": 0, "op": "all_reduce",  # noqa: E731
                                      "predicted_s": seconds, "gap_s": 1.0}
    doc = read({"collectives": [row(0, 101.0, 3.0), row(1, 101.0, 2.0), row(2, 110.0, 1.0)],
                "prediction": {"routing": "ecmp", "collectives": [
                    predicted(0, 2.0), predicted(1, 1.0), predicted(2, 1.0)]}})
    phases = [{"job": 0, "links": {"l1->s1": 10, "l1->s2": 5}},
              {"job": 1, "links": {"l1->s1": 3}}]
    (a, b) = jobs_out.summary(doc, [
        {"index": 0, "name": "a", "hosts": ["h1"], "alone_index": 2},
        {"index": 1, "name": "b", "hosts": ["h2"], "alone_index": None}], phases, {"b": 1.5})
    assert (a.time_s, a.alone_s, a.slowdown) == (4.0, 2.0, 2.0)
    assert a.predicted_slowdown == 1.5 and a.shared_links == ["l1->s1"]
    assert (b.alone_s, b.slowdown) == (1.5, 2.0)  # from the baseline run


def test_a_job_of_several_collectives_a_trace_and_a_scaled_log(tmp_path):
    """collectives, trace and nccl_log jobs: their entries one after another on the job's
    hosts (one of fewer ranks on the first of them), a log's scaled by workload.replay."""
    (tmp_path / "t.jsonl").write_text('{"op": "all_gather", "size": 4096, "ranks": 2}\n'
                                      '{"op": "all_reduce", "size": 8192, "gap_s": 0.5}\n')
    log = ROOT / "tests" / "unit" / "data" / "nccl" / "allreduce-2ranks.log"
    (tmp_path / "r.log").write_text(log.read_text())
    exp = config.parse({"version": 1, "fabric": FABRIC, "workload": {
        "replay": {"size_scale": 0.5},
        "jobs": [
            {"name": "c", "collectives": [
                {"op": "all_reduce", "size": "1MiB", "repetitions": 2},
                {"op": "all_to_all", "size": 65536, "ranks": 2}],
             "ranks": {"count": 4, "placement": "spread"}, "dscp": 8},
            {"name": "t", "trace": "t.jsonl", "ranks": 4},
            {"name": "n", "nccl_log": "r.log"}]}}, source=str(tmp_path / "x.yaml"))
    c, t, n = exp.workload.jobs[:3]
    assert [x.op for x in c.collectives] == ["all_reduce", "all_reduce", "all_to_all"]
    assert all(x.hosts == c.collectives[0].hosts for x in c.collectives) and c.dscp == 8
    a2a = c.collectives[2].schedule
    assert {(tr.src, tr.dst) for tr in a2a.transfers} == {(0, 1), (1, 0)}
    assert a2a.group_ranks == 2 and a2a.ranks == 4
    assert [x.gap_s for x in t.collectives] == [0.0, 0.5] and len(t.collectives[0].hosts) == 4
    assert not set(c.collectives[0].hosts) & set(t.collectives[0].hosts)
    replay = exp.workload.replay
    assert replay["size_scale"] == 0.5 and replay["bytes_replayed"] * 2 == pytest.approx(
        replay["bytes_as_logged"], abs=replay["entries"])
    assert len(t.collectives) + len(n.collectives) == replay["entries"]  # both scaled


@pytest.mark.parametrize("job,path,text", [
    ({"collectives": [{"op": "all_reduce", "size": 64, "t_s": 1.0}], "ranks": 2},
     "workload.jobs[0].collectives[0].t_s", "one after another"),
    ({"collectives": [{"op": "all_reduce", "size": 64, "dscp": 8}], "ranks": 2},
     "workload.jobs[0].collectives[0].dscp", "set it on workload.jobs[0]"),
    ({"collectives": [{"op": "all_reduce", "size": 64, "ranks": ["h1_1", "h1_2"]}]},
     "workload.jobs[0].collectives[0].ranks", "rank count"),
    ({"collectives": [{"op": "all_reduce", "size": 64}]}, "workload.jobs[0].ranks",
     "give the job's ranks"),
    ({"collectives": [{"op": "all_reduce", "size": 64, "ranks": 4}], "ranks": 2},
     "workload.jobs[0].collectives[0].ranks", "4 ranks in a job of 2"),
])
def test_a_bad_entry_of_a_named_job_names_its_field(job, path, text):
    with pytest.raises(ConfigError) as err:
        config.parse({"version": 1, "fabric": FABRIC,
                      "workload": {"jobs": [{"name": "a", **job}]}})
    assert err.value.path == path, err.value
    assert text in err.value.message, err.value
