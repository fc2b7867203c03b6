"""Your own topology (testbed/model/custom.py, fabriclab/model/topofiles.py): a custom fabric
built from nodes and links, read from containerlab, networkx, GML and HPCC files, written
back to each and to a Mininet module, and its errors named."""

from __future__ import annotations

from pathlib import Path

import networkx as nx
import pytest

from fabriclab.model import experiment as xp
from fabriclab.model import topofiles
from testbed.errors import ConfigError
from testbed.model.custom import custom

ROOT = Path(__file__).resolve().parents[2]
NODES = [{"name": n, "kind": "switch"} for n in ("s1", "s2", "l1", "l2")] + [
    {"name": h, "kind": "host"} for h in ("a", "b", "c")]
LINKS = [{"a": "l1", "b": "s1"}, {"a": "l1", "b": "s2", "rate_mbps": 40},
         {"a": "l2", "b": "s1"}, {"a": "l2", "b": "s2"},
         {"a": "a", "b": "l1"}, {"a": "b", "b": "l1"}, {"a": "c", "b": "l2", "rate_mbps": 25}]


def _graph(topo) -> set[tuple]:
    """A topology as a comparable set: each link's ends (sorted) and rate."""
    return {(*sorted((l.a.node, l.b.node)), l.rate_mbps) for l in topo.links}


def test_a_custom_fabric_has_its_nodes_links_and_rates_and_routes_by_shortest_paths():
    topo = custom(NODES, LINKS, 100, 50)
    assert [h.name for h in topo.hosts] == ["a", "b", "c"]
    assert {h.name: h.ip for h in topo.hosts} == {"a": "10.0.1.1", "b": "10.0.1.2",
                                                  "c": "10.0.2.1"}
    assert {n: topo.nodes[n].role for n in ("l1", "l2", "s1")} == {
        "l1": "leaf", "l2": "leaf", "s1": "spine"}
    assert _graph(topo) == {("l1", "s1", 50.0), ("l1", "s2", 40.0), ("l2", "s1", 50.0),
                            ("l2", "s2", 50.0), ("a", "l1", 100.0), ("b", "l1", 100.0),
                            ("c", "l2", 25.0)}
    assert len(topo.equal_cost_paths("a", "c")) == 2  # over either spine


@pytest.mark.parametrize("nodes,links,field", [
    ([{"name": "1x", "kind": "host"}], [], "nodes[0].name"),
    ([{"name": "averyverylongname", "kind": "switch"}], [], "nodes[0].name"),
    (NODES[:1] + [{"name": "s1", "kind": "host"}], [], "nodes[1].name"),
    (NODES[:1] + [{"name": "x", "kind": "router"}], [], "nodes[1].kind"),
    (NODES, LINKS + [{"a": "a", "b": "zz"}], "links[7].b"),
    (NODES, LINKS + [{"a": "a", "b": "l2"}], "links[7]"),  # a host on two switches
    (NODES, LINKS + [{"a": "s1", "b": "s1"}], "links[7]"),
    (NODES + [{"name": "d", "kind": "host"}], LINKS, "links"),  # a host without a link
    (NODES + [{"name": "s9", "kind": "switch"}, {"name": "d", "kind": "host"}],
     LINKS + [{"a": "d", "b": "s9"}], "links"),  # not connected
])
def test_a_wrong_node_or_link_is_named(nodes, links, field):
    with pytest.raises(ConfigError) as err:
        custom(nodes, links)
    assert err.value.path == field


def test_each_format_reads_back_what_it_wrote():
    topo = custom(NODES, LINKS, 100, 50)
    for fmt in ("networkx", "gml", "hpcc"):
        nodes, links = topofiles.read(fmt, topofiles.write(fmt, topo, {}))
        again = custom(nodes, links, 100, 50)
        names = {n: n for n in topo.nodes} if fmt != "hpcc" else None
        if names:
            assert _graph(again) == _graph(topo), fmt
        else:  # HPCC numbers its nodes: the same graph, renamed
            assert nx.is_isomorphic(again.graph, topo.graph) and sorted(
                l.rate_mbps for l in again.links) == sorted(l.rate_mbps for l in topo.links)
    nodes, links = topofiles.read("containerlab", topofiles.write("containerlab", topo, {}))
    assert {(*sorted((l["a"], l["b"])),) for l in links} == {
        (*sorted((l.a.node, l.b.node)),) for l in topo.links}
    assert {n["name"] for n in nodes if n["kind"] == "host"} == {"a", "b", "c"}


