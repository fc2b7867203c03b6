"""The server and rail model: names, addresses, rails, scale-up links and routes."""

from __future__ import annotations

import pytest

from testbed.errors import ConfigError
from testbed.model.servers import (
    ScaleUp,
    ScaleUpHop,
    ServerSpec,
    cube_mesh_pairs,
    describe,
    place_servers,
    rail_optimized,
    scale_up_routes,
)
from testbed.model.topology import from_dict
from testbed.model.builders import leaf_spine


def test_a_rail_optimized_fabric_puts_gpu_g_of_every_server_on_rail_g():
    topo = rail_optimized(ServerSpec(4, 4, ScaleUp.SWITCH, 40.0), spines=2)
    assert [s.name for s in topo.access_switches] == ["rail1", "rail2", "rail3", "rail4"]
    assert len(topo.hosts) == 16 and len(topo.switches) == 6
    end = topo.attachment("s2g3")
    assert (end.node, end.port) == ("rail3", 2)
    assert topo.nodes["s2g3"].ip == "10.0.3.2" and topo.nodes["rail3"].subnet == "10.0.3.0/24"
    # every leaf to every spine; spine port l faces leaf l
    assert topo.link_at("spine2", 4).other("spine2").node == "rail4"
    assert topo.oversubscription() == pytest.approx(4 * 100 / (2 * 100))
    # same rail: one leaf; across rails: up a spine
    assert topo.equal_cost_paths("s1g1", "s4g1") == [["s1g1", "rail1", "s4g1"]]
    assert topo.equal_cost_paths("s1g1", "s2g2") == [["s1g1", "rail1", "spine1", "rail2", "s2g2"],
                                                     ["s1g1", "rail1", "spine2", "rail2", "s2g2"]]
    assert topo.server_of("s3g2").name == "s3" and topo.server_of("spine1") is None
    assert topo.server_of("s3g2").gpus == ("s3g1", "s3g2", "s3g3", "s3g4")


def test_a_rail_splits_over_leaves_of_servers_per_leaf_servers():
    topo = rail_optimized(ServerSpec(4, 2), spines=1, servers_per_leaf=2)
    assert [s.name for s in topo.access_switches] == ["rail1_1", "rail1_2", "rail2_1", "rail2_2"]
    assert topo.attachment("s3g2").node == "rail2_2" and topo.attachment("s3g2").port == 1
    assert topo.nodes["s3g2"].ip == "10.0.4.1"


def test_servers_on_a_leaf_spine_take_the_hosts_places_in_order():
    topo = place_servers(leaf_spine(4, 2, 4), ServerSpec(4, 4, ScaleUp.FULL_MESH, 50.0))
    assert [h.name for h in topo.hosts if topo.attachment(h.name).node == "leaf1"] == \
        ["s1g1", "s1g2", "s1g3", "s1g4"]
    assert topo.host_link("s2g1").a.ifname == "s2g1-eth0"
    assert topo.nodes["s2g1"].ip == "10.0.2.1"
    assert topo.params["gpus_per_server"] == 4
    with pytest.raises(ConfigError, match="servers: 3 servers x 4 GPUs are 12 NICs, but the "
                                          "leaf_spine has 16"):
        place_servers(leaf_spine(4, 2, 4), ServerSpec(3, 4))


@pytest.mark.parametrize("kind, links, degree", [(ScaleUp.SWITCH, 8, 1),
                                                  (ScaleUp.FULL_MESH, 28, 7),
                                                  (ScaleUp.CUBE_MESH, 16, 4)])
def test_scale_up_links_per_kind(kind, links, degree):
    topo = rail_optimized(ServerSpec(2, 8, kind, 100.0), spines=1)
    assert len(topo.scale_up) == 2 * links
    assert all(link.tier == "scale_up" and link.rate_mbps == 100.0 for link in topo.scale_up)
    assert len(topo.scale_up_ports("s1g1")) == degree
    assert list(topo.ports("s1g1")) == [0]  # the controller's view: the NIC only
    assert set(topo.scale_up_ports("s1g1")) == set(range(1, degree + 1))


