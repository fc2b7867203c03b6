"""Adaptive routing's pure logic: demand estimation, Global First Fit, WCMP, and the policy's
tables, driven by scripted statistics and a mock clock."""

import pytest

from controllers.routing.adaptive import AdaptiveRouting, Flow, FlowKey, estimate_demands
from controllers.routing.policy import FabricPolicy
from controllers.routing.tables import FLOW_COOKIE, PRIORITY_DETECT, PRIORITY_FLOW
from testbed.model.builders import fat_tree
from tests.unit.fakeswitch import FakeSwitch, walk


def _flows(*pairs):
    return [Flow(FlowKey(f"10.0.0.{i}", f"10.0.1.{i}", 6, 1000 + i, 5001), s, d, 0.0)
            for i, (s, d) in enumerate(pairs)]


def test_demand_estimation_is_max_min_over_the_hosts_links():
    # Hedera's example shape: A sends to B and C, D sends to B; E, F, G all send to H
    flows = _flows(("A", "B"), ("A", "C"), ("D", "B"), ("E", "H"), ("F", "H"), ("G", "H"))
    estimate_demands(flows)
    assert [round(f.demand, 3) for f in flows] == [0.5, 0.5, 0.5, 0.333, 0.333, 0.333]
    flows = _flows(("A", "B"), ("C", "B"), ("C", "D"))
    estimate_demands(flows)
    # B takes 1: A->B and C->B share it; C's other flow gets the rest of C's NIC
    assert [round(f.demand, 3) for f in flows] == [0.5, 0.5, 0.5]


def _routing(now=0.0):
    topo = fat_tree(4, host_rate_mbps=3, fabric_rate_mbps=3)
    return topo, AdaptiveRouting(topo, poll_s=1.0)


def _learn(ar, topo, src, dst, sport, now=0.0):
    key = FlowKey(topo.nodes[src].ip, topo.nodes[dst].ip, 6, sport, 5001)
    ar.new_flow(key, now)
    return key


def test_global_first_fit_separates_elephants_that_could_share_an_uplink():
    topo, ar = _routing()
    a = _learn(ar, topo, "h1_1_1", "h2_1_1", 40000)
    b = _learn(ar, topo, "h1_1_2", "h2_1_2", 40001)
    ar.flow_stats({a: 0, b: 0}, 0.0)
    ar.flow_stats({a: 187_500, b: 187_500}, 1.0)  # 1.5 Mbit/s each: elephants
    assert ar.place(1.0, {})
    pa, pb = ar.flows[a].path, ar.flows[b].path
    # each has a whole path: no link of one carries the other
    assert not set(zip(pa, pa[1:])) & set(zip(pb, pb[1:]))
    assert ar.placements == 2 and ar.reactions == [1.0, 1.0]  # quiet at 0, pinned at 1
    assert not ar.place(2.0, {})  # stable: nothing moves while both fit


def test_global_first_fit_never_overloads_a_link_it_could_avoid():
    topo, ar = _routing()
    # four elephants out of pod 1 to pod 2: exactly the pod's four core links
    keys = [_learn(ar, topo, s, d, 40000 + i) for i, (s, d) in enumerate(
        [("h1_1_1", "h2_1_1"), ("h1_1_2", "h2_1_2"), ("h1_2_1", "h2_2_1"), ("h1_2_2", "h2_2_2")])]
    ar.flow_stats({k: 0 for k in keys}, 0.0)
    ar.flow_stats({k: 375_000 for k in keys}, 1.0)  # line rate
    ar.place(1.0, {})
    used = [hop for k in keys for hop in zip(ar.flows[k].path, ar.flows[k].path[1:])]
    assert len(used) == len(set(used))  # every directed link carries one elephant at most


