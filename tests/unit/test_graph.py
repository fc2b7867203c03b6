"""``fabriclab graph``: the topology drawn before anything is built, as text and pictures."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from fabriclab.model import experiment as xp
from fabriclab.model.graph import layout, rate_text, to_dot, to_mermaid

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["quickstart", "leaf-spine", "rails", "fat-tree-k6"])
def test_every_node_and_link_is_drawn_tier_above_tier(name):
    topo = xp.load(ROOT / "experiments" / f"{name}.yaml").topology
    pos = layout(topo)
    scale_up = {l.b.node for l in topo.scale_up} | {l.a.node for l in topo.scale_up}
    assert set(pos) == set(topo.nodes) | scale_up
    for link in topo.links:  # a host below its switch, a switch below the next tier's
        low, high = sorted((link.a.node, link.b.node), key=lambda n: pos[n][1])
        assert pos[low][1] < pos[high][1] or topo.kind == "ring", link
    dot, mermaid = to_dot(topo), to_mermaid(topo)
    edges = len(topo.links) + len(topo.scale_up)
    assert dot.count(" -- ") == edges and mermaid.count(" ---|") == edges
    assert all(f'"{n}"' in dot for n in pos)
    assert dot.count("rank=same") == len({t for _, t in pos.values()})
    assert all(re.fullmatch(r"[A-Za-z0-9_]+", n) for n in pos)  # Mermaid ids as they are


def test_hosts_sit_under_their_switch():
    topo = xp.load(ROOT / "experiments" / "quickstart.yaml").topology
    pos = layout(topo)
    xs = [pos[h.name][0] for h in sorted(topo.hosts, key=lambda h: pos[h.name][0])]
    access = [pos[topo.attachment(h.name).node][0]
              for h in sorted(topo.hosts, key=lambda h: pos[h.name][0])]
    assert access == sorted(access) and xs == sorted(xs)


def test_rates_read_as_people_say_them():
    assert [rate_text(r) for r in (10, 150, 1000, 2500, 400000)] == \
        ["10 Mbit/s", "150 Mbit/s", "1 Gbit/s", "2.5 Gbit/s", "400 Gbit/s"]


@pytest.mark.parametrize("fmt, magic", [("png", b"\x89PNG"), ("svg", b"<?xml")])
def test_the_command_writes_a_picture(tmp_path, fmt, magic):
    out = tmp_path / f"rails.{fmt}"
    proc = subprocess.run([sys.executable, "-m", "fabriclab.cli", "graph",
                           str(ROOT / "experiments" / "rails.yaml"), "--format", fmt, "-o",
                           str(out)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes().startswith(magic) and out.stat().st_size > 10_000
    text = subprocess.run([sys.executable, "-m", "fabriclab.cli", "graph",
                           str(ROOT / "experiments" / "rails.yaml"), "--format", "mermaid"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120).stdout
    assert text.startswith("flowchart BT") and "s1g1 ---|400 Mbit/s| nvs1" in text


def test_a_runs_drawing_colours_links_by_use_and_marks_the_failed_one():
    """The report draws the same picture, links by their measured utilization, a failed link
    dashed red (by its name or its nodes)."""
    import matplotlib.pyplot as plt

    from fabriclab.drawing import draw

    topo = xp.load(ROOT / "experiments" / "leaf-spine.yaml").topology
    busy = topo.find_link("leaf1", "spine1")
    fig = draw(topo, "run", load={busy.name: 0.9}, failed=frozenset({"leaf2-spine2"}))
    lines = fig.axes[0].get_lines()
    widths = sorted(line.get_linewidth() for line in lines if line.get_xydata().size)
    dashed_red = [line for line in lines if line.get_linestyle() == "--"
                  and line.get_color() == "red" and line.get_xydata().size]
    assert len(dashed_red) == 1 and widths[-1] > 3.5 > widths[0]
    assert len(fig.axes) == 2  # the utilization colour scale
    plt.close(fig)


def test_the_topology_file_an_app_reads_comes_out_of_graph():
    """``graph --format json`` prints the file a controller app finds in FABRICLAB_TOPOLOGY:
    the model's own dictionary, which reads back into the same topology."""
    import json

    from fabriclab.model import experiment as xp
    from testbed.model.topology import from_dict

    path = ROOT / "experiments" / "quickstart.yaml"
    proc = subprocess.run([sys.executable, "-m", "fabriclab.cli", "graph", str(path),
                           "--format", "json"], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    topo = xp.load(path).topology
    assert doc == json.loads(json.dumps(topo.to_dict()))
    again = from_dict(doc)
    assert [(l.a, l.b) for l in again.links] == [(l.a, l.b) for l in topo.links]
