"""No input makes ``fabriclab validate`` raise anything but a field-named error, and none takes
more than 2 s: experiment files generated from the schema (hypothesis-jsonschema), the shipped
experiments mutated (a node replaced by a hostile value, keys dropped or added, the text cut
and spliced), JSON-lines traces and NCCL logs mutated the same way. Each case runs the whole
``validate`` command in-process (load, model, fidelity, ECN and PFC explanations) on a file.

Sweeps (axes over any field of a shipped file, hostile values and repetitions), training jobs
(every count made hostile) and nesting (thousands of levels of YAML flow collections) are
drawn too. About 10,000 cases per run (:data:`CASES`); ``FABRICLAB_PROPERTY_SCALE`` multiplies them. The
cases are the same from run to run (a fixed seed: a test run does not pass or fail by draw);
``FABRICLAB_PROPERTY_EXPLORE=1`` draws new ones, which is how the suite found what it found."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema
from rich.console import Console

from fabriclab.cli.experiments import validate
from fabriclab.cli.requests import ValidateRequest
from fabriclab.model.experiment import schema

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "experiments").glob("*.yaml"))
NCCL = sorted((ROOT / "tests" / "unit" / "data" / "nccl").glob("*.log"))
SCALE = float(os.environ.get("FABRICLAB_PROPERTY_SCALE", "1"))
EXPLORE = os.environ.get("FABRICLAB_PROPERTY_EXPLORE") == "1"
#: generated cases per test, by test (their sum is the run's count)
CASES = {"schema": 150, "mutated": 3_000, "text": 1_700, "trace": 1_800, "nccl": 1_800,
         "sweep": 700, "training": 700, "nesting": 300}
LIMIT_S = 2.0
EXIT_OK, EXIT_CONFIG = 0, 2
TRACE = [{"op": "all_reduce", "size": "1MiB", "ranks": 4},
         {"op": "all_to_all", "size": 65536, "ranks": 4, "concurrent": True, "t_s": 0.5},
         {"op": "flows", "pattern": "permutation", "size": "64KiB"}]


def _settings(name: str):
    return settings(max_examples=max(1, int(CASES[name] * SCALE)), deadline=None,
                    database=None, derandomize=not EXPLORE,
                    suppress_health_check=list(HealthCheck))


def _validate(path: Path) -> tuple[int, str]:
    """``fabriclab validate PATH`` in-process: (its exit code, what it printed); fails the
    test on any exception or on a run over :data:`LIMIT_S`."""
    out = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stderr(out):  # where errors go
        code = validate(ValidateRequest([path]), Console(file=out, width=200))
    took = time.perf_counter() - start
    assert took < LIMIT_S, f"validate took {took:.2f} s on:\n{path.read_text()[:2000]}"
    assert code in (EXIT_OK, EXIT_CONFIG), out.getvalue()
    if code == EXIT_CONFIG:  # a field named: "<file>: config error: <field>: <why>"
        assert "config error: " in out.getvalue() or "over " in out.getvalue(), out.getvalue()
    return code, out.getvalue()


# -- hostile values --------------------------------------------------------------------------
NUMBERS = st.one_of(
    st.integers(), st.integers(min_value=-(10 ** 30), max_value=10 ** 30),
    st.sampled_from([0, -1, 1, 2, 3, 2 ** 31, 2 ** 63, 10 ** 308, 10 ** 4000]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, 1e308, 1e-320, 0.5, 1e23]))
SCALARS = st.one_of(NUMBERS, st.booleans(), st.none(), st.text(max_size=40),
                    st.sampled_from(["", ".", "..", "../x", "/etc/passwd", "1GiB", "1e99GiB",
                                     "-1MiB", "all", "nan", "ecmp", "leaf_spine", "fat_tree",
                                     "x" * 300, "\0", "*alias", "&anchor"]))
def _nested(inner):
    return st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                         max_size=4)


VALUES = st.recursive(SCALARS, _nested, max_leaves=8)


def _paths(node, prefix=()) -> list[tuple]:
    """Every path to a node of a parsed document."""
    out = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += _paths(value, prefix + (i,))
    return out


def _replace(doc, path: tuple, value):
    if not path:
        return value
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = value
    return doc


def _drop(doc, path: tuple):
    if path:
        parent = doc
        for step in path[:-1]:
            parent = parent[step]
        del parent[path[-1]]
    return doc


@st.composite
def mutated_documents(draw, sources: list):
    """A shipped document with 1-3 mutations: a node replaced, a key dropped, a key added."""
    doc = json.loads(json.dumps(draw(st.sampled_from(sources))))
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths))
        action = draw(st.sampled_from(["replace", "replace", "drop", "add"]))
        if action == "replace" or not path:
            doc = _replace(doc, path, draw(VALUES))
        elif action == "drop":
            doc = _drop(doc, path)
        else:
            parent = doc
            for step in path[:-1]:
                parent = parent[step]
            if isinstance(parent, dict):
                parent[draw(st.sampled_from(["variants", "k", "extra", "ranks", "size",
                                             "rate_mbps", "sweep", "repetitions"]))] = \
                    draw(VALUES)
    return doc


@st.composite
def spliced_text(draw, texts: list[str]):
    """A text cut, spliced and its characters changed (what a careless edit makes)."""
    text = draw(st.sampled_from(texts))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(text)))
        edit = draw(st.sampled_from(["insert", "delete", "duplicate"]))
        if edit == "insert":
            text = text[:at] + draw(st.sampled_from(
                ["{", "}", "[", ":", "- ", "\n", "  ", "&a ", "*a", "!!python/object ",
                 "9" * 60, ".nan", "\t", "'", '"', "\\", "\x85", "\ufeff"])) + text[at:]
        elif edit == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 20)):]
        else:
            end = min(len(text), at + draw(st.integers(1, 200)))
            text = text[:end] + text[at:end] + text[end:]
    return text


def _yaml(doc) -> str:
    try:
        return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
    except (yaml.YAMLError, ValueError, OverflowError):
        return json.dumps(doc, default=str)


SHIPPED_DOCS = [yaml.safe_load(p.read_text()) for p in SHIPPED]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A folder with the shipped experiments' neighbours (traces, logs) for relative paths."""
    path = tmp_path_factory.mktemp("properties")
    for log in NCCL:
        (path / log.name).write_text(log.read_text())
    (path / "job.jsonl").write_text("".join(json.dumps(e) + "\n" for e in TRACE))
    return path


