"""Controller policy against a fake flow table: routes, groups, failures, diffs."""

import itertools

import pytest

from controllers.routing.policy import FabricPolicy
from controllers.routing.tables import check_ports, compute_tables, diff_tables
from testbed.model.builders import fat_tree, leaf_spine
from tests.unit.fakeswitch import FakeSwitch, walk


def _connect_all(topo, policy, now=0.0):
    switches = {sw.name: FakeSwitch() for sw in topo.switches}
    for sw in topo.switches:
        ports = {p: (l.end(sw.name).ifname, True) for p, l in topo.ports(sw.name).items()}
        switches[sw.name].apply(policy.switch_connected(sw.dpid, ports, now))
        for name, ops in policy.reconcile().items():
            switches[name].apply(ops)
    return switches


@pytest.mark.parametrize("topo", [fat_tree(4), fat_tree(6), leaf_spine(3, 2, 2)],
                         ids=["k4", "k6", "leafspine"])
def test_every_pair_takes_exactly_the_equal_cost_paths(topo):
    policy = FabricPolicy(topo)
    switches = _connect_all(topo, policy)
    hosts = [h.name for h in topo.hosts]
    pairs = list(itertools.permutations(hosts, 2))
    if len(pairs) > 400:
        pairs = pairs[::7]
    for src, dst in pairs:
        assert walk(topo, switches, src, dst) == topo.equal_cost_paths(src, dst)


def test_groups_and_routes_per_switch_k4():
    topo = fat_tree(4)
    tables = compute_tables(topo, {})
    edge = tables["edge1_1"]
    # 2 local hosts, 7 remote /24s, ARP and LLDP punts, table-miss
    assert len(edge.flows) == 2 + 7 + 2 + 1
    assert len(edge.groups) == 7
    assert all(g.ports == (3, 4) for g in edge.groups.values())  # both uplinks
    agg = tables["agg1_1"]
    same_pod = [g for g in agg.groups.values() if len(g.ports) == 1]
    assert sorted(g.ports for g in same_pod) == [(1,), (2,)]  # down to each edge of the pod
    cross = [g for g in agg.groups.values() if len(g.ports) == 2]
    assert len(cross) == 6 and all(g.ports == (3, 4) for g in cross)
    core = tables["core1"]
    assert len(core.groups) == 8 and all(len(g.ports) == 1 for g in core.groups.values())
    assert not any(f.match == (("eth_type", 0x0806),) for f in core.flows.values())


def test_link_down_is_routed_around_and_restored():
    topo = fat_tree(4)
    policy = FabricPolicy(topo)
    switches = _connect_all(topo, policy)
    link = topo.find_link("agg1_1", "core1")
    ops = policy.port_status(topo.nodes["agg1_1"].dpid, link.end("agg1_1").port, False, 1.0)
    desired = policy.desired()
    ops2 = policy.port_status(topo.nodes["core1"].dpid, link.end("core1").port, False, 1.0)
    # the link's other end changes nothing: no ops, and no tables computed again
    assert not any(ops2.values()) and policy.desired() is desired
    for name, o in list(ops.items()) + list(ops2.items()):
        switches[name].apply(o)
    assert all(op.kind in ("group_mod", "barrier") for o in ops.values() for op in o)
    for src, dst in [("h1_1_1", "h2_1_1"), ("h2_1_1", "h1_1_1"), ("h3_2_2", "h1_2_1")]:
        paths = walk(topo, switches, src, dst)
        assert paths
        assert not any(("agg1_1", "core1") in itertools.pairwise(p) or ("core1", "agg1_1") in itertools.pairwise(p)
                       for p in paths)
    assert "agg1_1:3-core1:1" in [n for n, up in policy.link_state().items() if not up]
    for name, o in policy.port_status(topo.nodes["agg1_1"].dpid, 3, True, 2.0).items():
        switches[name].apply(o)
    for name, o in policy.port_status(topo.nodes["core1"].dpid, 1, True, 2.0).items():
        switches[name].apply(o)
    assert walk(topo, switches, "h1_1_1", "h2_1_1") == topo.equal_cost_paths("h1_1_1", "h2_1_1")


def test_isolated_edge_uplinks_down_leave_empty_groups_not_loops():
    topo = fat_tree(4)
    policy = FabricPolicy(topo)
    switches = _connect_all(topo, policy)
    for port in (3, 4):
        for name, ops in policy.port_status(topo.nodes["edge1_1"].dpid, port, False, 1).items():
            switches[name].apply(ops)
    with pytest.raises(AssertionError, match="dropped"):
        walk(topo, switches, "h2_1_1", "h1_1_1")
    assert walk(topo, switches, "h1_1_1", "h1_1_2") == [["h1_1_1", "edge1_1", "h1_1_2"]]


def test_diff_orders_groups_around_flows_and_ends_with_barrier():
    topo = leaf_spine(2, 2, 1)
    new = compute_tables(topo, {})["leaf1"]
    ops = diff_tables(None, new)
    kinds = [op.kind for op in ops]
    assert kinds[0] == "clear" and kinds[-1] == "barrier"
    assert max(i for i, k in enumerate(kinds) if k == "group_add") < kinds.index("flow_add")
    assert diff_tables(new, new) == []