def test_scale_up_routes_go_direct_or_through_one_relaying_gpu():
    cube = rail_optimized(ServerSpec(1, 8, ScaleUp.CUBE_MESH, 100.0), spines=1)
    routes = scale_up_routes(cube)
    assert len(cube_mesh_pairs()) == 16
    assert routes["s1g1"]["s1g5"].via is None  # a cross link
    assert routes["s1g1"]["s1g6"].via == "s1g2"  # 1-2 in the quad, 2-6 across
    assert routes["s1g1"]["s1g6"].ifname == routes["s1g1"]["s1g2"].ifname
    assert all(len(table) == 7 for table in routes.values())
    switched = rail_optimized(ServerSpec(2, 4, ScaleUp.SWITCH, 100.0), spines=1)
    table = scale_up_routes(switched)["s2g3"]
    assert set(table) == {"s2g1", "s2g2", "s2g4"}  # its own server's GPUs only
    assert set(table.values()) == {ScaleUpHop("s2g3-eth1")}
    assert switched.link_at("nvs2", 3).other("nvs2").node == "s2g3"


def test_the_model_round_trips_through_the_controllers_json():
    topo = rail_optimized(ServerSpec(2, 4, ScaleUp.FULL_MESH, 100.0), spines=2)
    again = from_dict(topo.to_dict())
    assert again == topo and again.servers == topo.servers and again.scale_up == topo.scale_up


def test_bad_servers_name_the_field():
    with pytest.raises(ConfigError, match="servers.scale_up.kind: cube_mesh is DGX-1"):
        rail_optimized(ServerSpec(2, 4, ScaleUp.CUBE_MESH), spines=1)
    with pytest.raises(ConfigError, match="servers.gpus_per_server"):
        rail_optimized(ServerSpec(2, 17), spines=1)
    with pytest.raises(ConfigError, match="servers.scale_up.rate_mbps"):
        rail_optimized(ServerSpec(2, 4, ScaleUp.SWITCH, 0), spines=1)


RAILS = {"version": 1, "fabric": {
    "topology": "rail_optimized", "spines": 2,
    "servers": {"count": 4, "gpus_per_server": 4, "scale_up": {"kind": "switch", "rate_mbps": 40}},
    "host_link": {"rate_mbps": 10}, "fabric_link": {"rate_mbps": 10}}}


def _rails(*collectives, **fabric):
    from fabriclab.model import experiment as xp
    data = {**RAILS, "fabric": {**RAILS["fabric"], **fabric},
            "workload": {"collectives": list(collectives)}}
    return xp.parse(data)


def test_ranks_count_gpus_as_nccl_does_and_hierarchical_schedules_run_on_whole_servers():
    exp = _rails({"op": "all_reduce", "size": "4MiB", "ranks": 16, "algorithm": "hierarchical"},
                 {"op": "all_reduce", "size": "4MiB", "ranks": 16},
                 {"op": "all_to_all", "size": "4MiB", "ranks": 8, "algorithm": "pxn"})
    hier, flat, pxn = (job.collectives[0] for job in exp.workload.jobs)
    assert hier.hosts[:5] == ("s1g1", "s1g2", "s1g3", "s1g4", "s2g1")  # server-major
    assert hier.servers == (1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4)
    size = 4 << 20
    # flat ring: 2 (N-1)/N x size per rank, the 4 server-crossing ring links x 16 ... the formula
    n, g, s = 16, 4, 4
    assert flat.scale_out_bytes() == pytest.approx(s * 2 * (n - 1) / n * size, rel=1e-3)
    # hierarchical: each GPU sends 2 (S-1)/(S g) x size across servers
    assert hier.scale_out_bytes() == pytest.approx(n * 2 * (s - 1) / (s * g) * size, rel=1e-3)
    assert flat.scale_out_bytes() / hier.scale_out_bytes() == pytest.approx(
        (2 * (n - 1) / n * s) / (n * 2 * (s - 1) / (s * g)), rel=1e-3)
    assert pxn.schedule.algorithm == "pxn" and pxn.hosts == tuple(f"s{i}g{j}" for i in (1, 2)
                                                                  for j in range(1, 5))


