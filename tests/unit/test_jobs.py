"""Several jobs on one fabric: placements (traffic/workloads/jobs.py), the jobs section parsed
into concurrent jobs and their alone copies, and the per-job results (fabriclab/model/jobs.py)."""

import pytest

from fabriclab.model import experiment as config
from fabriclab.model import jobs as jobs_out
from testbed.errors import ConfigError
from testbed.model.builders import leaf_spine
from traffic.workloads.jobs import place

TRAIN = {"tp": 1, "dp": 8, "pp": 1, "layers": 2, "hidden": 64, "seq_len": 64,
         "micro_batches": 1, "params": 100_000, "compute_ms": 10}
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
    row = lambda job, start, seconds: {"job": job, "start_unix_s": start,  # noqa: E731
                                       "time_us": seconds * 1e6, "gap_s": 0.0,
                                       "released_unix_s": start - 1.0}
    doc = {"collectives": [row(0, 101.0, 3.0), row(1, 101.0, 2.0), row(2, 110.0, 1.0)],
           "prediction": {"collectives": [
               {"job": 0, "predicted_s": 2.0, "gap_s": 1.0},
               {"job": 1, "predicted_s": 1.0, "gap_s": 1.0},
               {"job": 2, "predicted_s": 1.0, "gap_s": 1.0}]}}
    phases = [{"job": 0, "links": {"l1->s1": 10, "l1->s2": 5}},
              {"job": 1, "links": {"l1->s1": 3}}]
    (a, b) = jobs_out.summary(doc, [
        {"index": 0, "name": "a", "hosts": ["h1"], "alone_index": 2},
        {"index": 1, "name": "b", "hosts": ["h2"], "alone_index": None}], phases, {"b": 1.5})
    assert (a["time_s"], a["alone_s"], a["slowdown"]) == (4.0, 2.0, 2.0)
    assert a["predicted_slowdown"] == 1.5 and a["shared_links"] == ["l1->s1"]
    assert (b["alone_s"], b["slowdown"]) == (1.5, 2.0)  # from the baseline run