def test_port_check_reports_missing_renamed_and_extra_ports():
    topo = leaf_spine(2, 2, 1)
    leaf = topo.nodes["leaf1"]
    reported = {1: "leaf1-eth1", 2: "wrong", 9: "leaf1-eth9"}
    texts = sorted(str(m) for m in check_ports(topo, leaf, reported))
    assert texts == ["leaf1: port 2 is 'wrong', expected 'leaf1-eth2'",
                     "leaf1: port 3 (leaf1-eth3) missing",
                     "leaf1: unexpected port 9 (leaf1-eth9)"]


def test_a_disconnected_switch_is_a_failed_switch_until_it_reconnects():
    """A dead vswitchd keeps its neighbours' ports up (the veths stay): the controller routes
    around the switch whose connection ended, and back through it once it reconnects."""
    topo = fat_tree(4)
    policy = FabricPolicy(topo)
    switches = _connect_all(topo, policy)
    core = topo.nodes["core1"]
    changes = policy.switch_disconnected(core.dpid, 5)
    assert "core1" not in changes and set(changes) == {"agg1_1", "agg2_1", "agg3_1", "agg4_1"}
    for name, ops in changes.items():
        switches[name].apply(ops)
    for src, dst in [("h1_1_1", "h2_1_1"), ("h3_2_2", "h4_1_1")]:
        paths = walk(topo, switches, src, dst)
        assert paths and not any("core1" in p for p in paths), paths
    assert all(not up for name, up in policy.link_state().items() if "core1" in name)
    ports = {p: (l.end("core1").ifname, True) for p, l in topo.ports("core1").items()}
    switches["core1"] = FakeSwitch()
    ops = policy.switch_connected(core.dpid, ports, 6)
    assert ops[0].kind == "clear"
    switches["core1"].apply(ops)
    for name, ops in policy.reconcile().items():
        switches[name].apply(ops)
    assert walk(topo, switches, "h1_1_1", "h2_1_1") == topo.equal_cost_paths("h1_1_1", "h2_1_1")
    assert policy.reconcile() == {}


def test_unknown_datapath_and_lldp_mismatch_are_reported():
    topo = leaf_spine(2, 2, 1)
    policy = FabricPolicy(topo)
    assert policy.switch_connected(0xDEAD, {}, 0) == []
    leaf1, spine1, spine2 = (topo.nodes[n] for n in ("leaf1", "spine1", "spine2"))
    assert policy.lldp_seen(leaf1.dpid, 2, spine1.dpid, 1, 0) is None
    text = policy.lldp_seen(leaf1.dpid, 2, spine2.dpid, 1, 0)
    assert "wiring mismatch: leaf1 port 2 sees spine2 port 1, expected spine1 port 1" == text
    assert any("unknown datapath" in e for _, e in policy.events)


def test_arp_reply_only_for_fabric_hosts():
    topo = leaf_spine(2, 1, 2)
    policy = FabricPolicy(topo)
    assert policy.arp_reply("10.0.2.2") == topo.nodes["h2_2"].mac
    assert policy.arp_reply("192.0.2.1") is None


def test_ecmp_groups_carry_a_per_switch_hash_basis_unless_shared():
    topo = fat_tree(4)
    per_switch = compute_tables(topo, {}, "ecmp", "per_switch")
    bases = {name: {g.hash_basis for g in t.groups.values()} for name, t in per_switch.items()}
    assert all(len(b) == 1 for b in bases.values())  # one basis per switch
    assert len({b.pop() for b in bases.values()}) == len(topo.switches)  # all different
    shared = compute_tables(topo, {}, "ecmp", "shared")
    assert {g.hash_basis for t in shared.values() for g in t.groups.values()} == {0}
    with pytest.raises(ValueError, match="EcmpSeed"):
        compute_tables(topo, {}, "ecmp", "random")


def test_ecmp_groups_say_where_the_hash_is_computed():
    topo = fat_tree(4)
    assert {g.selection for t in compute_tables(topo, {}, "ecmp").values()
            for g in t.groups.values()} == {"hash"}
    dp = compute_tables(topo, {}, "ecmp", "per_switch", "dp_hash")
    assert {g.selection for t in dp.values() for g in t.groups.values()} == {"dp_hash"}
    policy = FabricPolicy(topo, "ecmp", "per_switch", "dp_hash")
    assert {g.selection for t in policy.desired().values() for g in t.groups.values()} == {
        "dp_hash"}
    with pytest.raises(ValueError, match="EcmpSelection"):
        compute_tables(topo, {}, "ecmp", "per_switch", "random")


@pytest.mark.parametrize("topo", [fat_tree(4), fat_tree(6), leaf_spine(3, 2, 2)],
                         ids=["k4", "k6", "leafspine"])