# a random permutation (seed 0) for which Global First Fit leaves elephants sharing links
PERMUTATION = [("h1_1_1", "h3_2_1"), ("h1_1_2", "h4_2_1"), ("h1_2_1", "h2_1_2"),
               ("h1_2_2", "h1_1_2"), ("h2_1_1", "h3_1_2"), ("h2_1_2", "h1_2_1"),
               ("h2_2_1", "h1_2_2"), ("h2_2_2", "h3_2_2"), ("h3_1_1", "h4_1_2"),
               ("h3_1_2", "h2_2_2"), ("h3_2_1", "h3_1_1"), ("h3_2_2", "h2_1_1"),
               ("h4_1_1", "h1_1_1"), ("h4_1_2", "h2_2_1"), ("h4_2_1", "h4_2_2"),
               ("h4_2_2", "h4_1_1")]


def test_placement_finds_the_arrangement_first_fit_misses():
    topo, ar = _routing()
    keys = [_learn(ar, topo, s, d, 40000 + i) for i, (s, d) in enumerate(PERMUTATION)]
    flows = sorted((ar.flows[k] for k in keys), key=lambda f: f.key)
    for f in flows:
        f.demand = 1.0
    options = {id(f): ar.paths(f.src_host, f.dst_host) for f in flows}
    _, complete = ar._first_fit(flows, options, {id(f): 3e6 for f in flows})
    assert not complete  # greedy alone overloads a link
    ar.flow_stats({k: 375_000 for k in keys}, 1.0)  # line rate since they were learned at 0
    assert ar.place(1.0, {}) and ar.searches_solved == 1
    used = [hop for k in keys for hop in zip(ar.flows[k].path, ar.flows[k].path[1:])]
    assert len(used) == len(set(used))  # every directed link carries one elephant
    ar.flow_stats({k: 750_000 for k in keys}, 2.0)
    assert not ar.place(2.0, {}) and ar.moves == 0  # the arrangement holds


def test_a_new_flow_is_sampled_early_and_placed_within_a_fraction_of_a_poll():
    topo, ar = _routing()
    assert ar.next_round(0.0, 0.0) == (1.0, set())  # no flow: a full poll after the interval
    a = _learn(ar, topo, "h1_1_1", "h2_1_1", 40000, now=0.3)
    due, only = ar.next_round(0.0, 0.0)
    assert due == pytest.approx(0.3 + ar.early_s) and only == {"edge1_1"}  # its source only
    ar.flow_stats({a: 60_000}, 0.55)  # 1.9 Mbit/s since its first packet: an elephant
    assert ar.place(0.55, {}) and ar.flows[a].path is not None
    assert ar.reactions == [pytest.approx(0.25)]  # pinned 0.25 s after its first packet
    assert ar.next_round(0.0, 0.55) == (1.0, set())  # sampled: the next full poll
    _learn(ar, topo, "h1_1_2", "h2_1_2", 40001, now=0.6)
    assert ar.next_round(0.0, 0.9) == (1.0, set())  # a round after its early time missed it
    _learn(ar, topo, "h1_1_2", "h2_1_2", 40002, now=0.9)
    assert ar.next_round(0.0, 0.9) == (1.0, set())  # early time past the full poll: the poll


def _one_pinned_elephant():
    """h1_1_1 -> h2_1_1 at line rate, sampled at 0 and 1 s and pinned at 1 s."""
    topo, ar = _routing()
    key = _learn(ar, topo, "h1_1_1", "h2_1_1", 40000)
    ar.flow_stats({key: 0}, 0.0)
    ar.flow_stats({key: 375_000}, 1.0)
    ar.place(1.0, {})
    return topo, ar, key


def test_a_failed_link_unpins_the_flows_crossing_it_and_placement_avoids_it():
    topo, ar, key = _one_pinned_elephant()
    path = ar.flows[key].path
    dead = {topo.find_link(path[2], path[3]).name: False}
    assert ar.drop_dead_paths(dead) and ar.flows[key].path is None
    ar.place(2.0, dead)
    new = ar.flows[key].path
    assert new and (path[2], path[3]) not in set(zip(new, new[1:]))


