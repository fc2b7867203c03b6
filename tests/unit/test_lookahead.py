"""What a switch-local choice weighs beyond its own ports (testbed/plan/lookahead.py): on the
controller's tables, each group that weighs the next switch learns, per port, the group
through which the switch behind it forwards the same destinations (whose path quality it
weighs)."""

from __future__ import annotations

from controllers.routing.tables import compute_tables
from controllers.routing.policy import FabricPolicy
from testbed.model.builders import fat_tree, leaf_spine
from testbed.model.openflow import FlowEntry, GroupEntry
from testbed.model.spec import Routing
from testbed.plan.lookahead import next_groups
from testbed.plan.notices import SwitchView


def _views(topo, tables) -> dict[str, SwitchView]:
    return {sw.name: SwitchView(
        tuple(tables[sw.name].flows.values()), dict(tables[sw.name].groups), frozenset(),
        {port: link.other(sw.name).node for port, link in topo.ports(sw.name).items()
         if link.other(sw.name).node in tables})
        for sw in topo.switches}


def _port(topo, a: str, b: str) -> int:
    return topo.find_link(a, b).end(a).port


def _gid(topo, edge: str) -> int:
    return next(gid for gid, sw in enumerate(topo.access_switches, start=1)
                if sw.name == edge)


def test_each_bucket_weighs_the_next_switchs_group_and_the_link_every_way_on_takes():
    """k=4 fat-tree, packet_next: agg2_1's group towards edge1_1 weighs core1's and core2's
    groups towards edge1_1 and their links down to agg1_1 (each core's only way into pod 1);
    edge2_1's weighs agg2_1's and agg2_2's groups (the best of their two cores' ways) and
    agg1_1's and agg1_2's links down to edge1_1 (whichever core they pick, the flow comes
    down there); core1's agg1_1's group and its link down; groups are numbered by
    destination edge switch alike everywhere."""
    topo = fat_tree(4)
    ahead = next_groups(_views(topo, compute_tables(
        topo, {}, Routing.LOCAL_ADAPTIVE, local=("packet_next", 0))))
    gid = _gid(topo, "edge1_1")
    assert ahead["agg2_1"][gid] == {
        _port(topo, "agg2_1", c): (c, gid, (c, _port(topo, c, "agg1_1")))
        for c in ("core1", "core2")}
    assert ahead["edge2_1"][gid] == {
        _port(topo, "edge2_1", f"agg2_{j}"): (f"agg2_{j}", gid,
                                             (f"agg1_{j}", _port(topo, f"agg1_{j}", "edge1_1")))
        for j in (1, 2)}
    assert ahead["core1"][gid] == {_port(topo, "core1", "agg1_1"): (
        "agg1_1", gid, ("agg1_1", _port(topo, "agg1_1", "edge1_1")))}
    # agg1_1 delivers edge1_1's subnet through its one port, edge1_1 to its hosts by /32
    # routes: nothing beyond agg1_1's port to weigh
    assert gid not in ahead.get("agg1_1", {})
    other = _gid(topo, "edge1_2")
    assert ahead["edge1_1"][other] == {
        _port(topo, "edge1_1", a): (a, other, (a, _port(topo, a, "edge1_2")))
        for a in ("agg1_1", "agg1_2")}


def test_a_leaf_weighs_each_spines_group_towards_the_destination_leaf():
    """Leaf-spine: each spine's one way down, so the whole path."""
    topo = leaf_spine(2, 4, 2)
    ahead = next_groups(_views(topo, compute_tables(
        topo, {}, Routing.LOCAL_ADAPTIVE, local=("flowlet_next", 100))))
    leaves = [sw.name for sw in topo.access_switches]
    spines = [sw.name for sw in topo.switches if sw.name not in leaves]
    gid = _gid(topo, leaves[1])
    assert ahead[leaves[0]][gid] == {
        _port(topo, leaves[0], s): (s, gid, (s, _port(topo, s, leaves[1]))) for s in spines}


def test_groups_that_do_not_weigh_the_next_switch_and_switches_elsewhere_get_nothing():
    """Plain flowlet selection: nothing; a switch behind a port that is not among the views
    (another machine's): that port is left out."""
    topo = fat_tree(4)
    assert next_groups(_views(topo, compute_tables(
        topo, {}, Routing.LOCAL_ADAPTIVE, local=("flowlet", 100)))) == {}
    views = _views(topo, compute_tables(topo, {}, Routing.LOCAL_ADAPTIVE,
                                        local=("packet_next", 0)))
    del views["core1"]
    gid = _gid(topo, "edge1_1")
    assert next_groups(views)["agg2_1"][gid] == {_port(topo, "agg2_1", "core2"): (
        "core2", gid, ("core2", _port(topo, "core2", "agg1_1")))}


