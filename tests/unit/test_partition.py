"""Partitioning a fabric over machines: groups kept whole, load split by budget, cut links."""

from __future__ import annotations

import pytest

from testbed.errors import ConfigError
from testbed.plan.fidelity import assess
from testbed.model.partition import Machine, partition, switch_loads
from testbed.model.servers import ScaleUp, ServerSpec, rail_optimized
from testbed.model.builders import fat_tree, leaf_spine


def test_switch_loads_sum_to_the_fidelity_models_offered_load():
    for topo in (fat_tree(4, 10, 10), leaf_spine(4, 2, 4, 10, 10),
                 rail_optimized(ServerSpec(4, 4, ScaleUp.SWITCH, 40.0), 2, None, 10, 10)):
        assert sum(switch_loads(topo).values()) == pytest.approx(
            assess(topo, 9000).offered_mbit_hops)


def test_a_fat_tree_splits_by_pod_with_the_cores_spread():
    topo = fat_tree(4, 10, 10)
    plan = partition(topo, [Machine("a", 1600), Machine("b", 1600)])
    for pod in range(1, 5):  # a pod stays whole
        assert len({plan.place[n.name] for n in topo.nodes.values() if n.group == pod}) == 1
    assert sorted(plan.place[f"core{i}"] for i in range(1, 5)) == ["a", "a", "b", "b"]
    assert len(plan.cut) == 8  # each core reaches the two pods of the other machine
    assert all(l.tier == "fabric" for l in plan.cut)
    assert plan.load["a"] == pytest.approx(plan.load["b"])
    k8 = partition(fat_tree(8, 10, 10), [Machine(m, 1600) for m in "abcd"])
    assert len(k8.cut) == 16 * 6  # 16 cores, each to 6 pods elsewhere
    assert max(k8.load.values()) == pytest.approx(min(k8.load.values()))


def test_budgets_weight_the_split_and_bad_plans_name_the_field():
    topo = leaf_spine(6, 2, 4, 10, 10)
    plan = partition(topo, [Machine("big", 3200), Machine("small", 1600)])
    leaves = {m: sum(1 for n in plan.nodes(m) if n.startswith("leaf")) for m in ("big", "small")}
    assert leaves == {"big": 4, "small": 2}
    with pytest.raises(ConfigError, match="cluster.machines: 7 machines for 6 groups"):
        partition(topo, [Machine(str(i), 1) for i in range(7)])
    with pytest.raises(ConfigError, match=r"cluster.machines\[1\].budget_mbit_hops"):
        partition(topo, [Machine("a", 1), Machine("b", 0)])


def test_a_server_stays_on_one_machine_with_its_scale_up():
    topo = rail_optimized(ServerSpec(4, 4, ScaleUp.SWITCH, 40.0), 2, None, 10, 10)
    plan = partition(topo, [Machine("a", 1600), Machine("b", 1600)])
    for server in topo.servers:
        assert len({plan.place[n] for n in (*server.gpus, server.switch)}) == 1
    assert all(l.tier != "scale_up" for l in plan.cut)
    assert any(line.startswith("a: ") for line in plan.describe())


def test_validate_shows_the_plan_over_machines_like_this_one(capsys):
    import json
    from pathlib import Path

    from fabriclab.cli import main as cli

    quickstart = Path(__file__).resolve().parents[2] / "experiments" / "quickstart.yaml"
    assert cli.main(["validate", str(quickstart), "--machines", "2", "--json"]) == 0
    out = capsys.readouterr().out
    doc = json.loads(out[out.index("[\n"):])[0]
    plan = doc["partition"]
    assert sorted(plan["machines"]) == ["machine1", "machine2"]
    assert len(plan["cut_links"]) == 8
    loads = [m["load_mbit_hops"] for m in plan["machines"].values()]
    # on the datapath auto takes here (eBPF switches), with that datapath's budget
    from testbed.plan.fidelity import EBPF_SATURATION_MBIT_HOPS
    assert loads[0] == pytest.approx(loads[1]) and sum(loads) == pytest.approx(
        doc["fidelity"]["load"] * EBPF_SATURATION_MBIT_HOPS[9000])
    assert cli.main(["validate", str(quickstart), "--machines", "5"]) == 2  # 4 pods
    assert "5 machines for 4 groups" in capsys.readouterr().err  # errors go to stderr


