"""``fabriclab graph FILE``: the experiment's topology drawn before anything is built, as
Graphviz DOT or Mermaid text, or a PNG or SVG picture (tiers from the hosts up, link width and
colour by rate, scale-up links dotted, server GPUs labelled by server)."""

from __future__ import annotations

import sys

import matplotlib.pyplot as plt
from rich.console import Console

from fabriclab.cli.output import EXIT_OK
from fabriclab.cli.requests import GraphRequest
from fabriclab.drawing import draw
from fabriclab.model import experiment as xp
from fabriclab.model.graph import to_dot, to_mermaid


def graph(req: GraphRequest, ui: Console) -> int:
    exp = xp.load(req.file)
    topo = exp.topology
    if req.format in ("dot", "mermaid"):
        text = to_dot(topo) if req.format == "dot" else to_mermaid(topo)
        if req.out is None:
            sys.stdout.write(text)
        else:
            req.out.write_text(text)
            ui.print(f"{req.format}: {req.out}")
        return EXIT_OK
    out = req.out or req.file.with_suffix(f".{req.format}").name
    fig = draw(topo, exp.name)
    fig.savefig(out, format=req.format, dpi=150, bbox_inches="tight")
    plt.close(fig)
    ui.print(f"{req.format}: {out}")
    return EXIT_OK
