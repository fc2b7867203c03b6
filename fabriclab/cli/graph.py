"""``fabriclab graph FILE``: the experiment's topology drawn before anything is built, as
Graphviz DOT or Mermaid text, or a PNG or SVG picture (tiers from the hosts up, link width and
colour by rate, scale-up links dotted, server GPUs labelled by server)."""

from __future__ import annotations

import math
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from rich.console import Console  # noqa: E402

from fabriclab.cli.output import EXIT_OK  # noqa: E402
from fabriclab.cli.requests import GraphRequest  # noqa: E402
from fabriclab.model import experiment as xp  # noqa: E402
from fabriclab.model.graph import layout, rate_text, to_dot, to_mermaid  # noqa: E402
from testbed.model.topology import Topology  # noqa: E402

COLOURS = {"host": "#8c8c8c", "edge": "#4a6fa5", "leaf": "#4a6fa5", "agg": "#6b8e23",
           "spine": "#6b8e23", "core": "#b8860b", "nvswitch": "#7b3294"}
LABEL_HOSTS_UP_TO = 64  # more hosts than this: hosts unlabelled (a k=8 fat-tree has 128)


def draw(topo: Topology, title: str, ax=None):
    """The topology on ``ax`` (a new figure when None); returns the figure."""
    pos = layout(topo)
    fig = None
    if ax is None:
        width = min(40.0, max(8.0, 0.35 * max(sum(1 for _, t in pos.values() if t == tier)
                                               for tier in {t for _, t in pos.values()})))
        fig, ax = plt.subplots(figsize=(width, 5.5))
    rates = sorted({l.rate_mbps for l in (*topo.links, *topo.scale_up)})
    cmap = plt.get_cmap("viridis")

    def shade(rate: float) -> tuple:
        if len(rates) == 1:
            return cmap(0.35)
        span = math.log(rates[-1] / rates[0]) or 1.0
        return cmap(0.1 + 0.8 * math.log(rate / rates[0]) / span)

    for link in (*topo.links, *topo.scale_up):
        (xa, ya), (xb, yb) = pos[link.a.node], pos[link.b.node]
        ax.plot([xa, xb], [ya, yb], color=shade(link.rate_mbps), zorder=1,
                lw=0.6 + 1.6 * (rates.index(link.rate_mbps) / max(1, len(rates) - 1)),
                ls=":" if link.tier == "scale_up" else "-")
    hosts = [n for n, (_, t) in pos.items() if t == 0]
    for name, (x, y) in pos.items():
        role = topo.nodes[name].role if name in topo.nodes else "nvswitch"
        ax.scatter([x], [y], s=25 if role == "host" else 110, color=COLOURS.get(role, "#333"),
                   zorder=2, marker="o" if role == "host" else "s")
        if role != "host" or len(hosts) <= LABEL_HOSTS_UP_TO:
            ax.text(x, y + (-0.07 if role == "host" else 0.12), name, ha="center",
                    va="top" if role == "host" else "bottom",
                    fontsize=6 if role == "host" else 7, rotation=90 if role == "host" else 0)
    for rate in rates:
        ax.plot([], [], color=shade(rate), lw=2, label=rate_text(rate))
    if topo.scale_up:
        ax.plot([], [], color="#555", ls=":", label="scale-up")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False,
              title="links", title_fontsize=7)
    counts = topo.counts()
    ax.set_title(f"{title}: {topo.kind}, {counts['switches']} switches, {counts['hosts']} "
                 f"hosts, {counts['links']} links", fontsize=9)
    ax.set_axis_off()
    ax.set_xlim(-0.02, 1.02)
    tiers = [t for _, t in pos.values()]
    ax.set_ylim(min(tiers) - 0.6, max(tiers) + 0.45)
    return fig if fig is not None else ax.figure


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
