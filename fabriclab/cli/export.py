"""``fabriclab export FILE``: an experiment as another tool reads it, nothing built. htsim
(ultraethernet/uet-htsim): per variant (or the experiment, without any) its topology and
connection matrix files and the command line that runs them (NAME.cmd), in real units when the
file is time-scaled. containerlab, networkx (node-link JSON), gml, hpcc: the fabric's topology
as those tools read it; mininet: a topology module ``mn --custom`` loads."""

from __future__ import annotations

import shlex
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from fabriclab.cli.output import EXIT_OK, emit
from fabriclab.cli.requests import ExportRequest
from fabriclab.model import experiment as xp
from fabriclab.model import htsim, prediction, topofiles
from testbed.linux.files import make_dirs, write_text_atomic

#: the simulated time htsim runs for: this many times the predicted workload (flows that have
#: not finished by then are reported unfinished by htsim)
END_MARGIN = 5.0


#: the topology formats ``--format`` writes (one file: NAME.EXT)
TOPOLOGY_FILES = {"containerlab": "clab.yml", "networkx": "json", "gml": "gml", "hpcc": "txt",
                  "mininet": "py"}


def export(req: ExportRequest, ui: Console) -> int:
    exp = xp.load(req.file)
    out = req.out or Path(f"export-{exp.name}")
    make_dirs(out)
    if req.format in TOPOLOGY_FILES:
        return _topology(req, exp, out, ui)
    docs = []
    for name, one in prediction.targets(exp):
        n = one.time_scale.n if one.time_scale else 1.0
        real_s = prediction.workload_wall_s(one) / n
        made = htsim.export(one, max(100.0, END_MARGIN * real_s * 1e6))
        for file, text in made.files.items():
            write_text_atomic(out / file, text)
        line = shlex.join(made.command)
        write_text_atomic(out / f"{made.name}.cmd", line + "\n")
        ui.print(f"{escape(made.name)}: {escape(str(out))}/{{{', '.join(made.files)}}}")
        ui.print(f"  cd {escape(str(out))} && {escape(line)}")
        for note in made.notes:
            ui.print(f"  note: {escape(note)}")
        docs.append({"name": made.name, "files": sorted(made.files), "command": made.command,
                     "notes": made.notes})
    if req.json:
        emit({"format": req.format, "out": str(out), "exports": docs})
    return EXIT_OK


def _topology(req: ExportRequest, exp: xp.Experiment, out: Path, ui: Console) -> int:
    """The fabric (each variant's where they differ) in a topology format."""
    docs = []
    for name, one in prediction.targets(exp):
        delays = {tier: one.fabric.link(tier).delay_us for tier in ("host", "fabric")}
        name = name or exp.name
        path = out / f"{name}.{TOPOLOGY_FILES[req.format]}"
        write_text_atomic(path, topofiles.write(req.format, one.topology, delays))
        ui.print(f"{escape(name)}: {escape(str(path))}")
        if req.format == "mininet":
            ui.print(f"  sudo mn --custom {escape(str(path))} --topo fabriclab "
                     "--switch lxbr,stp=1 --controller none --test settled_pingall")
        docs.append({"name": name, "files": [path.name]})
    if req.json:
        emit({"format": req.format, "out": str(out), "exports": docs})
    return EXIT_OK