def _validate_document(path: Path, doc, seen: dict[str, int]) -> None:
    """``doc`` written as YAML to ``path`` and validated (:func:`_validate`); ``seen`` counts
    the files that built and those refused by field."""
    path.write_text(_yaml(doc))
    code, _ = _validate(path)
    seen["ok" if code == EXIT_OK else "config"] += 1


# -- the properties ---------------------------------------------------------------------------
def test_schema_generated_experiments_validate_or_name_a_field(folder):
    """Documents the schema allows: each builds what it says, or is refused by field (a
    semantic rule beyond the schema), within 2 s."""
    seen = {"ok": 0, "config": 0}

    @_settings("schema")
    @given(from_schema(copy.deepcopy(schema())))  # (it rewrites the schema it is given)
    def check(doc):
        _validate_document(folder / "generated.yaml", doc, seen)

    check()
    assert sum(seen.values()) >= max(1, int(CASES["schema"] * SCALE)), seen


def test_mutated_shipped_experiments_validate_or_name_a_field(folder):
    seen = {"ok": 0, "config": 0}

    @_settings("mutated")
    @given(mutated_documents(SHIPPED_DOCS))
    def check(doc):
        _validate_document(folder / "mutated.yaml", doc, seen)

    check()
    assert seen["ok"] > 0 and seen["config"] > 0, seen


def test_spliced_experiment_text_validates_or_names_a_field(folder):
    texts = [p.read_text() for p in SHIPPED] + [
        p.read_text() for p in sorted((ROOT / "tests" / "unit" / "bad").glob("*.yaml"))
        if p.stat().st_size < 4096]

    @_settings("text")
    @given(spliced_text(texts))
    def check(text):
        path = folder / "spliced.yaml"
        path.write_text(text)
        _validate(path)

    check()


def _workload_file(folder: Path, name: str, workload: str) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text("version: 1\nname: replay\nfabric: {topology: fat_tree, k: 4}\n"
                    f"workload: {{{workload}}}\n")
    return path


def test_mutated_traces_validate_or_name_a_line(folder):
    lines = [json.dumps(e) for e in TRACE]

    @_settings("trace")
    @given(st.one_of(
        st.lists(mutated_documents(TRACE), min_size=1, max_size=6).map(
            lambda docs: "\n".join(json.dumps(d, default=str) for d in docs)),
        spliced_text(["\n".join(lines)])))
    def check(text):
        (folder / "mutated.jsonl").write_text(text)
        code, out = _validate(_workload_file(folder, "trace", "trace: mutated.jsonl"))
        if code == EXIT_CONFIG:
            assert "mutated.jsonl" in out or "workload" in out, out

    check()


