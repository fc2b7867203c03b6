"""A directory's runs as tidy tables (:mod:`fabriclab.model.tidy`): read from disk (a run, its
variants, a sweep's cells), written beside them as ``collectives.csv`` and ``flows.csv`` (and
``.parquet`` where pandas and pyarrow are installed: ``pip install fabriclab[frames]``), and
handed to pandas as data frames.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from fabriclab.model import tidy
from fabriclab.model.results import upgrade
from fabriclab.rundirs import read_document
from testbed.errors import ConfigError
from testbed.linux.files import write_bytes_atomic, write_text_atomic

_TABLES = {"collectives": tidy.collective_records, "flows": tidy.flow_records,
           "failures": tidy.failure_records}
KINDS = tuple(_TABLES)
WHY_NO_PARQUET = "pandas and pyarrow are not installed (pip install 'fabriclab[frames]')"


def _flows(directory: Path) -> list[dict]:
    path = directory / "flows.csv"
    if not path.is_file():
        return []
    with open(path, encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def runs(directory: str | Path) -> list[tidy.Run]:
    """Every run under ``directory`` with the parameters that made it: a sweep's cells (its
    axes' values, variant, repetition), a variants run's variants, or the one run.

    Raises:
        ConfigError: ``directory`` holds no run.
    """
    directory = Path(directory)
    if (directory / "sweep.json").is_file():
        cells = upgrade(json.loads((directory / "sweep.json").read_text()))["cells"]
        return [tidy.Run(c["name"], tidy.parameters(c),
                         read_document(directory / c["name"] / "results.json"),
                         _flows(directory / c["name"]), c.get("cell") or c["name"])
                for c in cells]
    if (directory / "variants.json").is_file():
        names = [str(row["variant"]) for row in json.loads(
            (directory / "variants.json").read_text())]
        return [tidy.Run(n, {"variant": n}, read_document(directory / n / "results.json"),
                         _flows(directory / n)) for n in names]
    if (directory / "results.json").is_file():
        return [tidy.Run(directory.name, {}, read_document(directory / "results.json"),
                         _flows(directory))]
    raise ConfigError(str(directory), "holds no run (results.json, variants.json or sweep.json)")


def records(directory: str | Path, kind: str = "collectives") -> list[dict]:
    """The tidy records of ``kind`` (``collectives``, ``flows`` or ``failures``) of every run
    under ``directory``."""
    if kind not in KINDS:
        raise ConfigError("kind", f"{kind!r}: one of {', '.join(KINDS)}")
    return _TABLES[kind](runs(directory))


def dataframe(directory: str | Path, kind: str = "collectives"):
    """:func:`records` as a pandas data frame.

    Raises:
        ConfigError: pandas is not installed.
    """
    try:
        import pandas
    except ImportError:
        raise ConfigError("to_dataframe", WHY_NO_PARQUET) from None
    return pandas.DataFrame.from_records(records(directory, kind))


def write_tables(directory: str | Path) -> list[str]:
    """A sweep's or a variants run's tables across its runs, beside them:
    ``collectives.csv`` and ``flows.csv`` (and ``failures.csv`` where the runs had failures),
    and their Parquet twins where pandas and pyarrow are installed; a single run's Parquet
    twins of its own collectives and flows only (its CSVs are the run's). Returns what it
    wrote (and why no Parquet, if so)."""
    directory = Path(directory)
    found = runs(directory)
    written = []
    single = (directory / "results.json").is_file()
    tables = {kind: table(found) for kind, table in _TABLES.items()}
    if single or not tables["failures"]:  # a run's own: its results.json; none: no table
        del tables["failures"]
    for kind, rows in tables.items():
        if not single:
            write_text_atomic(directory / f"{kind}.csv", tidy.to_csv(rows))
            written.append(f"{kind}.csv")
    try:
        import pandas  # noqa: F401
        import pyarrow  # noqa: F401
    except ImportError:  # a single run's CSVs are all it has then: nothing to say
        return [*written, f"no Parquet: {WHY_NO_PARQUET}"] if written else []
    for kind, rows in tables.items():
        buf = io.BytesIO()
        pandas.DataFrame.from_records(rows).to_parquet(buf, index=False)
        write_bytes_atomic(directory / f"{kind}.parquet", buf.getvalue())
        written.append(f"{kind}.parquet")
    return written


def compare(dirs: list[Path], baseline: str | None = None) -> tuple[list[dict], dict]:
    """``fabriclab compare``: one line per run, variant or sweep cell (over its repetitions)
    of every directory, each job's figures with their change against the baseline line (the
    first, or the one whose name ends with ``baseline``), and the provenance fields the lines
    differ in.

    Raises:
        ConfigError: a directory that holds no run, or a baseline that names none.
    """
    grouped: list[tuple[str, list[tidy.Run]]] = []
    for d in dirs:
        by_group: dict[str, list[tidy.Run]] = {}
        for run in runs(d):
            by_group.setdefault(run.group or run.name, []).append(run)
        single = len(by_group) == 1 and (Path(d) / "results.json").is_file()
        grouped += [(str(d) if single else f"{d}/{g}", rs) for g, rs in by_group.items()]
    lines = tidy.compare_lines(grouped)
    index = 0
    if baseline is not None:
        matches = [i for i, line in enumerate(lines) if line["run"].endswith(baseline)]
        if not matches:
            raise ConfigError("--baseline", f"{baseline!r} names none of the runs: "
                                            + ", ".join(line["run"] for line in lines))
        index = matches[0]
    return tidy.deltas(lines, index), tidy.provenance_diff(lines)


def compare_rows(dirs: list[Path], baseline: str | None = None) -> list[dict]:
    """The runs under each directory, one line each: a sweep's cells (means over their
    repetitions), a run's variants, or a single run. Lines: ``{"run", "complete", "error",
    "jobs": [{"label", "n", "efficiency", "busbw_GBps", "time_us", "fct_p50_s", "fct_p99_s",
    "slowdown_p99", "delta_<each>"}], "provenance", "provenance_differs"}``: each figure's
    change against the baseline line (:func:`compare`), and the provenance
    fields in which the lines differ.

    Raises:
        ConfigError: a directory that holds no run, a baseline that names none.
    """
    lines, differ = compare(dirs, baseline)
    for i, line in enumerate(lines):
        line["provenance_differs"] = {k: values[i] for k, values in differ.items()}
    return lines
