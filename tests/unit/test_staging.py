"""Loop-free reroutes (controllers/routing/staging.py): a reroute in two stages forms no
forwarding loop in whatever order its switches apply them; all at once it can."""

from __future__ import annotations

import copy
import itertools
import random

import networkx as nx
import pytest

from controllers.routing.policy import FabricPolicy
from controllers.routing.staging import Stager, narrowed, split
from controllers.routing.tables import Op, OpKind
from testbed.model.builders import fat_tree
from testbed.model.openflow import GroupEntry
from tests.unit.fakeswitch import FakeSwitch
from tests.unit.test_policy import _connect_all


def _loop(topo, switches, dead: set) -> list[str] | None:
    """A forwarding loop towards some host (every bucket of every group counts; a dead
    port's bucket is skipped, as the datapath does; no live bucket: a drop), or None."""
    for dst in topo.hosts:  # routes go by destination: its next hops at every switch
        packet = {"eth_type": 0x0800, "ipv4_dst": dst.ip, "ipv4_src": "10.255.0.1"}
        nxt = {sw.name: [topo.link_at(sw.name, p).other(sw.name).node
                         for p in switches[sw.name].out_ports(packet)
                         if p != "controller" and (sw.name, p) not in dead]
               for sw in topo.switches}
        graph = nx.DiGraph([(a, b) for a, peers in nxt.items() for b in peers if b in nxt])
        try:
            return [a for a, _ in nx.find_cycle(graph)]
        except nx.NetworkXNoCycle:
            continue
    return None


def _fail(topo, policy, a: str, b: str, up: bool = False):
    """The policy's changes when link a-b goes down (or up), and the link's two ends."""
    link = topo.find_link(a, b)
    changes = policy.port_status(topo.nodes[a].dpid, link.end(a).port, up, 1.0)
    return changes, {(a, link.end(a).port), (b, link.end(b).port)}


def _states(switches, stages: dict[str, list[Op]], base=None):
    """Mixes of ``stages`` applied by some of its switches and not by the others (every one
    for up to six switches)."""
    names = sorted(stages)
    every = [c for n in range(len(names) + 1) for c in itertools.combinations(names, n)]
    if len(every) > 64:  # each switch alone, all but each, and a fixed sample of the rest
        rng = random.Random(7)
        every = [c for c in every if len(c) in (0, 1, len(names) - 1, len(names))] + \
            rng.sample([c for c in every if 1 < len(c) < len(names) - 1], 32)
    for applied in every:
        state = copy.deepcopy(base or switches)
        for name in applied:
            state[name].apply(stages[name])
        yield applied, state


def _staged_without_loops(topo, policy, switches, changes, dead: set):
    """Check the changes in two stages form no loop in any order (checked mixes); returns
    the stages."""
    stages = {name: split(policy.previous[name], ops) for name, ops in changes.items()}
    first = {name: f for name, (f, _) in stages.items() if f}
    then = {name: t for name, (_, t) in stages.items() if t}
    for applied, state in _states(switches, first):
        assert _loop(topo, state, dead) is None, applied
    done = copy.deepcopy(switches)
    for name, ops in first.items():
        done[name].apply(ops)
    for applied, state in _states(switches, then, base=done):
        assert _loop(topo, state, dead) is None, applied
    return first, then


def test_a_core_links_failure_all_at_once_can_loop_and_in_two_stages_cannot():
    topo = fat_tree(4)
    policy = FabricPolicy(topo)
    switches = _connect_all(topo, policy)
    changes, dead = _fail(topo, policy, "core1", "agg2_1")
    # core1 now reaches pod 2 back through another pod, which stops sending it pod 2's traffic
    assert sorted(changes) == ["agg1_1", "agg2_1", "agg3_1", "agg4_1", "core1"]
    loops = [applied for applied, state in _states(switches, changes)
             if _loop(topo, state, dead)]
    assert ("core1",) in loops  # core1 first: back up to agg3_1, which sends it to core1
    first, then = _staged_without_loops(topo, policy, switches, changes, dead)
    assert sorted(first) == sorted(changes) and sorted(then) == ["core1"]
    core_first = [op.entry.ports for op in first["core1"] if op.kind == OpKind.GROUP_MOD]
    assert core_first == [(), ()]  # no way to pod 2 until the others have stopped using it