def test_a_hierarchical_schedule_refuses_ranks_that_are_not_whole_servers():
    with pytest.raises(ConfigError, match=r"workload.collectives\[0\].ranks: the hierarchical "
                                          "algorithm needs whole servers"):
        _rails({"op": "all_reduce", "size": "1MiB", "ranks": 6, "algorithm": "hierarchical"})
    with pytest.raises(ConfigError, match="needs whole servers"):
        _rails({"op": "all_reduce", "size": "1MiB", "algorithm": "hierarchical",
                "ranks": ["s1g2", "s1g1", "s1g3", "s1g4"]})
    from fabriclab.model import experiment as xp
    with pytest.raises(ConfigError, match="runs on servers of GPUs"):
        xp.parse({"version": 1, "fabric": {"topology": "fat_tree", "k": 4}, "workload": {
            "collectives": [{"op": "all_to_all", "size": "1MiB", "ranks": 4,
                             "algorithm": "pxn"}]}})


def test_servers_fields_are_checked_by_name():
    from fabriclab.model import experiment as xp
    with pytest.raises(ConfigError, match="fabric.servers: required for topology rail_optimized"):
        xp.parse({"version": 1, "fabric": {"topology": "rail_optimized", "spines": 1}})
    with pytest.raises(ConfigError, match="fabric.servers_per_leaf: only applies to topology "
                                          "rail_optimized"):
        xp.parse({"version": 1, "fabric": {"topology": "fat_tree", "k": 4,
                                           "servers_per_leaf": 2}})
    with pytest.raises(ConfigError, match="fabric.servers: 3 servers x 4 GPUs are 12 NICs"):
        xp.parse({"version": 1, "fabric": {
            "topology": "fat_tree", "k": 4, "servers": {
                "count": 3, "gpus_per_server": 4, "scale_up": {"rate_mbps": 40}}}})
    on_fat_tree = xp.parse({"version": 1, "fabric": {
        "topology": "fat_tree", "k": 4, "servers": {
            "count": 4, "gpus_per_server": 4, "scale_up": {"kind": "full_mesh",
                                                           "rate_mbps": 40}}}})
    assert on_fat_tree.topology.rank_hosts()[:2] == ["s1g1", "s1g2"]
    assert len(on_fat_tree.topology.scale_up) == 4 * 6


def test_the_byte_counts_predict_each_schedule_link_by_link():
    from traffic.predict.ideal import FluidModel

    colls = ({"op": "all_reduce", "size": "4MiB", "ranks": 16, "algorithm": "hierarchical"},
             {"op": "all_reduce", "size": "4MiB", "ranks": 16},
             {"op": "all_to_all", "size": "4MiB", "ranks": 16, "algorithm": "pxn"})
    size_s = (4 << 20) * 8 / 10e6  # the whole size through one NIC
    # 1:1 (4 spines): the flat ring's 30 steps of size/16, each waiting on a NIC; the
    # hierarchical one's 2 x 3 steps of size/4 at 4x the NIC rate and 6 of size/16 on the rails
    hier, flat, pxn = (j.collectives[0] for j in _rails(*colls, spines=4).workload.jobs)
    model = FluidModel(_rails(*colls, spines=4).topology)
    assert model.ideal_s(flat.schedule, flat.hosts) == pytest.approx(30 / 16 * size_s)
    assert model.ideal_s(hier.schedule, hier.hosts) == pytest.approx((6 / 16 + 6 / 16) * size_s)
    # 2:1 (2 spines): the flat ring's four server-crossing links all leave rail 4's leaf, two
    # flows per uplink; the hierarchical one never leaves a rail leaf
    exp = _rails(*colls)
    hier, flat, pxn = (j.collectives[0] for j in exp.workload.jobs)
    model = FluidModel(exp.topology)
    assert model.ideal_s(flat.schedule, flat.hosts) == pytest.approx(2 * 30 / 16 * size_s)
    assert model.ideal_s(hier.schedule, hier.hosts) == pytest.approx(12 / 16 * size_s)
    # PXN: step 0 three quarters of the size out of each GPU's one link to the NVSwitch at
    # 40 Mbit/s (a quarter to each local peer), step 1 three quarters out of its NIC, on its rail
    assert model.ideal_s(pxn.schedule, pxn.hosts) == pytest.approx((3 / 4 / 4 + 3 / 4) * size_s)
    assert model.shares("s1g1", "s1g2") == [(("s1g1", "nvs1"), 1.0), (("nvs1", "s1g2"), 1.0)]
    assert sorted(model.shares("s1g1", "s2g2")) == sorted([
        (("s1g1", "rail1"), 1.0), (("rail1", "spine1"), 0.5), (("rail1", "spine2"), 0.5),
        (("spine1", "rail2"), 0.5), (("spine2", "rail2"), 0.5), (("rail2", "s2g2"), 1.0)])


