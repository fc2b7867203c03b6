"""A topology as a picture, before anything is built (pure): where each node goes (tiers from
the hosts up, each pod, leaf or rail together, hosts under their switch, scale-up switches
under their servers), and the same as Graphviz DOT and Mermaid text. ``fabriclab graph``
draws it (:mod:`fabriclab.cli.graph`)."""

from __future__ import annotations

from testbed.model.topology import Topology

#: tiers from the bottom: a node's height in the drawing
TIERS = {"nvswitch": -1, "host": 0, "edge": 1, "leaf": 1, "agg": 2, "spine": 2, "core": 3}


def rate_text(mbps: float) -> str:
    """A link rate as people say it: 100 Mbit/s, 2.5 Gbit/s, 400 Gbit/s."""
    if mbps >= 1000:
        value, unit = mbps / 1000, "Gbit/s"
    else:
        value, unit = mbps, "Mbit/s"
    return f"{value:g} {unit}"


def layout(topo: Topology) -> dict[str, tuple[float, int]]:
    """Each node's (x in 0..1, tier): access switches in pod and index order, the tiers above
    in theirs, hosts under their access switch, scale-up switches under their servers."""
    by_tier: dict[int, list[str]] = {}
    for node in topo.nodes.values():
        by_tier.setdefault(TIERS.get(node.role, 0), []).append(node.name)
    by_tier[-1] = sorted({s.switch for s in topo.servers if s.switch})  # NVSwitch-like
    order = {n.name: (n.group, n.index, n.name) for n in topo.nodes.values()}
    pos: dict[str, tuple[float, int]] = {}

    def place(tier: int, names: list[str]) -> None:
        for i, name in enumerate(names):
            pos[name] = ((i + 0.5) / len(names), tier)

    for tier in sorted(t for t in by_tier if t >= 1):
        place(tier, sorted(by_tier[tier], key=order.__getitem__))
    attached = {}
    for host in by_tier.get(0, []):
        access = topo.attachment(host).node if _attached(topo, host) else None
        attached[host] = (pos.get(access, (0.0, 1))[0] if access else 0.0, order[host])
    place(0, sorted(by_tier.get(0, []), key=attached.__getitem__))
    if by_tier.get(-1):
        under = {s.switch: min(pos[g][0] for g in s.gpus) for s in topo.servers
                 if s.switch and all(g in pos for g in s.gpus)}
        place(-1, sorted(by_tier[-1], key=lambda n: (under.get(n, 0.0), n)))
    return pos


def _attached(topo: Topology, host: str) -> bool:
    try:
        topo.attachment(host)
    except (KeyError, ValueError, StopIteration):
        return False
    return True


def _edges(topo: Topology) -> list[tuple[str, str, str, str]]:
    """(node, node, tier, rate text) of every link, once (scale-up links too)."""
    return [(l.a.node, l.b.node, l.tier, rate_text(l.rate_mbps))
            for l in (*topo.links, *topo.scale_up)]


def to_dot(topo: Topology) -> str:
    """Graphviz DOT: one rank per tier, hosts at the bottom, link rates as labels."""
    pos = layout(topo)
    lines = [f'graph "{topo.kind}" {{', "  rankdir=BT;", "  node [fontname=Helvetica];"]
    for tier in sorted({t for _, t in pos.values()}):
        names = sorted((n for n, (_, t) in pos.items() if t == tier), key=lambda n: pos[n][0])
        shape = "ellipse" if tier == 0 else "box"
        lines.append(f"  {{ rank=same; node [shape={shape}]; "
                     + " ".join(f'"{n}";' for n in names) + " }")
    for a, b, tier, rate in _edges(topo):
        lines.append(f'  "{a}" -- "{b}" [label="{rate}", tooltip="{tier}"];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_mermaid(topo: Topology) -> str:
    """Mermaid flowchart text (bottom to top), link rates on the links."""
    pos = layout(topo)
    lines = ["flowchart BT"]
    for name in sorted(pos, key=lambda n: (pos[n][1], pos[n][0])):
        lines.append(f"  {name}([{name}])" if pos[name][1] == 0 else f"  {name}[{name}]")
    for a, b, _tier, rate in _edges(topo):
        lines.append(f"  {a} ---|{rate}| {b}")
    return "\n".join(lines) + "\n"
