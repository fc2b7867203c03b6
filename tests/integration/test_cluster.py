"""Beyond one machine, its first piece for real: a cut link between two "machines" (network
namespaces joined by a veth underlay, each with its own underlay address) is a pair of VXLAN
devices made by the project's netlink adapter inside each machine, carrying full-MTU frames
from one to the other, shaped like a veth end; an underlay too small for them drops them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.model.partition import VXLAN_OVERHEAD
from tests.integration.cluster_cli import fabriclab_cli

ROOT = Path(__file__).resolve().parents[2]
UNDERLAY = ("10.250.0.1", "10.250.0.2")
OVERLAY = ("192.168.77.1", "192.168.77.2")


def _sh(*cmd: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    argv = (["ip", "netns", "exec", ns] if ns else []) + list(cmd)
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: {proc.stdout}{proc.stderr}")
    return proc


def _in_machine(ns: str, code: str) -> None:
    """Run Python (the project's adapters) inside a machine's namespace."""
    _sh(sys.executable, "-c", code, ns=ns)


@pytest.fixture
def machines():
    """Two machines as namespaces, an underlay veth between them (MTU 1550: a 1500-byte fabric
    in VXLAN, no more), removed afterwards with everything in them."""
    names = (f"flm1-{os.getpid()}", f"flm2-{os.getpid()}")
    for ns in names:
        _sh("ip", "netns", "add", ns)
    try:
        _sh("ip", "link", "add", "flu1", "mtu", "1550", "type", "veth", "peer", "name", "flu2",
            "mtu", "1550")
        for ns, dev, addr in zip(names, ("flu1", "flu2"), UNDERLAY):
            _sh("ip", "link", "set", dev, "netns", ns)
            _sh("ip", "addr", "add", f"{addr}/24", "dev", dev, ns=ns)
            _sh("ip", "link", "set", dev, "up", ns=ns)
            _sh("ip", "link", "set", "lo", "up", ns=ns)
        yield names
    finally:
        for ns in names:
            _sh("ip", "netns", "del", ns, check=False)


def test_a_cut_link_is_a_vxlan_pair_carrying_full_frames_between_machines(machines):
    for i, ns in enumerate(machines):
        local, remote = UNDERLAY[i], UNDERLAY[1 - i]
        _in_machine(ns, f"""
import sys; sys.path.insert(0, {str(ROOT)!r})
from testbed.linux.netlink import Netlink
from testbed.plan.tcplan import plan_shaping
nl = Netlink()
nl.create_vxlan("agg1_1-eth3", 1000, {local!r}, {remote!r}, mtu=1500)
assert nl.mtu("flu{i + 1}") == 1550
nl.shape("agg1_1-eth3", plan_shaping(10, 1500))
nl.set_state("agg1_1-eth3", True)
""")
        kinds = _sh("tc", "qdisc", "show", "dev", "agg1_1-eth3", ns=ns).stdout
        assert "qdisc htb 1:" in kinds and "qdisc bfifo 10:" in kinds, kinds
        _sh("ip", "addr", "add", f"{OVERLAY[i]}/24", "dev", "agg1_1-eth3", ns=ns)
    detail = _sh("ip", "-d", "link", "show", "agg1_1-eth3", ns=machines[0]).stdout
    assert "vxlan id 1000" in detail and f"remote {UNDERLAY[1]}" in detail, detail
    assert "nolearning" in detail and "mtu 1500" in detail and "df set" in detail, detail
    # a full frame with DF set crosses (1472 bytes of ICMP payload: a 1500-byte IP packet)
    ping = _sh("fping", "-c", "3", "-p", "200", "-t", "2000", "-M", "-b", "1472", OVERLAY[1],
               ns=machines[0], check=False)
    assert ping.returncode == 0, ping.stdout + ping.stderr
    # the same frames over an underlay that has no room for the encapsulation are lost
    for ns, dev in zip(machines, ("flu1", "flu2")):
        _sh("ip", "link", "set", dev, "mtu", str(1500 + VXLAN_OVERHEAD - 1), ns=ns)
    small = _sh("fping", "-c", "2", "-p", "200", "-t", "1000", "-M", "-b", "1472", OVERLAY[1],
                ns=machines[0], check=False)
    assert small.returncode != 0, small.stdout + small.stderr  # dropped, never fragmented


DRIVER = """
import json, sys
import ray
sys.path.insert(0, {root!r})
ray.init(address={address!r}, logging_level="ERROR", log_to_driver=False)


@ray.remote(num_cpus=0, resources={{"machine2": 0.01}})
class Builder:
    def where(self):
        return ray.util.get_node_ip_address()

    def cut_link_end(self, name, vni, local, remote):
        from testbed.linux.netlink import Netlink
        nl = Netlink()
        try:
            nl.create_vxlan(name, vni, local, remote, mtu=1500)
            return nl.mtu(name)
        finally:
            nl.close()


builder = Builder.remote()
print(json.dumps({{"ip": ray.get(builder.where.remote()),
                   "mtu": ray.get(builder.cut_link_end.remote("agg1_1-eth3", 1000,
                                                              "10.250.0.2", "10.250.0.1")),
                   "nodes": len([n for n in ray.nodes() if n["Alive"]])}}))
"""


def test_a_ray_cluster_of_namespace_machines_builds_on_the_machine_it_is_told(tmp_path):
    """Two machines as namespaces, a Ray head in one and a worker in the other, every Ray
    process started and ended by PID: a driver on the head pins an actor to machine2 by its
    resource, and the actor makes a cut link's VXLAN end there, in machine2's namespace."""
    from testbed.cluster.nscluster import NamespaceCluster
    from testbed.linux.procfs import descendants

    ray = str(Path(sys.executable).parent / "ray")
    with NamespaceCluster(2, ray) as cluster:
        heads = [cluster.machines[0].ray.pid, *descendants(cluster.machines[0].ray.pid)]
        assert cluster.nodes_alive() == 2
        driver = cluster.run("machine1", [sys.executable, "-c", DRIVER.format(
            root=str(ROOT), address=cluster.address)], timeout_s=180)
        assert driver.returncode == 0, driver.stdout[-2000:] + driver.stderr[-3000:]
        out = json.loads(driver.stdout.strip().splitlines()[-1])
        assert out == {"ip": "10.250.0.2", "mtu": 1500, "nodes": 2}, out
        made = _sh("ip", "-d", "link", "show", "agg1_1-eth3", ns=cluster.machines[1].netns)
        assert "vxlan id 1000" in made.stdout
        assert _sh("ip", "link", "show", "agg1_1-eth3", ns=cluster.machines[0].netns,
                   check=False).returncode != 0  # only on machine2
    # nothing left: the head's processes ended by PID, the namespaces and bridge gone
    assert not [p for p in heads if Path(f"/proc/{p}").exists()
                and "Z" not in Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1][:3]]
    assert not [ns for ns in _sh("ip", "netns", "list").stdout.split()
                if ns.startswith(("flm1-", "flm2-")) and ns.endswith(cluster.tag)]


PLAN = """
import json, sys
sys.path.insert(0, {root!r})
from testbed.cluster.machines import Cluster
from testbed.errors import ConfigError
from testbed.model.partition import Machine, cut_links, partition
from testbed.model.builders import fat_tree

cluster = Cluster({address!r})
try:
    topo = fat_tree(4)
    machines = cluster.machines
    plan = partition(topo, [Machine(n, 800) for n in sorted(machines)])
    under = {{n: m.underlay for n, m in machines.items()}}
    mtus = {{n: m.underlay_mtu for n, m in machines.items()}}
    try:
        cut_links(plan, under, 9000, mtus)
        jumbo = None
    except ConfigError as err:
        jumbo = str(err)
    tunnels = cut_links(plan, under, 1500, mtus)
    print(json.dumps({{"machines": {{n: [m.underlay, m.underlay_mtu, m.fabriclab != "not installed",
                                         m.revision == {revision!r}]
                                     for n, m in machines.items()}},
                       "ends": {{n: sorted(t.end(n)[1:] for t in tunnels
                                           if n in (t.a_machine, t.b_machine))
                                for n in machines}},
                       "vnis": sorted(t.vni for t in tunnels), "jumbo": jumbo}}), flush=True)
finally:
    cluster.close()
"""


def test_the_cluster_probes_its_machines_and_plans_their_cut_links(tmp_path):
    """k=4 over two namespace machines: each machine's actor reports its underlay (address,
    MTU 1550), the project and its revision; a jumbo fabric is refused for that underlay,
    naming the machine; the 8 cut links (one VNI each) have one end on each machine, from its
    underlay address to the other's. (The quickstart test below builds them.)"""
    from testbed.cluster.nscluster import NamespaceCluster
    from testbed.linux.environment import software_versions

    ray = str(Path(sys.executable).parent / "ray")
    with NamespaceCluster(2, ray) as cluster:
        driver = cluster.run("machine1", [sys.executable, "-c", PLAN.format(
            root=str(ROOT), address=cluster.address,
            revision=software_versions()["git_revision"])], timeout_s=180)
        assert driver.returncode == 0, driver.stdout[-2000:] + driver.stderr[-3000:]
        out = json.loads(driver.stdout.strip().splitlines()[-1])
        assert out["machines"] == {"machine1": ["10.250.0.1", 1550, True, True],
                                   "machine2": ["10.250.0.2", 1550, True, True]}, out
        assert "machine1's underlay MTU is 1550: fabric.mtu 9000 in VXLAN needs 9050" in \
            out["jumbo"], out["jumbo"]
        assert out["vnis"] == list(range(1000, 1008))
        assert out["ends"]["machine1"] == [["10.250.0.1", "10.250.0.2"]] * 8, out["ends"]
        assert out["ends"]["machine2"] == [["10.250.0.2", "10.250.0.1"]] * 8, out["ends"]
    assert not cluster.errors


