"""The typed run document: results.json of the release before it had a version reads and
round-trips byte for byte in meaning, what a run writes validates against the published
JSON Schema, a wrong value is named by its field, and keys of a later version are kept.

``python -m tests.unit.test_document`` writes the published schema anew."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest

from fabriclab.cli import tables
from fabriclab.model import document, results
from fabriclab.model.document import DocumentError, read
from fabriclab.report import numbers_table
from fabriclab.rundirs import load_document
from testbed.errors import ConfigError
from traffic.measure.results import CollectiveResult

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = ROOT / "fabriclab" / document.SCHEMA_FILE
#: a quickstart run's results.json as the release before the typed document wrote it
BEFORE = Path(__file__).parent / "data" / "results" / "quickstart-before-version.json"


def _before() -> dict:
    return json.loads(BEFORE.read_text())


def test_the_published_schema_is_the_documents():
    assert json.loads(PUBLISHED.read_text()) == document.json_schema(), (
        "python -m tests.unit.test_document writes it anew")
    jsonschema.Draft202012Validator.check_schema(document.json_schema())


def test_results_of_the_release_before_read_round_trip_and_report():
    raw = _before()
    assert "version" not in raw
    doc = read(copy.deepcopy(raw))
    assert doc.version == 1 and doc.complete and doc.experiment == "quickstart"
    # nothing lost, nothing added: version 3's name for when transfers ended from the start
    renamed = copy.deepcopy(raw)
    for row in renamed["collectives"]:
        row["flow_end_s"] = row.pop("flow_completion_s")
    assert doc.to_json() == renamed
    jsonschema.validate(renamed, document.json_schema())
    ar, a2a = doc.collectives[0], doc.collectives[-1]
    assert (ar.op, a2a.op) == ("all_reduce", "all_to_all")
    assert ar.flow_end_s.p99 and ar.transport.transport == "tcp"
    assert ar.fct_s.p99 is None  # not measured before version 3
    assert doc.congestion.utilization["edge->host"].max > 0
    assert doc.prediction.collectives[0].predicted_s > 0 and doc.fidelity.verdict == "ok"
    assert "all_reduce" in numbers_table(doc) and tables.collectives(doc).row_count == 2  # 2 sizes


def test_what_a_run_writes_is_version_3_and_valid_against_the_schema():
    doc = results.new_document("x", "x.yaml", "now", {"topology": "leaf_spine", "leaves": 2})
    results.add_rows(doc, 0, [CollectiveResult("all_reduce", "ring", ["a", "b"], 1 << 20,
                                               1e6, 0.001, 0.001, 0.9, 0.8,
                                               {"p50": 0.5, "p99": 0.9, "max": 1.0},
                                               transport={"transport": "uet", "rccc": True,
                                                          "tx_grants": 4})], 1)
    results.finish(doc)
    out = doc.to_json()
    assert out["version"] == document.VERSION == 3
    assert out["fabric"] == {"topology": "leaf_spine", "leaves": 2}  # its own shape's keys
    jsonschema.validate(out, document.json_schema())
    assert read(json.loads(json.dumps(out))) == doc
    assert doc.collectives[0].transport.label == "uet RUD+RCCC"
    assert doc.collectives[0].transport.counter("tx_grants") == 4


def test_a_wrong_value_is_named_by_its_field(tmp_path):
    raw = _before()
    raw["collectives"][1]["bytes"] = "4 MiB"
    with pytest.raises(DocumentError) as err:
        read(raw)
    assert err.value.field == "collectives[1].bytes" and "integer" in err.value.message
    raw = _before()
    raw["congestion"]["ports"]["edge1_1-eth1"] = {"queue_p99_bytes": None}
    with pytest.raises(DocumentError, match=r"congestion\.ports\.edge1_1-eth1\.queue_p99_bytes"):
        read(raw)
    for bad, field in (([], ""), ({"version": "2"}, "version"), ({"version": 0}, "version"),
                       ({"collectives": [{"op": "x"}]}, "collectives[0].bytes"),
                       ({"fabric": []}, "fabric")):
        with pytest.raises(DocumentError) as err:
            read(bad)
        assert err.value.field == field, bad
    (tmp_path / "results.json").write_text(json.dumps({"complete": "yes"}))
    with pytest.raises(ConfigError, match=r"results\.json: complete.*expected a boolean"):
        load_document(tmp_path / "results.json")


def test_a_later_versions_keys_are_kept_and_written_back():
    raw = _before() | {"version": 99, "seed": 7, "provenance": {"datapath": "ebpf",
                                                               "since_v99": 1}}
    raw["collectives"][0]["slowdown_p99"] = 1.4
    for row in raw["collectives"]:
        row["flow_end_s"] = row.pop("flow_completion_s")
    raw["congestion"]["ports"]["edge1_1-eth1"]["ecn_marked"] = 3
    doc = read(copy.deepcopy(raw))
    assert doc.version == 99 and doc.extra == {"seed": 7}
    assert doc.provenance.datapath == "ebpf" and doc.provenance.extra == {"since_v99": 1}
    assert doc.collectives[0].extra == {"slowdown_p99": 1.4}
    assert doc.to_json() == raw


def test_a_field_set_after_reading_is_written_even_where_the_json_had_none():
    doc = read({"experiment": "x", "complete": True})
    assert doc.to_json() == {"experiment": "x", "complete": True}
    results.fail(doc, "boom")
    doc.version = document.VERSION
    assert doc.to_json() == {"experiment": "x", "complete": False, "error": "boom",
                             "version": document.VERSION}


if __name__ == "__main__":
    PUBLISHED.write_text(json.dumps(document.json_schema(), indent=1) + "\n")
    print(f"{PUBLISHED.relative_to(ROOT)}: written")
