"""Servers of GPUs on a rail-optimized fabric: every GPU pair reaches the other, a server's own
GPUs over its scale-up domain (never its NIC), the others over the rails."""

from __future__ import annotations

import pytest

from tests.integration.conftest import experiment

RAILS = """version: 1
fabric:
  topology: rail_optimized
  spines: 1
  servers: {{count: {count}, gpus_per_server: {gpus}, scale_up: {{kind: {kind}, rate_mbps: 40}}}}
  host_link: {{rate_mbps: 10}}
  fabric_link: {{rate_mbps: 10}}
"""


def _ping(fabric, src: str, dst: str, count: int = 20) -> None:
    (code, out, err), = fabric.hosts.run_parallel({src: [
        "fping", "-q", "-c", str(count), "-p", "10", "-b", "1400",
        fabric.topo.nodes[dst].ip]}, timeout_s=30).values()
    assert code == 0, out + err


def _tx_packets(fabric, gpu: str) -> dict[str, int]:
    names = {f"{gpu}-eth{p}" for p in range(0, 8)}
    return {n: c["tx_packets"] for n, c in
            fabric.netlink.counters(names, fabric.hosts.pid(gpu)).items()}


@pytest.mark.parametrize("kind, count, gpus", [("switch", 2, 2), ("full_mesh", 2, 3),
                                                ("cube_mesh", 1, 8)])
def test_every_gpu_pair_reaches_the_other_over_the_right_domain(make_fabric, kind, count, gpus):
    fabric = make_fabric(experiment(RAILS.format(kind=kind, count=count, gpus=gpus)))
    result = fabric.reachability(count=2)
    assert result.complete, result.summary()
    topo = fabric.topo
    pairs = [("s1g1", "s1g2"), ("s1g1", f"s1g{gpus}")]
    if kind == "cube_mesh":
        pairs.append(("s1g1", "s1g6"))  # no link: relayed by s1g2
    for src, dst in pairs:
        before = _tx_packets(fabric, src)
        _ping(fabric, src, dst)
        after = _tx_packets(fabric, src)
        grew = {n for n in after if after[n] - before.get(n, 0) >= 20}
        assert f"{src}-eth0" not in grew, (src, dst, after, before)  # not the NIC
        assert grew and all(topo.link_at(src, int(n.rsplit("eth", 1)[1])).tier == "scale_up"
                            for n in grew), (src, dst, grew)
    if count > 1:  # another server's GPU: over the NIC and the rails
        before = _tx_packets(fabric, "s1g1")
        _ping(fabric, "s1g1", "s2g2")
        after = _tx_packets(fabric, "s1g1")
        assert after["s1g1-eth0"] - before["s1g1-eth0"] >= 20


def test_a_hierarchical_all_reduce_runs_with_the_byte_counts_of_its_formula(make_fabric):
    from traffic.workloads.hierarchical import all_reduce
    from traffic.agents.runner import run_job
    from traffic.workloads.workload import Collective

    fabric = make_fabric(experiment(RAILS.format(kind="switch", count=2, gpus=2)))
    ranks = tuple(fabric.topo.rank_hosts())
    assert ranks == ("s1g1", "s1g2", "s2g1", "s2g2")
    size = 1 << 20
    sched = all_reduce(2, 2, size)
    coll = Collective("all_reduce", ranks, sched, "hier", servers=(1, 1, 2, 2))
    (res,) = run_job(fabric, [coll], timeout_s=120)
    sent: dict[tuple[str, str], int] = {}
    for f in res.flows:
        sent[(f.src, f.dst)] = sent.get((f.src, f.dst), 0) + f.bytes
    # per GPU: 2 (g-1)/g x size inside its server, 2 (S-1)/(S g) x size to its rail peer
    for gpu in ranks:
        inside = sum(n for (s, d), n in sent.items() if s == gpu and d[:2] == gpu[:2])
        across = sum(n for (s, d), n in sent.items() if s == gpu and d[:2] != gpu[:2])
        assert inside == size and across == size // 2, (gpu, sent)
    assert res.scale_out_bytes == 4 * size // 2 and res.moved_bytes == 4 * (size + size // 2)
    # the byte counts' prediction on this fabric, and the run near it (a few hundred KiB per
    # step ride the shapers' burst, so a little faster than line rate is possible)
    assert 0.5 < res.ideal_s / (res.time_us / 1e6) < 1.3, (res.ideal_s, res.time_us)


@pytest.mark.parametrize("transport", ["tcp", "uet"])
def test_a_multi_plane_fabric_carries_a_job_over_every_plane(make_fabric, transport):
    """2 servers x 2 GPUs, each GPU's NIC with a port on each of 2 planes: every NIC reaches
    every NIC of its plane, and a ring all-reduce across the servers with 2 connections per
    peer puts one on each plane (both planes' host ports carry about half the bytes)."""
    from traffic.agents.runner import run_job
    from traffic.workloads.schedules import build
    from traffic.workloads.workload import Collective

    fabric = make_fabric(experiment(RAILS.format(kind="switch", count=2, gpus=2)
                                    .replace("spines: 1\n", "spines: 1\n  planes: 2\n")))
    topo = fabric.topo
    assert topo.nics("s1g1") == ("s1g1", "s1g1n2")
    result = fabric.reachability(count=2)
    assert result.complete, result.summary()
    assert result.pairs == 2 * (4 * 3)  # each plane: 4 NICs, 12 ordered pairs
    ranks = ("s1g1", "s2g1")  # rail 1 of both servers: all scale-out
    size = 4 << 20
    nics = [n for r in ranks for n in topo.nics(r)]
    before = fabric.netlink.counters({f"{n}-eth0" for n in nics}, fabric.hosts.pid("s1g1"))
    before |= fabric.netlink.counters({f"{n}-eth0" for n in nics}, fabric.hosts.pid("s2g1"))
    coll = Collective("all_reduce", ranks, build("all_reduce", 2, size, "ring"), "ring",
                      servers=(1, 2))
    (res,) = run_job(fabric, [coll], connections=2, timeout_s=120,
                     transport=transport)
    after = fabric.netlink.counters({f"{n}-eth0" for n in nics}, fabric.hosts.pid("s1g1"))
    after |= fabric.netlink.counters({f"{n}-eth0" for n in nics}, fabric.hosts.pid("s2g1"))
    sent = {n: after[f"{n}-eth0"]["tx_bytes"] - before[f"{n}-eth0"]["tx_bytes"] for n in nics}
    total = sum(sent.values())
    assert total >= 2 * size, sent  # each rank sends size (ring of 2: 2 x (1/2) x size)
    for nic, nbytes in sent.items():  # each NIC a quarter: half of its rank's, give or take
        assert 0.15 * total <= nbytes <= 0.35 * total, sent
    # two planes double a GPU's scale-out bandwidth: the prediction halves (2 x 4 MiB at
    # 10 Mbit/s would take 3.4 s on one plane), the run is near it, and its efficiency counts
    # both planes' rate
    assert res.ideal_s < 0.55 * size * 8 / 10e6, res.ideal_s
    assert 0.5 < res.ideal_s / (res.time_us / 1e6) < 1.3, (res.ideal_s, res.time_us)
    assert 0.5 < res.efficiency < 1.3, res.efficiency