def test_mutated_nccl_logs_validate_or_name_a_line(folder):
    logs = [p.read_text() for p in NCCL]
    fields = ["opCount", "count", "datatype", "nranks=", "comm", "root", "NCCL INFO"]

    @st.composite
    def edited(draw):
        text = draw(spliced_text(logs))
        lines = text.splitlines()
        for _ in range(draw(st.integers(0, 3))):  # a number in a field made hostile
            if not lines:
                break
            i = draw(st.integers(0, len(lines) - 1))
            field = draw(st.sampled_from(fields))
            lines[i] = lines[i].replace(field, f"{field} {draw(st.sampled_from(['9' * 5000, '-1', 'ffffffffffffffffffff', '', 'nan', '0x']))}", 1)
        return "\n".join(lines)

    @_settings("nccl")
    @given(edited())
    def check(text):
        (folder / "mutated.log").write_text(text)
        _validate(_workload_file(folder, "nccl", "nccl_log: mutated.log"))

    check()


SWEEPABLE = [d for d in SHIPPED_DOCS if "workload" in d]


@st.composite
def swept_documents(draw):
    """A shipped experiment with a sweep over a few of its own fields (values drawn as the
    mutations draw them, lists of up to 12) and a hostile repetition count."""
    doc = json.loads(json.dumps(draw(st.sampled_from(SWEEPABLE))))
    doc.pop("sweep", None)
    leaves = [p for p in _paths(doc) if p and all(isinstance(k, str) for k in p)
              and p[0] not in ("version", "name", "description")]
    axes = {}
    for _ in range(draw(st.integers(1, 4))):
        path = ".".join(draw(st.sampled_from(leaves)))
        axes[path] = draw(st.lists(st.one_of(NUMBERS, SCALARS), min_size=0, max_size=12))
    doc["sweep"] = {"axes": axes,
                    "repetitions": draw(st.one_of(st.integers(-2, 200), NUMBERS))}
    return doc


TRAINING_KEYS = ("iterations", "layers", "micro_batches", "experts", "seq_len", "micro_batch",
                 "tp", "dp", "ep", "pp", "moe_every", "top_k", "hidden", "params")
TRAINED = [d for d in SHIPPED_DOCS if (d.get("workload") or {}).get("training")]


@st.composite
def trained_documents(draw):
    """A shipped training experiment with its counts made hostile (huge ones above all)."""
    doc = json.loads(json.dumps(draw(st.sampled_from(TRAINED))))
    training = doc["workload"]["training"]
    for _ in range(draw(st.integers(1, 4))):
        training[draw(st.sampled_from(TRAINING_KEYS))] = draw(st.one_of(
            st.integers(0, 10 ** 9), st.sampled_from([1, 2, 4, 16, 4096, 96844, 10 ** 8]),
            NUMBERS))
    return doc


def _drawn_documents(folder: Path, name: str, documents) -> dict[str, int]:
    """Each document ``documents`` draws validated (:func:`_validate_document`) as the
    ``name`` cases; returns how many built and how many were refused by field."""
    seen = {"ok": 0, "config": 0}

    @_settings(name)
    @given(documents)
    def check(doc):
        _validate_document(folder / f"{name}.yaml", doc, seen)

    check()
    return seen


def test_sweeps_validate_or_name_a_field_within_bounds(folder):
    seen = _drawn_documents(folder, "sweep", swept_documents())
    assert seen["config"] > 0, seen


def test_training_counts_validate_or_name_a_field_within_bounds(folder):
    seen = _drawn_documents(folder, "training", trained_documents())
    assert seen["ok"] > 0 and seen["config"] > 0, seen


def test_deep_nesting_is_refused_by_name(folder):
    @_settings("nesting")
    @given(st.integers(1, 6000), st.sampled_from(["[", "{a: ", "- "]),
           st.sampled_from(["fabric", "workload", "variants", "sweep"]))
    def check(depth, opener, key):
        closer = {"[": "]", "{a: ": "}", "- ": ""}[opener]
        if opener == "- ":  # block style: each level indented further
            body = "".join("\n" + "  " * (i + 1) + "- " for i in range(min(depth, 400))) + "1"
        else:
            body = opener * depth + "1" + closer * depth
        path = folder / "nested.yaml"
        path.write_text(f"version: 1\nname: nested\n{key}: {body}\n")
        _validate(path)

    check()
