"""Pure topology model: counts, names, addresses, paths, bad shapes."""

import ipaddress

import pytest

from testbed.errors import ConfigError
from testbed.model.topology import IFNAMSIZ, all_interfaces, from_dict
from testbed.model.builders import fat_tree, leaf_spine


@pytest.mark.parametrize("k", [4, 6, 8])
def test_fat_tree_counts(k):
    topo = fat_tree(k)
    c = topo.counts()
    assert c["hosts"] == k ** 3 // 4
    assert c["switches"] == 5 * k * k // 4
    assert (c["core"], c["agg"], c["edge"]) == (k * k // 4, k * k // 2, k * k // 2)
    assert c["links"] == 3 * k ** 3 // 4
    for sw in topo.switches:  # every switch uses all k ports, numbered 1..k
        assert sorted(topo.ports(sw.name)) == list(range(1, k + 1))


@pytest.mark.parametrize("k", [4, 6, 8])
def test_fat_tree_equal_cost_paths(k):
    topo = fat_tree(k)
    half = k // 2
    assert len(topo.equal_cost_paths("h1_1_1", "h1_1_2")) == 1
    assert len(topo.equal_cost_paths("h1_1_1", "h1_2_1")) == half
    paths = topo.equal_cost_paths("h1_1_1", f"h{k}_1_1")
    assert len(paths) == half * half and all(len(p) == 7 for p in paths)


def test_leaf_spine_counts_paths_and_oversubscription():
    topo = leaf_spine(leaves=4, spines=2, hosts_per_leaf=8, host_rate_mbps=100,
                      fabric_rate_mbps=200)
    c = topo.counts()
    assert (c["leaf"], c["spine"], c["hosts"], c["links"]) == (4, 2, 32, 32 + 8)
    assert topo.oversubscription() == pytest.approx(2.0)
    assert len(topo.equal_cost_paths("h1_1", "h3_5")) == 2
    assert topo.find_link("leaf2", "spine1").rate_mbps == 200


@pytest.mark.parametrize("topo", [fat_tree(8), leaf_spine(254, 16, 48)], ids=["k8", "ls-big"])
def test_names_addresses_dpids_are_unique_and_fit(topo):
    names = [e.ifname for e in all_interfaces(topo)]
    assert len(names) == len(set(names)) and max(map(len, names)) <= IFNAMSIZ
    ips = [h.ip for h in topo.hosts]
    macs = [h.mac for h in topo.hosts]
    dpids = [s.dpid for s in topo.switches]
    assert len(set(ips)) == len(ips) and len(set(macs)) == len(macs)
    assert len(set(dpids)) == len(dpids) and all(0 < d < 2 ** 64 for d in dpids)
    for host in topo.hosts:  # each host sits in its access switch's /24
        sw = topo.nodes[topo.attachment(host.name).node]
        assert ipaddress.ip_address(host.ip) in ipaddress.ip_network(sw.subnet)


def test_deterministic_and_round_trips():
    a, b = fat_tree(4), fat_tree(4)
    assert a is not b and a.to_dict() == b.to_dict()  # two builds: the same names and numbers
    assert a.to_dict() != fat_tree(4, host_rate_mbps=50).to_dict()  # the comparison can fail
    assert (a.nodes["h1_1_1"].ip, a.nodes["h4_2_2"].ip) == ("10.1.1.1", "10.4.2.2")
    assert a.nodes["core1"].dpid == 0x01 << 40 | 1 and a.nodes["edge2_1"].dpid == \
        0x03 << 40 | 2 << 16 | 1
    topo = leaf_spine(3, 2, 2)
    again = from_dict(topo.to_dict())
    assert again.nodes == topo.nodes and again.links == topo.links
    assert topo.nodes["h2_1"].ip == "10.0.2.1" and fat_tree(4).nodes["h3_2_1"].ip == "10.3.2.1"
    assert fat_tree(4).nodes["edge2_1"].dpid_hex == "0000030000020001"


@pytest.mark.parametrize("call, field, text", [
    (lambda: fat_tree(5), "k", "must be even, got 5"),
    (lambda: fat_tree(2), "k", "must be >= 4"),
    (lambda: fat_tree(4.0), "k", "must be an integer"),
    (lambda: fat_tree(4, host_rate_mbps=0), "host_rate_mbps", "must be a number > 0"),
    (lambda: leaf_spine(2, 0, 2), "spines", "between 1 and 254, got 0"),
    (lambda: leaf_spine(0, 2, 2), "leaves", "between 1 and 254"),
    (lambda: leaf_spine(2, 2, 0), "hosts_per_leaf", "between 1 and 253"),
    (lambda: leaf_spine(2, 2, 2, fabric_rate_mbps=-5), "fabric_rate_mbps", "> 0"),
])
def test_invalid_shapes_name_the_field(call, field, text):
    with pytest.raises(ConfigError) as err:
        call()
    assert err.value.path == field and text in err.value.message
