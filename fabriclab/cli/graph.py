"""``fabriclab graph FILE``: the experiment's topology drawn before anything is built, as
Graphviz DOT or Mermaid text, the topology file a controller app reads (JSON), or a PNG or
SVG picture (tiers from the hosts up, link width and
colour by rate, scale-up links dotted, server GPUs labelled by server)."""

from __future__ import annotations

import json
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
    if req.format in ("dot", "mermaid", "json"):
        text = {"dot": to_dot, "mermaid": to_mermaid,
                "json": lambda t: json.dumps(t.to_dict(), indent=1) + "\n"}[req.format](topo)
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