def test_a_next_switch_that_splits_the_destinations_or_sends_them_elsewhere_is_not_weighed():
    """The switch behind forwards the group's destinations through one group: that group is
    weighed; through two groups, or has no route for one: nothing; out of one port: that
    port's link."""
    route = lambda net, action: FlowEntry(  # noqa: E731
        100, (("eth_type", 0x0800), ("ipv4_dst", (net, "255.255.255.0"))), (action,))
    up = SwitchView((route("10.1.0.0", ("group", 1)), route("10.2.0.0", ("group", 1))),
                    {1: GroupEntry(1, (1, 2), selection="packet_next")}, peers={1: "a", 2: "b"})
    one = SwitchView((route("10.1.0.0", ("group", 3)), route("10.2.0.0", ("group", 3))), {})
    two = SwitchView((route("10.1.0.0", ("group", 3)), route("10.2.0.0", ("group", 4))), {})
    out = SwitchView((route("10.1.0.0", ("output", 5)), route("10.2.0.0", ("output", 5))), {})
    partial = SwitchView((route("10.1.0.0", ("group", 3)),), {})
    assert next_groups({"up": up, "a": one, "b": partial}) == {
        "up": {1: {1: ("a", 3, None)}}}
    assert next_groups({"up": up, "a": two, "b": out}) == {"up": {1: {2: ("b", None, ("b", 5))}}}


def test_the_controller_sets_the_next_switch_methods_when_asked():
    """controller.routing.load next_switch: the groups' selection reads ``flowlet_next`` (with
    its gap) or ``packet_next``; local: ``flowlet``, ``packet``."""
    topo = fat_tree(4)
    for granularity, load, want, gap in (("flowlet", "next_switch", "flowlet_next", 120),
                                         ("packet", "next_switch", "packet_next", 0),
                                         ("flowlet", "local", "flowlet", 120)):
        policy = FabricPolicy(topo, Routing.LOCAL_ADAPTIVE, granularity=granularity,
                              flowlet_gap_us=120, load=load)
        groups = [g for t in policy.desired().values() for g in t.groups.values()]
        assert {(g.selection, g.gap_us) for g in groups} == {(want, gap)}


def test_the_switch_agent_installs_the_next_switches_ports_beside_the_notices():
    """A k=4 fat-tree's switches in one agent, packet_next: agg3_1's groups towards pod 2 go
    into the datapath with core1's and core2's groups towards pod 2 as their buckets' next
    groups; core1's link to agg2_1 dies and the notices take core1 out of agg3_1's groups,
    core2's next group staying with its bucket."""
    from testbed.poll import wait_for
    from tests.unit.test_notices import programmed_agent

    topo = fat_tree(4)
    tables = compute_tables(topo, {}, Routing.LOCAL_ADAPTIVE, local=("packet_next", 0))
    pod2 = [_gid(topo, "edge2_1"), _gid(topo, "edge2_2")]
    with programmed_agent(topo, tables) as (agent, maps, specs, _conns):
        agg3, index = specs["agg3_1"].index, {n: s.index for n, s in specs.items()}
        ports = {core: _port(topo, "agg3_1", core) for core in ("core1", "core2")}
        wait_for(lambda: all(maps.ahead.get((agg3, g)) for g in pod2), 5,
                 "agg3_1's groups towards pod 2 with their next groups")
        for g in pod2:
            group = maps.groups[(agg3, g)][1]
            assert maps.ahead[(agg3, g)] == [
                (index[c], g, index[c], _port(topo, c, "agg2_1")) for p in group for c in ports
                if ports[c] == p]
            assert maps.selections[(agg3, g)] == ("packet_next", 0)
        agent.set_port("core1", _port(topo, "core1", "agg2_1"), False)
        wait_for(lambda: all(maps.groups[(agg3, g)][1] == [ports["core2"]] for g in pod2),
                 5, "agg3_1's groups towards pod 2 without core1")
        assert all(maps.ahead[(agg3, g)] == [
            (index["core2"], g, index["core2"], _port(topo, "core2", "agg2_1"))] for g in pod2)


def test_the_experiment_file_asks_for_it_and_the_controller_is_told():
    """``controller.routing: {mode: local_adaptive, load: next_switch}``: the spec says so
    (its kind names it) and the controller's command passes it on; ``local`` by default."""
    from fabriclab.model import experiment
    from testbed.model.spec import Load

    base = {"version": 1, "fabric": {"topology": "fat_tree", "k": 4},
            "controller": {"routing": {"mode": "local_adaptive", "granularity": "packet"}}}
    assert experiment.parse(base).controller.load == Load.LOCAL
    base["controller"]["routing"]["load"] = "next_switch"
    ctl = experiment.parse(base).controller
    assert ctl.load == Load.NEXT_SWITCH
    assert ctl.kind == "fabriclab (local_adaptive, packet, next switch)"
