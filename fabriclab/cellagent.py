"""A cluster machine's actor for ``fabriclab run --parallel`` (adapter): the testbed's
:class:`testbed.cluster.agent.MachineAgent` and, on top, whole sweep cells run on that machine.

A cell arrives as data, never as code: the experiment's document (plain JSON values), the path
its relative files are read from, and the cell's name, each checked here before anything runs
(the document is validated as any experiment file is). Ray carries the call; what it carries
can make this actor run nothing but fabriclab's own run of a valid experiment."""

from __future__ import annotations

import json
import shutil
import time
import uuid

from testbed.cluster.agent import MachineAgent, machine_state_dir
from testbed.errors import ConfigError, TestbedError, printable

#: the longest cell name accepted (a sweep's cell names are its axes' short labels)
MOST_NAME_CHARS = 500


def checked_cell(doc: object, source: object, name: object) -> tuple[dict, str, str]:
    """A cell's document, source path and name as they must arrive (plain JSON values, two
    strings); raises ConfigError naming what is wrong."""
    if not isinstance(name, str) or not 0 < len(name) <= MOST_NAME_CHARS:
        raise ConfigError("cell", f"a cell's name is a string of 1-{MOST_NAME_CHARS} "
                                  "characters")
    if not isinstance(source, str) or "\0" in source:
        raise ConfigError("cell", f"cell {printable(name)}: its source is a path")
    try:
        data = json.loads(json.dumps(doc, allow_nan=False))
    except (TypeError, ValueError) as err:
        raise ConfigError("cell", f"cell {printable(name)}: its document is not plain "
                                  f"JSON data ({err})") from None
    if not isinstance(data, dict):
        raise ConfigError("cell", f"cell {printable(name)}: its document is not a mapping")
    for key in ("sweep", "variants", "cluster"):
        if key in data:
            raise ConfigError(f"cell.{key}", f"cell {printable(name)}: a cell is one run on "
                                             "one machine")
    return data, source, name


class CellAgent(MachineAgent):
    """A machine's actor that also runs whole cells."""

    def run_cell(self, doc: object, source: object, name: object) -> dict:
        """Validate a cell (:func:`checked_cell`, then the document as an experiment, its
        relative files read from ``source``'s folder on this machine) and run it here alone;
        returns its run directory's files (``relative path -> bytes``) and its error, if it
        failed (a refused cell: its reason, nothing run)."""
        from fabriclab.model import experiment as xp
        from fabriclab.runner import run_experiment

        try:
            data, source, name = checked_cell(doc, source, name)
            exp = xp.parse(data, source)
        except ConfigError as err:
            return {"files": {}, "error": f"config error: {err}"}
        state = machine_state_dir(self.name)
        out = state / "cells" / f"{time.time_ns()}-{uuid.uuid4().hex[:8]}"
        error = None
        try:
            try:
                run_experiment(exp, out, state)
            except (ConfigError, TestbedError) as err:
                error = str(err)
            files = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*")
                     if p.is_file()}
        finally:
            shutil.rmtree(out, ignore_errors=True)
        return {"files": files, "error": error}
