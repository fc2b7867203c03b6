"""The run directory's files (pure parts): the experiment as run with its hash, and the CSV
tables of collectives and transfers."""

from __future__ import annotations

import csv
import io

from fabriclab.model import experiment as xp
from fabriclab.model import rundir
from traffic.measure.flows import FlowResult
from traffic.measure.results import CollectiveResult
from traffic.protocol import Connection
from traffic.measure.rows import CollectiveRow

RAW = {"version": 1, "name": "t", "fabric": {"topology": "leaf_spine", "leaves": 2, "spines": 1,
                                              "hosts_per_leaf": 1}}


def test_the_experiment_hash_ignores_key_order_and_sees_every_value():
    a = rundir.experiment_document(RAW)
    b = rundir.experiment_document(dict(reversed(list(RAW.items()))))
    assert a["sha256"] == b["sha256"] and len(a["sha256"]) == 64 and a["experiment"] == RAW
    changed = {**RAW, "fabric": {**RAW["fabric"], "spines": 2}}
    assert rundir.experiment_document(changed)["sha256"] != a["sha256"]


def test_a_variant_keeps_the_data_it_ran_with():
    exp = xp.parse({**RAW, "workload": {"collectives": [{"op": "all_reduce", "size": "1KiB"}]},
                    "variants": [{"name": "v", "set": {"fabric.spines": 2}}]})
    assert exp.raw["fabric"]["spines"] == 1 and exp.variants[0].raw["fabric"]["spines"] == 2
    assert "variants" not in exp.variants[0].raw


def _result(label: str) -> CollectiveResult:
    return CollectiveResult("all_reduce", "ring", ["h1", "h2"], 1024, 0.5, 1e-5, 2e-5, 0.4, 0.8,
                            {"p50": 0.3, "p99": 0.45, "max": 0.5}, label, communicator_size=2,
                            start_unix_s=100.0,
                            flows=[FlowResult("h1", "h2", 0, 512, 0.05, 0.25, 0.1, 1, 0.15),
                                   FlowResult("h2", "h1", 0, 512, 0.0, 0.3, 0.1, None)])


def test_collectives_and_flows_become_csv_rows():
    row = {"job": 0, "repetition": 0, "label": "ar", "op": "all_reduce", "algorithm": "ring",
           "communicator_size": 2, "bytes": 1024, "time_us": 5e5, "algbw_GBps": 1e-5,
           "busbw_GBps": 2e-5, "ideal_s": 0.4, "efficiency": 0.8,
           "flow_end_s": {"p50": 0.3, "p99": 0.45, "max": 0.5},
           "fct_s": {"p50": 0.2, "p99": 0.3, "max": 0.3}, "slowdown": {"p50": 2, "p99": 3},
           "iteration": None,
           "gap_s": 0.0, "transport": {"transport": "uet", "goodput_ratio": 0.99}}
    table = list(csv.DictReader(io.StringIO(rundir.collectives_csv(
        [CollectiveRow.from_json(row)]))))
    assert tuple(table[0]) == rundir.COLLECTIVE_COLUMNS
    assert (table[0]["efficiency"], table[0]["end_p99_s"], table[0]["fct_p99_s"],
            table[0]["slowdown_p99"], table[0]["transport"], table[0]["iteration"]) == (
        "0.8", "0.45", "0.3", "3", "uet", "")
    conns = (Connection(0, 1, 0, "10.0.0.1", 40001, "10.0.0.2", 17000),
             Connection(0, 1, 1, "10.0.0.1", 40002, "10.0.0.2", 17000))
    hashed = [{"job": 3, "src": "h1", "dst": "h2", "channel": ch,
               "path": ["h1->s1", f"s1->s{ch + 2}", f"s{ch + 2}->h2"]} for ch in (0, 1)]
    flows = rundir.flow_rows(3, [_result("ar"), _result("ar")], conns, hashed)
    assert len(flows) == 4
    parsed = list(csv.DictReader(io.StringIO(rundir.flows_csv(flows))))
    assert tuple(parsed[0]) == rundir.FLOW_COLUMNS
    one = parsed[2]  # the second repetition's h1 -> h2: its timing, 5-tuple and paths
    assert {k: one[k] for k in ("repetition", "src", "dst", "start_unix_s", "start_s",
                                "end_s", "fct_s", "ideal_fct_s", "slowdown", "line_rate_fct_s",
                                "retransmitted",
                                "protocol", "src_ip", "src_ports", "dst_ip", "dst_port",
                                "path")} == {
        "repetition": "1", "src": "h1", "dst": "h2", "start_unix_s": "100.050000",
        "start_s": "0.05",
        "end_s": "0.25", "fct_s": "0.2", "ideal_fct_s": "0.1", "slowdown": "2",
        "line_rate_fct_s": "0.15",
        "retransmitted": "1", "protocol": "tcp", "src_ip": "10.0.0.1",
        "src_ports": "40001 40002", "dst_ip": "10.0.0.2", "dst_port": "17000",
        "path": "h1>s1>s2>h2 | h1>s1>s3>h2"}
    sprayed = _result("ar")
    sprayed.transport = {"transport": "uet", "spray": True}
    (row, _back) = list(csv.DictReader(io.StringIO(rundir.flows_csv(
        rundir.flow_rows(3, [sprayed])))))
    assert (row["protocol"], row["src_ports"], row["path"]) == ("udp", "sprayed", "")
    back = parsed[3]  # no connection of its own in the list, no retransmission count
    assert (back["src_ports"], back["path"], back["retransmitted"], back["slowdown"]) == (
        "", "", "", "3")


def test_real_equivalent_units_keep_the_bandwidth_delay_regime():
    import pytest

    exp = xp.parse({**RAW, "fabric": {**RAW["fabric"], "host_link": {"rate_mbps": 4},
                                      "fabric_link": {"rate_mbps": 4}},
                    "scale": {"real_rate_gbps": 400}})
    s = exp.real_scale
    assert s.rate_ratio == pytest.approx(1e5) and s.real_rtt_us == 10.0
    assert s.emulated_rtt_s == pytest.approx(exp.base_rtt_s)
    row = CollectiveRow.from_json({"op": "all_reduce", "bytes": 4 << 20, "time_us": 10e6,
                                   "algbw_GBps": 0.003, "busbw_GBps": 0.0035,
                                   "efficiency": 0.5, "flow_end_s": {"p99": 9.0},
                                   "fct_s": {"p99": 8.0}})
    real = s.collective(row)
    assert (real["flow_end_s"]["p99"], real["fct_s"]["p99"]) == pytest.approx(
        (9.0 * s.time_ratio, 8.0 * s.time_ratio))
    assert real["busbw_GBps"] == pytest.approx(350) and real["time_us"] == pytest.approx(
        10e6 * 10e-6 / exp.base_rtt_s)
    # the same number of RTTs: size / BDP is the same on both sides
    assert real["bytes"] / (400e9 / 8 * 10e-6) == pytest.approx(
        (4 << 20) / (4e6 / 8 * exp.base_rtt_s), rel=1e-6)
    f = s.factors()
    assert "does_not_scale" in f and "RTT ratio" in f["scales"] and "x100,000" in s.describe()
    assert xp.parse(RAW).real_scale is None
    with pytest.raises(xp.ConfigError) as err:
        xp.parse({**RAW, "scale": {"real_rate_gbps": 0}})
    assert err.value.path == "scale.real_rate_gbps"