def test_a_links_repair_in_two_stages_forms_no_loop_either():
    topo = fat_tree(4)
    policy = FabricPolicy(topo)
    switches = _connect_all(topo, policy)
    changes, _ = _fail(topo, policy, "core1", "agg2_1")
    for name, ops in changes.items():
        switches[name].apply(ops)
    changes, _ = _fail(topo, policy, "core1", "agg2_1", up=True)
    assert any(_loop(topo, state, set()) for _, state in _states(switches, changes))
    _staged_without_loops(topo, policy, switches, changes, set())


def test_a_group_narrows_to_the_ports_it_keeps_in_its_new_order_and_weights():
    old = GroupEntry(7, (1, 2, 3), weights=(1, 1, 1))
    assert narrowed(old, GroupEntry(7, (3, 1), weights=(5, 2))) is None  # nothing added
    narrow = narrowed(old, GroupEntry(7, (4, 3, 1), weights=(9, 5, 2)))
    assert (narrow.ports, narrow.weights) == ((3, 1), (5, 2))
    assert narrowed(GroupEntry(7, (2,)), GroupEntry(7, (1, 3))).ports == ()
    assert split(None, [Op(OpKind.GROUP_MOD, GroupEntry(7, (1,))), Op(OpKind.BARRIER)]) == (
        [], [Op(OpKind.GROUP_MOD, GroupEntry(7, (1,))), Op(OpKind.BARRIER)])


def _mod(gid: int, *ports: int) -> Op:
    return Op(OpKind.GROUP_MOD, GroupEntry(gid, ports))


class _Tables:
    def __init__(self, **groups) -> None:
        self.groups = {int(k[1:]): GroupEntry(int(k[1:]), v) for k, v in groups.items()}
        self.flows = {}


def test_the_stager_holds_the_second_stage_until_every_first_barrier_is_answered():
    st = Stager(timeout_s=1.0)
    old = {"a": _Tables(g1=(1, 2)), "b": _Tables(g1=(2,))}
    ops, staged = st.plan(old, {"a": [_mod(1, 1), Op(OpKind.BARRIER)],
                                "b": [_mod(1, 1, 3), Op(OpKind.BARRIER)]}, 10.0, "x down")
    assert staged and ops == {"a": [_mod(1, 1), Op(OpKind.BARRIER)],
                              "b": [_mod(1), Op(OpKind.BARRIER)]}
    st.awaiting({"a": 5, "b": 6})
    assert st.answered("a", 5) == {} and st.answered("b", 99) == {}  # not its barrier
    assert st.expired(10.5) == {}
    assert st.answered("b", 6) == {"b": [_mod(1, 1, 3), Op(OpKind.BARRIER)]}
    assert st.held == {} and st.answered("b", 6) == {}


def test_a_reroute_without_narrowing_goes_at_once_and_a_held_stage_never_lands_late():
    st = Stager(timeout_s=1.0)
    old = {"a": _Tables(g1=(1,)), "b": _Tables(g1=(2,))}
    ops, staged = st.plan(old, {"a": [_mod(1, 1, 2), Op(OpKind.BARRIER)]}, 0.0)
    assert not staged and ops == {"a": [_mod(1, 1, 2), Op(OpKind.BARRIER)]}
    ops, staged = st.plan(old, {"b": [_mod(1, 3), Op(OpKind.BARRIER)]}, 0.0, "y")
    assert staged and st.held == {"b": [_mod(1, 3), Op(OpKind.BARRIER)]}
    # another message for b goes after what is held for it
    assert st.before_send({"b": [_mod(2, 4)]}) == {"b": [_mod(1, 3), Op(OpKind.BARRIER),
                                                         _mod(2, 4)]}
    ops, staged = st.plan(old, {"b": [_mod(1, 3), Op(OpKind.BARRIER)]}, 0.0)
    st.awaiting({"b": 1})
    assert st.left("b") == {} and st.held == {}  # b left: its held stage is stale
    st.plan(old, {"a": [_mod(1, 2), Op(OpKind.BARRIER)],
                  "b": [_mod(1, 3), Op(OpKind.BARRIER)]}, 5.0)
    st.awaiting({"a": 1, "b": 2})
    assert st.left("a") == {}  # b still to answer
    assert st.expired(5.5) == {}
    assert st.expired(6.0) == {"b": [_mod(1, 3), Op(OpKind.BARRIER)]}


@pytest.mark.parametrize("a,b", [("agg1_1", "edge1_1"), ("agg3_2", "core3")])
def test_other_failures_in_two_stages_form_no_loop(a, b):
    topo = fat_tree(4)
    policy = FabricPolicy(topo)
    switches = _connect_all(topo, policy)
    changes, dead = _fail(topo, policy, a, b)
    _staged_without_loops(topo, policy, switches, changes, dead)