def test_training_keeps_tensor_and_expert_parallelism_inside_a_server():
    from fabriclab.model import experiment as xp
    base = {**RAILS, "workload": {"training": {"tp": 4, "dp": 4, "pp": 1, "layers": 1,
                                               "micro_batches": 1}}}
    job = xp.parse(base).workload.jobs[0]
    by_phase = {c.label.split(" ", 1)[1]: c for c in job.collectives}
    tp = next(c for label, c in by_phase.items() if "tp all_reduce" in label)
    dp = next(c for label, c in by_phase.items() if "dp" in label)
    assert tp.scale_out_bytes() == 0 and tp.moved_bytes() > 0  # all on the scale-up
    assert dp.scale_out_bytes() == dp.moved_bytes()  # one GPU per server in each DP group
    bad = {**RAILS, "workload": {"training": {"tp": 8, "dp": 2}}}
    with pytest.raises(ConfigError, match="workload.training.tp: tp = 8 does not divide the 4 "
                                          "GPUs"):
        xp.parse(bad)


def test_a_128_rank_nccl_log_maps_rank_r_to_server_r_div_8_gpu_r_mod_8(tmp_path):
    from fabriclab.model import experiment as xp
    # 16 servers x 8 GPUs, each printing its line of one AllReduce (NCCL's format, as in
    # ../shared/data/nccl): host gpuS, local rank [g]
    lines = [f"gpu{r // 8}:{1000 + r}:{2000 + r} [{r % 8}] NCCL INFO AllReduce: opCount 1 "
             f"sendbuff 0x{r:x}00 recvbuff 0x{r:x}80 count 262144 datatype 7 op 0 root 0 "
             f"comm 0x7f{r:04x} [nranks=128] stream 0x7e{r:04x}" for r in range(128)]
    (tmp_path / "nccl.log").write_text("\n".join(lines) + "\n")
    exp = xp.parse({"version": 1, "fabric": {
        "topology": "rail_optimized", "spines": 2,
        "servers": {"count": 16, "gpus_per_server": 8, "scale_up": {"rate_mbps": 100}},
        "host_link": {"rate_mbps": 1}, "fabric_link": {"rate_mbps": 1}},
        "emulator": {"fidelity": "off"},
        "workload": {"nccl_log": "nccl.log"}}, source=str(tmp_path / "x.yaml"))
    coll = exp.workload.jobs[0].collectives[0]
    assert coll.schedule.communicator_size == 128 and coll.op == "all_reduce"
    assert all(coll.hosts[r] == f"s{r // 8 + 1}g{r % 8 + 1}" for r in range(128))
    assert coll.servers[127] == 16


def test_the_fidelity_budget_counts_no_switch_hops_inside_a_server():
    from testbed.plan.fidelity import mean_switch_hops
    topo = rail_optimized(ServerSpec(4, 4, ScaleUp.SWITCH, 40.0), spines=2)
    # from a GPU: 3 peers in its server (0), 3 on its rail (1 leaf), 9 across rails (3)
    assert mean_switch_hops(topo) == pytest.approx((3 * 1 + 9 * 3) / 15)


def test_a_multi_plane_rail_fabric_is_disjoint_copies_with_a_nic_port_on_each():
    topo = rail_optimized(ServerSpec(2, 2), spines=1, planes=2)
    assert [s.name for s in topo.access_switches] == ["p1rail1", "p1rail2", "p2rail1", "p2rail2"]
    assert sorted(s.name for s in topo.switches if s.role == "spine") == ["p1spine1", "p2spine1"]
    assert len({s.dpid for s in topo.switches}) == len(topo.switches) == 6
    # the GPU is its plane-1 NIC; its plane-2 NIC is a host of plane 2 in the GPU's namespace
    assert topo.nics("s2g1") == ("s2g1", "s2g1n2") and topo.nic_owner("s2g1n2") == "s2g1"
    assert topo.nic_owner("s2g1") == "s2g1" and topo.nics("p1rail1") == ("p1rail1",)
    assert [topo.plane_of(n) for n in ("s2g1", "s2g1n2")] == [1, 2]
    assert topo.nodes["s2g1"].ip == "10.0.1.2" and topo.nodes["s2g1n2"].ip == "10.1.1.2"
    assert topo.nodes["p2rail2"].subnet == "10.1.2.0/24"
    assert topo.attachment("s1g2n2").node == "p2rail2"
    assert topo.rank_hosts() == ["s1g1", "s1g2", "s2g1", "s2g2"]  # ranks are GPUs, not NICs
    # the planes share no switch: a plane-2 NIC reaches plane 2 only
    assert topo.equal_cost_paths("s1g1n2", "s2g2n2") == [
        ["s1g1n2", "p2rail1", "p2spine1", "p2rail2", "s2g2n2"]]
    assert from_dict(topo.to_dict()).nics("s1g2") == ("s1g2", "s1g2n2")
    assert "a port on each of 2 planes" in describe(topo)
    with pytest.raises(ConfigError, match="planes"):
        rail_optimized(ServerSpec(2, 2), spines=1, planes=9)


