"""Tables across runs (fabriclab/model/tidy.py, fabriclab/frames.py): one row per collective
or transfer of every cell, its parameters as columns, as CSV, Parquet and a data frame."""

from __future__ import annotations

import json

import pytest

from fabriclab import frames
from fabriclab.api import Results
from fabriclab.model import rundir
from testbed.errors import ConfigError

pandas = pytest.importorskip("pandas")


def _cell(path, k: int, efficiency: float) -> None:
    path.mkdir(parents=True)
    rows = [{"job": 0, "repetition": rep, "op": "all_reduce", "algorithm": "ring",
             "bytes": 1 << 20, "communicator_size": 4, "time_us": 1e6 / efficiency,
             "algbw_GBps": 0.01, "busbw_GBps": 0.01 * efficiency, "efficiency": efficiency,
             "fct_s": {"p50": 0.2, "p99": 0.3}, "slowdown": {"p50": 1.1, "p99": 1.5 * k}}
            for rep in range(2)]
    (path / "results.json").write_text(json.dumps({
        "experiment": "sw", "complete": True, "version": 3, "collectives": rows,
        "provenance": {"seed": 7, "datapath": "ebpf"}}))
    (path / "flows.csv").write_text(rundir.flows_csv(
        [[0, rep, "", "all_reduce", "h1", "h2", s, 1024 * (k + s), "1.5", 0.0, 0.1, 0.1, 0.05,
          2.0, 0.06, 0, "tcp", "10.0.0.1", "20001", "10.0.0.2", 17000, "h1>s1>h2"]
         for rep in range(2) for s in range(3)]))


def _sweep(tmp_path):
    out = tmp_path / "sweep"
    cells = []
    for k, eff in ((4, 0.9), (6, 0.7)):
        name = f"fabric.k={k}"
        _cell(out / name, k, eff)
        cells.append({"cell": name, "name": name, "values": {"fabric.k": k},
                      "variant": None, "repetition": 0, "complete": True, "error": None,
                      "jobs": []})
    (out / "sweep.json").write_text(json.dumps({"experiment": "sw", "cells": cells}))
    return out


def test_a_sweep_is_one_table_per_kind_with_its_axes_as_columns(tmp_path):
    out = _sweep(tmp_path)
    table = frames.records(out)
    assert len(table) == 4  # 2 cells x 2 repetitions
    assert [(r["run"], r["fabric.k"], r["repetition"], r["efficiency"]) for r in table] == [
        ("fabric.k=4", 4, 0, 0.9), ("fabric.k=4", 4, 1, 0.9),
        ("fabric.k=6", 6, 0, 0.7), ("fabric.k=6", 6, 1, 0.7)]
    assert table[0]["slowdown_p99"] == 6.0 and table[0]["seed"] == 7
    assert table[0]["datapath"] == "ebpf" and table[0]["transport"] == "tcp"
    flows = frames.records(out, "flows")
    assert len(flows) == 12 and flows[0]["bytes"] == 4096 and flows[0]["fabric.k"] == 4
    assert flows[0]["slowdown"] == 2.0 and flows[0]["retransmitted"] == 0
    assert flows[0]["path"] == "h1>s1>h2"
    with pytest.raises(ConfigError, match="kind"):
        frames.records(out, "iterations")


def test_results_to_dataframe_gives_one_row_per_collective_per_cell(tmp_path):
    out = _sweep(tmp_path)
    df = Results.read(out).to_dataframe()
    assert len(df) == 4 and set(df["fabric.k"]) == {4, 6}
    assert df.groupby("fabric.k")["efficiency"].mean().to_dict() == {4: 0.9, 6: 0.7}
    flows = Results.read(out / "fabric.k=6").to_dataframe("flows")  # one run alone
    assert len(flows) == 6 and flows["fct_s"].dtype.kind == "f"


def test_the_tables_are_written_beside_the_cells_as_csv_and_parquet(tmp_path):
    out = _sweep(tmp_path)
    written = frames.write_tables(out)
    assert written == ["collectives.csv", "flows.csv", "collectives.parquet", "flows.parquet"]
    back = pandas.read_parquet(out / "collectives.parquet")
    assert len(back) == 4 and list(back.columns[:2]) == ["run", "fabric.k"]
    assert (out / "flows.csv").read_text().splitlines()[0].startswith("run,fabric.k,cell_repetition,job,")
    # one run alone: its own CSVs stay as the run wrote them, its Parquet twins beside
    cell = out / "fabric.k=4"
    before = (cell / "flows.csv").read_text()
    assert frames.write_tables(cell) == ["collectives.parquet", "flows.parquet"]
    assert (cell / "flows.csv").read_text() == before
    assert len(pandas.read_parquet(cell / "flows.parquet")) == 6
    with pytest.raises(ConfigError, match="holds no run"):
        frames.runs(tmp_path / "nothing")