def test_cut_links_are_vxlan_tunnels_named_as_their_veth_ends():
    from testbed.model.partition import FIRST_VNI, cut_links

    topo = fat_tree(4)
    plan = partition(topo, [Machine("m1", 800), Machine("m2", 800)])
    under = {"m1": "10.250.0.1", "m2": "10.250.0.2"}
    tunnels = cut_links(plan, under, 1500, {"m1": 1550, "m2": 9000})
    assert len(tunnels) == len(plan.cut) and [t.vni for t in tunnels] == list(
        range(FIRST_VNI, FIRST_VNI + len(plan.cut)))
    t = tunnels[0]
    name, local, remote = t.end(t.a_machine)
    assert name == t.link.a.ifname and local == under[t.a_machine] and remote == under[t.b_machine]
    assert t.end(t.b_machine) == (t.link.b.ifname, under[t.b_machine], under[t.a_machine])
    with pytest.raises(ConfigError, match=r"cluster.machines\[0\]: m1's underlay MTU is 1500: "
                                          r"fabric.mtu 1500 in VXLAN needs 1550 or more"):
        cut_links(plan, under, 1500, {"m1": 1500})
    with pytest.raises(ConfigError, match="needs 9050 or more \\(a jumbo fabric needs a jumbo"):
        cut_links(plan, under, 9000, {"m2": 1550})
    with pytest.raises(ConfigError, match=r"cluster.machines\[1\]: m2 has no underlay"):
        cut_links(plan, {"m1": "10.250.0.1"}, 1500, {})


def test_each_machine_builds_its_nodes_local_links_and_its_tunnel_ends():
    from testbed.model.partition import cut_links, machine_part

    topo = fat_tree(4)
    plan = partition(topo, [Machine("m1", 800), Machine("m2", 800)])
    tunnels = cut_links(plan, {"m1": "10.250.0.1", "m2": "10.250.0.2"}, 1500, {})
    parts = [machine_part(topo, plan, tunnels, m) for m in ("m1", "m2")]
    # every host, switch and link is built exactly once: locally or as two tunnel ends
    assert sorted(h for p in parts for h in p.hosts) == sorted(h.name for h in topo.hosts)
    assert sorted(s for p in parts for s in p.switches) == sorted(s.name for s in topo.switches)
    local = [l.name for p in parts for l in p.links]
    assert len(local) == len(set(local)) and len(local) + len(tunnels) == len(topo.links)
    for p in parts:
        for tunnel, node in p.tunnels:
            assert plan.place[node] == p.machine and node in (tunnel.link.a.node,
                                                             tunnel.link.b.node)
    assert sum(len(p.tunnels) for p in parts) == 2 * len(tunnels)
    with pytest.raises(ValueError, match="no machine m3"):
        machine_part(topo, plan, tunnels, "m3")


def test_a_failed_links_ends_go_to_the_machines_that_built_them():
    from testbed.model.partition import links_by_machine

    topo = fat_tree(4)
    plan = partition(topo, [Machine("m1", 800), Machine("m2", 800)])
    m1 = plan.place["agg1_1"]
    core = next(l.other("agg1_1").node for l in topo.ports("agg1_1").values()
                if plan.place[l.other("agg1_1").node] != m1)
    m2 = plan.place[core]  # a cut link: both machines act, each on its end
    local = ("h1_1_1", "edge1_1")
    assert links_by_machine(topo, plan.place, [("agg1_1", core), local]) == {
        m1: [("agg1_1", core), local], m2: [("agg1_1", core)]}
    with pytest.raises(KeyError):
        links_by_machine(topo, plan.place, [("agg1_1", "core9")])


def test_a_server_and_its_plane_nics_stay_on_one_machine_part():
    from testbed.model.partition import cut_links, machine_part

    topo = rail_optimized(ServerSpec(2, 2, ScaleUp.SWITCH, 40.0), spines=1, planes=2)
    plan = partition(topo, [Machine("m1", 800), Machine("m2", 800)])
    tunnels = cut_links(plan, {"m1": "10.250.0.1", "m2": "10.250.0.2"}, 1500, {})
    parts = {m: machine_part(topo, plan, tunnels, m) for m in ("m1", "m2")}
    for part in parts.values():
        for gpu in part.hosts:  # its NIC on plane 2 is built with it, its scale-up too
            assert plan.place[topo.nics(gpu)[1]] == part.machine
        assert all(plan.place[l.a.node] == part.machine for l in part.scale_up)


def test_servers_which_load_no_switch_are_still_spread_over_the_machines():
    """A server's GPUs load no switch of the model, yet their namespaces (stacks, agents) cost
    the machine that builds them: equal switch loads go by host count."""
    topo = rail_optimized(ServerSpec(4, 4, ScaleUp.SWITCH, 40.0), spines=2)
    plan = partition(topo, [Machine("m1", 800), Machine("m2", 800)])
    on = {m: sorted(s.name for s in topo.servers if plan.place[s.gpus[0]] == m)
          for m in ("m1", "m2")}
    assert on == {"m1": ["s1", "s3"], "m2": ["s2", "s4"]}, on


def test_a_ray_node_is_named_by_its_first_custom_resource_else_its_address():
    from testbed.cluster.machines import _machine_name

    node = {"NodeManagerAddress": "10.250.0.2",
            "Resources": {"CPU": 1.0, "memory": 1e9, "object_store_memory": 8e7,
                          "node:10.250.0.2": 1.0, "machine2": 1.0}}
    assert _machine_name(node) == "machine2"
    del node["Resources"]["machine2"]
    assert _machine_name(node) == "10.250.0.2"