def test_dmodk_gives_every_pair_exactly_one_shortest_path(topo):
    switches = _connect_all(topo, FabricPolicy(topo, routing="dmodk"))
    # no hashing: only fast-failover groups (the chosen port first, then the other live ones)
    groups = [g for s in switches.values() for g in s.groups.values()]
    assert groups and all(g.kind == "ff" and len(g.ports) > 1 for g in groups)
    hosts = [h.name for h in topo.hosts]
    for src, dst in list(itertools.permutations(hosts, 2))[::3]:
        paths = walk(topo, switches, src, dst)
        assert len(paths) == 1 and paths[0] in topo.equal_cost_paths(src, dst)


@pytest.mark.parametrize("k", [4, 6, 8])
def test_dmodk_makes_shift_permutations_link_disjoint(k):
    from traffic.workloads.patterns import pattern_pairs

    topo = fat_tree(k)
    switches = _connect_all(topo, FabricPolicy(topo, routing="dmodk"))
    for pattern in ("same_pod", "cross_pod"):
        used = []
        for src, dst in pattern_pairs(topo, pattern):
            (path,) = walk(topo, switches, src, dst)
            used += list(itertools.pairwise(path))
        assert len(used) == len(set(used)), f"{pattern}: two flows share a link direction"


def test_dmodk_fails_over_to_a_live_uplink():
    topo = fat_tree(4)
    policy = FabricPolicy(topo, routing="dmodk")
    switches = _connect_all(topo, policy)
    (before,) = walk(topo, switches, "h1_1_1", "h2_1_1")
    assert before[2] == "agg1_1"
    port = next(p for p, l in topo.ports("edge1_1").items() if l.other("edge1_1").node == "agg1_1")
    for name, ops in policy.port_status(topo.nodes["edge1_1"].dpid, port, False, 1.0).items():
        switches[name].apply(ops)
    (after,) = walk(topo, switches, "h1_1_1", "h2_1_1")
    assert after[2] == "agg1_2"


def test_spray_groups_hash_in_the_datapath_with_equal_weights_on_a_healthy_fat_tree():
    topo = fat_tree(4)
    tables = compute_tables(topo, {}, "spray")
    for sw in topo.switches:
        for g in tables[sw.name].groups.values():
            assert g.selection == "dp_hash" and g.weights == ()  # symmetric: plain buckets


def test_spray_weights_follow_the_capacity_left_after_a_core_link_fails():
    topo = fat_tree(4)
    down = {topo.find_link("agg1_1", "core1").name: False}
    dst_gid = 1 + [s.name for s in topo.access_switches].index("edge2_1")
    cap = compute_tables(topo, down, "spray")
    edge = cap["edge1_1"].groups[dst_gid]
    up_to = {p: topo.ports("edge1_1")[p].other("edge1_1").node for p in edge.ports}
    weight = dict(zip((up_to[p] for p in edge.ports), edge.weights))
    # agg1_1 has one core left towards pod 2, agg1_2 two: the edge splits 1:2
    assert weight["agg1_2"] == 2 * weight["agg1_1"]
    # the other pods' routes to pod 1 through core1 are gone; core2 carries agg1_1's share
    assert cap["agg1_1"].groups[dst_gid].ports == (topo.find_link("agg1_1", "core2")
                                                  .end("agg1_1").port,)
    # pod 3 to pod 4: core1 lost pod 1's share of its downlinks, so agg3_1 (core1, core2) has
    # more room than agg3_2 and edge3_1 leans towards it; paths in pod 2 to pod 1 do not change
    gid4 = 1 + [s.name for s in topo.access_switches].index("edge4_1")
    g = cap["edge3_1"].groups[gid4]
    ports = {topo.ports("edge3_1")[p].other("edge3_1").node: w for p, w in zip(g.ports, g.weights)}
    assert ports["agg3_1"] > ports["agg3_2"]
    blind = compute_tables(topo, down, "spray", spray_weights="equal")
    assert blind["edge1_1"].groups[dst_gid].weights == ()


def test_a_failure_changes_only_the_affected_spray_groups():
    topo = fat_tree(4)
    policy = FabricPolicy(topo, "spray")
    _connect_all(topo, policy)
    link = topo.find_link("agg1_1", "core1")
    ops = policy.port_status(topo.nodes["agg1_1"].dpid, link.end("agg1_1").port, False, 1.0)
    changed = {name: [op for op in o if op.kind != "barrier"] for name, o in ops.items()}
    assert all(op.kind == "group_mod" for o in changed.values() for op in o)
    # edge1_x re-weight towards the other pods; pods 2-4 drop core1 towards pod 1 at their aggs
    assert {"edge1_1", "edge1_2", "agg1_1"} <= set(n for n, o in changed.items() if o)
    assert not any(changed.get(n) for n in ("core3", "core4", "agg1_2"))


def test_bucket_weights_are_proportional_integers():
    from controllers.routing.tables import bucket_weights
    assert bucket_weights([1.0, 1.0]) == ()
    assert bucket_weights([0.5, 1.0]) == (50, 100)
    assert bucket_weights([0.001, 1.0]) == (1, 100)  # a live port never gets weight 0