def test_idle_flows_expire_and_mice_go_back_to_the_groups():
    _, ar, key = _one_pinned_elephant()
    ar.flow_stats({key: 376_000}, 2.0)  # 8 kbit/s: a mouse now
    assert ar.place(2.0, {}) and ar.flows[key].path is None
    assert ar.expire(6.0) == [] and ar.expire(7.0) == [key]  # idle 5 s (3 polls, at least 5 s)


def test_wcmp_weights_follow_residual_capacity_in_quarters():
    topo, ar = _routing()
    ar.port_stats("edge1_1", {3: 0, 4: 0}, 0.0)
    ar.port_stats("edge1_1", {3: 281_250, 4: 0}, 1.0)  # port 3 at 75 % of 3 Mbit/s
    assert ar.bucket_weights("edge1_1", (3, 4)) == (1, 4)
    assert ar.bucket_weights("edge1_1", (3,)) == ()
    ar.port_stats("edge1_1", {3: 281_250, 4: 0}, 2.0)  # idle again: plain buckets
    assert ar.bucket_weights("edge1_1", (3, 4)) == ()


def test_the_policy_learns_flows_at_the_source_and_pins_elephants_hop_by_hop():
    topo = fat_tree(4, host_rate_mbps=3, fabric_rate_mbps=3)
    policy = FabricPolicy(topo, "adaptive")
    switches = {sw.name: FakeSwitch() for sw in topo.switches}
    for sw in topo.switches:
        ports = {p: (l.end(sw.name).ifname, True) for p, l in topo.ports(sw.name).items()}
        switches[sw.name].apply(policy.switch_connected(sw.dpid, ports, 0.0))
    edge = switches["edge1_1"]
    detect = [f for f in edge.flows.values() if f.priority == PRIORITY_DETECT]
    # per host port, every route again: forwarded as it says, and the headers punted
    assert sorted({dict(f.match)["in_port"] for f in detect}) == [1, 2]
    assert len(detect) == 2 * (2 + 7)  # 2 local hosts, 7 remote edges
    assert all(f.actions[-1] == ("punt", 128) and len(f.actions) == 2 for f in detect)
    key = FlowKey(topo.nodes["h1_1_1"].ip, topo.nodes["h2_1_1"].ip, 6, 40000, 5001)
    ops = policy.new_flow(topo.nodes["edge1_1"].dpid, 1, key, 0.0)
    assert list(ops) == ["edge1_1"]  # only the source switch learns it
    edge.apply(ops["edge1_1"])
    entry = edge.flows[(PRIORITY_FLOW, key.match())]
    assert entry.cookie == FLOW_COOKIE and entry.actions[0][0] == "group"
    assert [op.kind for op in ops["edge1_1"]] == ["flow_add", "barrier"]  # one entry, no rebuild
    # the incremental update is what a full recomputation gives
    cached = policy.desired()
    policy._desired = None
    assert policy.desired() == cached and policy.reconcile() == {}
    assert policy.new_flow(topo.nodes["edge1_1"].dpid, 1, key, 0.1) == {}  # known already
    src, dst = topo.nodes["edge1_1"].dpid, topo.nodes["edge2_1"].dpid
    policy.flow_stats(src, {key: 0}, 0.0)
    policy.flow_stats(dst, {key: 5}, 0.5)  # its (younger) entry at the far end: not counted
    policy.flow_stats(src, {key: 375_000}, 1.0)
    ops = policy.adapt(1.0)
    path = policy.adaptive.flows[key].path
    assert set(ops) == set(path[1:-1])  # an entry at every switch of its path
    for name, o in ops.items():
        switches[name].apply(o)
    fields = {"ip_proto": 6, "tcp_src": 40000, "tcp_dst": 5001}
    assert walk(topo, switches, "h1_1_1", "h2_1_1", **fields) == [list(path)]
    assert len(walk(topo, switches, "h1_1_1", "h2_1_1")) == 4  # other traffic: the groups