def test_an_hpcc_topology_file_reads_rates_and_delays_in_its_units():
    text = "4 2 3\n2 3\n0 2 100Gbps 1us 0\n1 3 40Gbps 0.001ms 0\n2 3 400Gbps 500ns 0\n"
    nodes, links = topofiles.read("hpcc", text)
    assert [n["kind"] for n in nodes] == ["host", "host", "switch", "switch"]
    assert links == [{"a": "n0", "b": "n2", "rate_mbps": 100e3, "delay_us": 1.0},
                     {"a": "n1", "b": "n3", "rate_mbps": 40e3, "delay_us": 1.0},
                     {"a": "n2", "b": "n3", "rate_mbps": 400e3, "delay_us": 0.5}]
    with pytest.raises(ConfigError, match=r"fabric.import.*not a hpcc topology"):
        topofiles.read("hpcc", "not numbers")


def test_the_shipped_lab_and_clos_parse_and_the_run_holds_their_graph():
    lab = xp.load(ROOT / "experiments" / "custom-lab.yaml")
    assert lab.topology.kind == "custom" and len(lab.topology.hosts) == 4
    assert "import" not in lab.raw["fabric"] and len(lab.raw["fabric"]["links"]) == 8
    assert lab.fabric_summary()["nodes"] == 8  # counts in results.json, the graph in the file
    clos = xp.load(ROOT / "experiments" / "custom-clos.yaml")
    assert len(clos.topology.hosts) == 8 and len(clos.topology.links) == 20


def test_delays_and_queues_of_links_set_their_tier_and_must_agree():
    base = {"version": 1, "fabric": {"topology": "custom", "nodes": NODES, "links": [
        {**l, "delay_us": 5} if l["a"] in "abc" else {**l, "delay_us": 2} for l in LINKS]}}
    exp = xp.parse(base)
    assert (exp.fabric.host_link.delay_us, exp.fabric.fabric_link.delay_us) == (5, 2)
    bad = {"version": 1, "fabric": {"topology": "custom", "nodes": NODES,
                                    "links": [*LINKS[:-1], {**LINKS[-1], "delay_us": 9}]}}
    bad["fabric"]["links"][4] = {**LINKS[4], "delay_us": 1}
    with pytest.raises(ConfigError) as err:
        xp.parse(bad)
    assert err.value.path == "fabric.links[6].delay_us" and "links[4]" in err.value.message


def test_routing_that_needs_a_clos_is_refused_by_name_on_another_graph():
    raw = {"version": 1, "fabric": {"topology": "custom", "nodes": NODES, "links": LINKS},
           "controller": {"routing": "dmodk"}}
    with pytest.raises(ConfigError) as err:
        xp.parse(raw)
    assert err.value.path == "controller.routing" and "Clos" in err.value.message
    with pytest.raises(ConfigError, match="give nodes and links, or import them"):
        xp.parse({"version": 1, "fabric": {"topology": "custom", "nodes": NODES, "links": LINKS,
                                           "import": {"format": "gml", "file": "x.gml"}}})


def test_the_mininet_module_builds_the_fabric_mininet_side():
    pytest.importorskip("mininet")
    topo = custom(NODES, LINKS, 100, 50)
    text = topofiles.write("mininet", topo, {"host": 0.0, "fabric": 3.0})
    scope: dict = {}
    exec(compile(text, "fabric.py", "exec"), scope)  # noqa: S102 - our own output
    built = scope["topos"]["fabriclab"]()
    assert sorted(built.hosts()) == ["a", "b", "c"] and len(built.switches()) == 4
    assert len(built.links()) == 7 and "settled_pingall" in scope["tests"]
    info = built.linkInfo("l1", "s2")
    assert info["bw"] == 40 and info["delay"] == "3us"


def test_servers_of_gpus_go_on_a_drawn_fabric_too():
    nodes = [{"name": n, "kind": "switch"} for n in ("s1", "la", "lb")] + [
        {"name": f"g{i}", "kind": "host"} for i in range(4)]
    links = [{"a": "la", "b": "s1"}, {"a": "lb", "b": "s1"}] + [
        {"a": f"g{i}", "b": "la" if i % 2 == 0 else "lb"} for i in range(4)]
    exp = xp.parse({"version": 1, "fabric": {
        "topology": "custom", "nodes": nodes, "links": links,
        "servers": {"count": 2, "gpus_per_server": 2,
                    "scale_up": {"kind": "switch", "rate_mbps": 400}}}})
    topo = exp.topology
    assert [len(s.gpus) for s in topo.servers] == [2, 2] and len(topo.scale_up) == 4
    with pytest.raises(ConfigError, match="not a ring"):
        xp.parse({"version": 1, "fabric": {"topology": "ring", "leaves": 3, "hosts_per_leaf": 2,
                                           "servers": {"count": 2, "gpus_per_server": 2,
                                                       "scale_up": {"kind": "switch",
                                                                    "rate_mbps": 400}}}})
