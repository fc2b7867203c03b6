"""``fabriclab predict FILE``: every collective's predicted time on the fabric as built and
routed, per variant or sweep cell, with no fabric built (:mod:`fabriclab.model.prediction`)."""

from __future__ import annotations

import time

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fabriclab.cli.output import EXIT_OK, emit
from fabriclab.cli.requests import PredictRequest
from fabriclab.model import experiment as xp
from fabriclab.model.prediction import WHAT, document, targets


def predict(req: PredictRequest, ui: Console) -> int:
    docs = []
    for path in req.files:
        began = time.monotonic()
        exp = xp.load(path)
        runs = [(name, document(x, req.draws, req.share_cv)) for name, x in targets(exp)]
        took = time.monotonic() - began
        for name, doc in runs:
            ui.print(_table(exp.name, name, doc))
        ui.print(f"{escape(str(path))}: {sum(len(d['collectives']) for _n, d in runs)} "
                 f"collectives predicted in {took:.2f} s")
        docs.append({"file": str(path), "experiment": exp.name, "seconds": round(took, 3),
                     "runs": [{"name": name, **doc} for name, doc in runs]})
    ui.print(f"model: {WHAT}")
    if req.json:
        emit(docs)
    return EXIT_OK


def _table(experiment: str, name: str, doc: dict) -> Table:
    title = f"{experiment}{' / ' + name if name else ''}: predicted ({doc['routing']})"
    table = Table(title=title)
    for column in ("job", "collective", "op", "predicted s", "range s", "busbw GB/s",
                   "busiest link"):
        table.add_column(column, justify="right" if column.endswith(("s", "GB/s")) else "left")
    for row in doc["collectives"]:
        spread = (f"{row['low_s']:.3f}-{row['high_s']:.3f}" if row["high_s"] > row["low_s"]
                  else "-")
        table.add_row(str(row["job"]), escape(row["label"]), row["op"],
                      f"{row['predicted_s']:.3f}", spread, f"{row['busbw_GBps']:.4f}",
                      escape(row["busiest_link"]))
    return table