FAULTS = """version: 1
name: faults
fabric: {topology: fat_tree, k: 4, mtu: 1500}
controller: {routing: dmodk}
workload:
  collectives: [{op: all_reduce, algorithm: ring, size: 1MiB, ranks: 16}]
"""
#: what scripts/test-deps.sh installs beside the venv: a Ray the cluster does not run
OTHER_RAY = ROOT / ".test-deps" / "ray-other"
PROJECT = ("controllers", "fabriclab", "telemetry", "testbed", "traffic")


def _only_ray_in(m) -> list[str]:
    """Processes in machine ``m``'s namespace that are not its Ray node's (a fabric part's
    shells, vswitchds, agents would be)."""
    from testbed.linux.procfs import descendants

    ray = {m.ray.pid, *descendants(m.ray.pid)}
    pids = subprocess.run(["ip", "netns", "pids", m.netns], capture_output=True,
                          text=True).stdout.split()
    return [Path(f"/proc/{p}/cmdline").read_text().replace("\0", " ")[:120]
            for p in pids if int(p) not in ray and Path(f"/proc/{p}").exists()]


def test_faults_at_the_join_are_one_clear_error_each(tmp_path):
    """Faults at the join, each one error before anything is built, nothing left on any
    machine: machine2's Ray node runs where the project is not installed (a mount namespace
    hides its packages, as on a machine that never got it), so its actor cannot start; a
    coordinator whose Ray is another version than the cluster's; a head that cannot be
    reached, or an address where no head listens."""
    from testbed.cluster.agent import machine_state_dir
    from testbed.cluster.nscluster import NamespaceCluster
    from testbed.runs.registry import Registry

    assert (OTHER_RAY / "VERSION").exists(), "run scripts/test-deps.sh (make test does)"
    other = (OTHER_RAY / "VERSION").read_text().strip()
    exp = tmp_path / "faults.yaml"
    exp.write_text(FAULTS)
    ray = str(Path(sys.executable).parent / "ray")
    with NamespaceCluster(2, ray, hidden={"machine2": [ROOT / p for p in PROJECT]}) as cluster:
        m1, m2 = cluster.machines
        missing = fabriclab_cli(["up", str(exp), "--check", "--cluster", cluster.address],
                       tmp_path / "coord", cluster)
        text = missing.stdout + missing.stderr
        assert missing.returncode == 3, text[-3000:]
        assert "1 of the cluster's 2 machines cannot run fabriclab's actor" in text, text[-3000:]
        assert "machine2: ModuleNotFoundError: No module named 'testbed" in text, text[-3000:]
        assert "machine1:" not in text.split("actor:", 1)[1].split("(install", 1)[0]
        assert f"at the same path as here, {ROOT}" in text, text[-3000:]
        mismatch = cluster.run("machine1", [
            sys.executable, "-m", "fabriclab.cli", "--state-dir", str(tmp_path / "coord"), "up",
            str(exp), "--check", "--cluster", cluster.address, "--json"],
            env={"PYTHONPATH": f"{OTHER_RAY}:{ROOT}"}, timeout_s=300)
        text = mismatch.stdout + mismatch.stderr
        assert mismatch.returncode == 3, text[-3000:]
        import ray as cluster_ray
        assert (f"Ray version mismatch with the cluster at {cluster.address}: it runs Ray "
                f"{cluster_ray.__version__} (Python {sys.version.split()[0]}), this machine "
                f"Ray {other}") in text, text[-3000:]
        # a head that cannot be reached, or is not a head
        for head, why in (("10.251.0.1:6379", "Network is unreachable"),  # no route there
                          ("10.250.0.2:6379", "Connection refused")):  # a worker, no head
            gone = fabriclab_cli(["up", str(exp), "--check", "--cluster", head], tmp_path / "coord",
                        cluster)
            assert gone.returncode == 3, (gone.stdout + gone.stderr)[-3000:]
            assert f"cannot reach the Ray cluster's head at {head}: {why}" in \
                gone.stdout + gone.stderr, (gone.stdout + gone.stderr)[-3000:]
        for m in (m1, m2):  # nothing was built anywhere
            assert _only_ray_in(m) == [], (m.name, _only_ray_in(m))
            links = _sh("ip", "-o", "link", "show", ns=m.netns).stdout.splitlines()
            assert len(links) == 2, links  # lo and the underlay
            assert Registry(machine_state_dir(m.name)).scan() == ([], [])
    assert not cluster.errors, cluster.errors
