"""The topology drawn (matplotlib): ``fabriclab graph``'s picture and the report's, one
drawing. Positions come from :func:`fabriclab.model.graph.layout` (tiers from the hosts up);
links are coloured by their rate, or, for a run, by their measured utilization with failed
links dashed red."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fabriclab.model.graph import layout, rate_text  # noqa: E402
from testbed.model.topology import Link, Topology  # noqa: E402

COLOURS = {"host": "#8c8c8c", "edge": "#4a6fa5", "leaf": "#4a6fa5", "agg": "#6b8e23",
           "spine": "#6b8e23", "core": "#b8860b", "nvswitch": "#7b3294"}
LABEL_HOSTS_UP_TO = 64  # more hosts than this: hosts unlabelled (a k=8 fat-tree has 128)


def draw(topo: Topology, title: str, load: dict[str, float] | None = None,
         failed: frozenset[str] = frozenset()):
    """The topology in a new figure, returned. ``load``: each link's mean utilization (0..1)
    by link name, which then colours and widens the links instead of their rates;
    ``failed``: links (by name, or ``a-b`` of their nodes) drawn dashed red."""
    pos = layout(topo)
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

    heat = plt.get_cmap("YlOrRd")
    for link in (*topo.links, *topo.scale_up):
        (xa, ya), (xb, yb) = pos[link.a.node], pos[link.b.node]
        if _failed(link, failed):
            ax.plot([xa, xb], [ya, yb], color="red", lw=1.0, ls="--", zorder=1)
            ax.text((xa + xb) / 2, (ya + yb) / 2, "x", color="red", ha="center", va="center",
                    fontsize=12, zorder=3)
        elif load is not None:
            used = min(1.0, load.get(link.name, 0.0))
            ax.plot([xa, xb], [ya, yb], color=heat(0.15 + 0.85 * used), lw=1.0 + 3.0 * used,
                    ls=":" if link.tier == "scale_up" else "-", zorder=1)
        else:
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
    if load is not None:
        fig.colorbar(plt.cm.ScalarMappable(cmap=heat, norm=plt.Normalize(0, 100)), ax=ax,
                     fraction=0.02, pad=0.01, label="mean utilization, % (busier direction)")
    else:
        for rate in rates:
            ax.plot([], [], color=shade(rate), lw=2, label=rate_text(rate))
    if topo.scale_up:
        ax.plot([], [], color="#555", ls=":", label="scale-up")
    if failed:
        ax.plot([], [], color="red", ls="--", label="failed")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False,
                  title="links", title_fontsize=7)
    counts = topo.counts()
    ax.set_title(f"{title}: {topo.kind}, {counts['switches']} switches, {counts['hosts']} "
                 f"hosts, {counts['links']} links", fontsize=9)
    ax.set_axis_off()
    ax.set_xlim(-0.02, 1.02)
    tiers = [t for _, t in pos.values()]
    ax.set_ylim(min(tiers) - 0.6, max(tiers) + 0.45)
    return fig


def _failed(link: Link, failed: frozenset[str]) -> bool:
    a, b = link.a.node, link.b.node
    return bool(failed) and (link.name in failed or f"{a}-{b}" in failed or f"{b}-{a}" in failed)