def test_one_plane_keeps_the_plain_names():
    topo = rail_optimized(ServerSpec(2, 2), spines=1, planes=1)
    assert [s.name for s in topo.access_switches] == ["rail1", "rail2"]
    assert topo.nics("s1g1") == ("s1g1",) and topo.plane_of("s1g1") == 1


@pytest.mark.parametrize("routing", ["ecmp", "dmodk", "adaptive", "spray"])
def test_the_controller_routes_each_plane_on_its_own_switches(routing):
    from controllers.routing.policy import FabricPolicy, Routing

    topo = rail_optimized(ServerSpec(2, 2), spines=2, planes=2)
    tables = FabricPolicy(topo, Routing(routing)).desired()
    assert set(tables) == {s.name for s in topo.switches}
    for name, table in tables.items():  # no switch of one plane routes the other's addresses
        other = "10.0." if name.startswith("p2") else "10.1."
        assert other not in repr(table), name


def test_a_multi_plane_workload_spreads_its_connections_over_the_planes():
    from traffic.workloads.workload import parse_workload

    topo = rail_optimized(ServerSpec(2, 2), spines=1, planes=2)
    coll = {"collectives": [{"op": "all_reduce", "size": "1MiB"}]}
    work = parse_workload(topo, coll)
    assert work.connections == 2  # one per plane by default
    assert work.jobs[0].collectives[0].hosts == ("s1g1", "s1g2", "s2g1", "s2g2")
    assert parse_workload(topo, {**coll, "connections": 4}).connections == 4
    with pytest.raises(ConfigError, match="workload.connections: 3 connections per peer do "
                                          "not spread evenly over the fabric's 2 planes"):
        parse_workload(topo, {**coll, "connections": 3})
    with pytest.raises(ConfigError, match=r"ranks\[1\]: s1g2n2 is the plane-2 NIC of s1g2"):
        parse_workload(topo, {"collectives": [{"op": "all_reduce", "size": "1MiB",
                                               "ranks": ["s1g1", "s1g2n2"]}]})


def test_a_rank_addresses_a_peer_on_the_plane_of_each_connection():
    from traffic.protocol import RankSpec

    a = RankSpec("s1g1", "10.0.1.1", ("10.1.1.1",), 1)
    b = RankSpec("s2g1", "10.0.1.2", ("10.1.1.2",), 2)
    same_server = RankSpec("s1g2", "10.0.2.1", ("10.1.2.1",), 1)
    assert [b.address_for(a, c) for c in range(4)] == ["10.0.1.2", "10.1.1.2"] * 2
    assert same_server.address_for(a, 1) == "10.0.2.1"  # over the scale-up domain
    assert RankSpec("h1", "10.0.0.1").address_for(a, 1) == "10.0.0.1"


def test_a_multi_plane_fabric_partitions_with_each_gpus_nics_together():
    from testbed.model.partition import Machine, partition, switch_loads

    topo = rail_optimized(ServerSpec(2, 2), spines=1, planes=2)
    loads = switch_loads(topo)
    assert loads["p1spine1"] > 0 and loads["p1spine1"] == pytest.approx(loads["p2spine1"])
    plan = partition(topo, [Machine("a", 1e4), Machine("b", 1e4)])
    for gpu in topo.rank_hosts():
        assert plan.place[gpu] == plan.place[topo.nics(gpu)[1]]