def test_failures_are_a_table_of_events_and_watched_ports(tmp_path):
    """A degrade watched at two ports, then its repair (nothing watched): three rows a cell,
    with the cell's parameters, the throughput around each event and each port's times to
    move off; written beside the cells as failures.csv and its Parquet twin."""
    out = _sweep(tmp_path)
    for k in (4, 6):
        path = out / f"fabric.k={k}" / "results.json"
        doc = json.loads(path.read_text())
        doc["failures"] = [
            {"action": "degrade", "target": "link agg1_1-core1", "at_s": 2.0,
             "applied_s": 2.004, "rate_factor": 0.5,
             "throughput": {"before_mbps": 400.0, "during_mbps": 350.0, "after_mbps": 340.0},
             "move_off": {"rates_mbps": {"agg1_1-eth3": 50.0, "core1-eth1": 50.0},
                          "ms": {"agg1_1-eth3": 0.0, "core1-eth1": 42.0 if k == 4 else None},
                          "averaged_ms": {"agg1_1-eth3": 0.0, "core1-eth1": 3.0},
                          "window_ms": {"agg1_1-eth3": 5.8, "core1-eth1": 5.8},
                          "alternatives": {"agg1_1-eth3": ["agg1_1-eth4"],
                                           "core1-eth1": ["core2-eth1"]}}},
            {"action": "degrade", "target": "link agg1_1-core1", "at_s": 4.0,
             "applied_s": 4.003, "rate_factor": 1.0, "throughput": {}}]
        path.write_text(json.dumps(doc))
    rows = frames.records(out, "failures")
    assert len(rows) == 6
    first, far, repair = rows[:3]
    assert (first["run"], first["fabric.k"], first["event"], first["port"]) == \
        ("fabric.k=4", 4, 0, "agg1_1-eth3")
    assert (first["before_mbps"], first["rate_mbps"], first["alternatives"]) == \
        (400.0, 50.0, "agg1_1-eth4")
    assert (far["ms"], far["averaged_ms"], far["window_ms"]) == (42.0, 3.0, 5.8)
    assert rows[4]["ms"] is None  # never moved off, in the other cell
    assert (repair["event"], repair["port"], repair["rate_factor"]) == (1, None, 1.0)
    assert "failures.csv" in frames.write_tables(out)
    back = pandas.read_parquet(out / "failures.parquet")
    assert len(back) == 6 and list(back.columns[:2]) == ["run", "fabric.k"]
    assert Results.read(out).to_dataframe("failures")["averaged_ms"].max() == 3.0
    # no failures anywhere: no table
    assert "failures.csv" not in frames.write_tables(_sweep(tmp_path / "plain"))


def test_compare_gives_times_fct_slowdown_their_change_and_what_provenance_differs(tmp_path):
    from fabriclab.cli import tables
    from fabriclab.frames import compare_rows

    out = _sweep(tmp_path)
    doc = json.loads((out / "fabric.k=6" / "results.json").read_text())
    doc["provenance"]["seed"] = 8
    (out / "fabric.k=6" / "results.json").write_text(json.dumps(doc))
    lines = compare_rows([out])
    first, second = (line["jobs"][0] for line in lines)
    assert (first["n"], first["time_us"], first["slowdown_p99"]) == (2, pytest.approx(1e6 / 0.9),
                                                                     6.0)
    assert first["delta_time_us"] == 0 and second["delta_efficiency"] == pytest.approx(
        0.7 / 0.9 - 1)
    assert second["delta_time_us"] == pytest.approx(0.9 / 0.7 - 1)
    assert [line["provenance_differs"] for line in lines] == [{"seed": 7}, {"seed": 8}]
    against = compare_rows([out], baseline="k=6")  # the changes against the second
    assert against[0]["jobs"][0]["delta_efficiency"] == pytest.approx(0.9 / 0.7 - 1)
    with pytest.raises(ConfigError, match="--baseline"):
        compare_rows([out], baseline="k=8")
    (table,) = tables.compare(lines)  # one job: one table, a row per cell
    assert table.row_count == 2
    assert tables.provenance_diff(lines).row_count == 1


def test_compare_puts_a_time_scaled_run_in_the_real_fabrics_units(tmp_path):
    """A run at time scale N keeps its emulated figures and the real ones beside them
    (``real``); compare puts it beside a run at N = 1 in the real fabric's units."""
    from fabriclab.frames import compare_rows

    out = _sweep(tmp_path)
    doc = json.loads((out / "fabric.k=6" / "results.json").read_text())
    for row in doc["collectives"]:  # the same collective, run at N = 15
        row["real"] = {"bytes": row["bytes"], "time_us": row["time_us"],
                       "algbw_GBps": row["algbw_GBps"], "busbw_GBps": row["busbw_GBps"],
                       "fct_s": {"p50": 0.2, "p99": 0.3}}
        row["time_us"] *= 15
        row["busbw_GBps"] /= 15
        row["fct_s"] = {"p50": 3.0, "p99": 4.5}
    (out / "fabric.k=6" / "results.json").write_text(json.dumps(doc))
    first, second = (line["jobs"][0] for line in compare_rows([out]))
    assert second["time_us"] == pytest.approx(1e6 / 0.7)
    assert second["busbw_GBps"] == pytest.approx(0.01 * 0.7)
    assert (second["fct_p50_s"], second["fct_p99_s"]) == (0.2, 0.3)
    assert second["delta_time_us"] == pytest.approx(0.9 / 0.7 - 1)
