#!/usr/bin/env python3
"""Benchmark (not a test): how much traffic this machine can carry through an emulated fabric.

On a fat-tree built by the project's own Fabric, every host sends one TCP flow (iperf3) at once,
in patterns whose paths cannot collide: same-edge, same-pod and cross-pod pairs with paths pinned
link-disjoint (``dmodk`` routing), plus a random permutation under ECMP, whose delivered share is
compared with the balls-in-bins expectation (max-min fair share over random path choices). The
link rate is swept. Per pattern and rate it prints delivered/ideal, vswitchd and machine CPU, and
the packet x switch-hop rate; at the end, the saturation point (the highest packet x switch-hop
rate sustained while delivering >= 0.90 of ideal, and the highest seen at all).

Usage: bench/capacity.py [--k 4] [--rates 10 25 50 100] [--patterns ...] [--duration 10]
                         [--set fabric.mtu=9000 ...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import itertools

import yaml

from fabriclab.model import experiment as xp
from testbed.linux import cpu
from testbed.linux import ovs
from testbed.fabric.fabric import Fabric
from testbed.plan.fidelity import capacities, ecmp_expectation, max_min_rates, switch_hops
from testbed.linux.trace import flow_path
from traffic.agents import iperf
from traffic.workloads.patterns import pattern_pairs
from traffic.measure.transport import goodput_fraction

PINNED = ("same_edge", "same_pod", "cross_pod")


def experiment_text(k: int, rate: float, routing: str, overrides: list[str]) -> dict:
    doc = {"version": 1, "name": "capacity",
           "fabric": {"topology": "fat_tree", "k": k, "host_link": {"rate_mbps": rate},
                      "fabric_link": {"rate_mbps": rate}},
           "controller": {"routing": routing},
           # overloading the machine is what this measures; on the userspace Open vSwitch
           # unless --set emulator.datapath=ebpf (or auto) says otherwise
           "emulator": {"fidelity": "warn", "datapath": "ovs"}}
    for item in overrides:
        path, _, value = item.partition("=")
        node = doc
        keys = path.split(".")
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = yaml.safe_load(value)
    return doc


def run_pattern(fabric: Fabric, flows: list[iperf.Flow], duration_s: int) -> dict:
    """All flows at once; returns delivered Mbit/s, CPU and switch counters."""
    topo = fabric.topo
    switch_ports = {e.ifname for l in topo.links for e in (l.a, l.b)
                    if topo.nodes[e.node].is_switch}
    pids = [i.pids["ovs-vswitchd"] for i in fabric.switches.instances] or ovs.vswitchd_pids()
    before: dict = {}

    def sample() -> None:
        before["counters"] = fabric.netlink.counters(switch_ports)
        before["cpu"] = cpu.sample(pids)

    rates = iperf.run(fabric, flows, duration_s, on_start=sample)
    after = cpu.sample(pids)
    after_c = fabric.netlink.counters(switch_ports)
    before_c = before["counters"]
    use = cpu.usage(before["cpu"], after)
    dt = after.time_s - before["cpu"].time_s
    tx_packets = sum(after_c[n]["tx_packets"] - before_c[n]["tx_packets"] for n in after_c)
    tx_bytes = sum(after_c[n]["tx_bytes"] - before_c[n]["tx_bytes"] for n in after_c)
    drops = sum(after_c[n]["tx_dropped"] - before_c[n]["tx_dropped"] for n in after_c)
    return {"per_flow_mbps": {f.src: mbps for f, mbps in rates.items()},
            "delivered_mbps": sum(rates.values()),
            "vswitchd_pct": sum(use.proc_pct.values()), "idle_pct": use.idle_pct,
            "pkt_hops_per_s": tx_packets / dt, "byte_hops_per_s": tx_bytes / dt,
            "avg_packet_bytes": tx_bytes / max(tx_packets, 1), "tx_dropped": drops}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--rates", type=float, nargs="+", default=[10, 25, 50, 100])
    parser.add_argument("--patterns", nargs="+", default=[*PINNED, "permutation"])
    parser.add_argument("--duration", type=int, default=10)
    parser.add_argument("--seeds", type=int, default=3,
                        help="random permutations to run (seeds 1..N); their mean is reported")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        help="experiment override, e.g. fabric.mtu=9000 (repeatable)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    rows = []
    print(f"{'pattern':<12} {'rate':>5} {'flows':>5} {'deliv':>8} {'ideal':>8} {'ratio':>6} "
          f"{'expect':>6} {'given':>6} {'vsw%':>5} {'idle%':>5} {'kpkt*hop/s':>10} {'avgB':>6} {'drops':>6}")
    for rate in args.rates:
        for routing in ("dmodk", "ecmp"):
            patterns = [p for p in args.patterns if (p in PINNED) == (routing == "dmodk")]
            if not patterns:
                continue
            exp = xp.parse(experiment_text(args.k, rate, routing, args.overrides),
                           source="bench")
            with Fabric(exp) as fabric:
                runs = [(p, 1) for p in patterns if p != "permutation"]
                runs += [("permutation", seed) for seed in range(1, args.seeds + 1)
                         if "permutation" in patterns]
                for index, (pattern, seed) in enumerate(runs):
                    pairs = pattern_pairs(fabric.topo, pattern, seed=seed)
                    # client ports move on: TIME_WAIT keeps earlier ones busy
                    flows = iperf.plan(pairs, client_port=iperf.CLIENT_PORT + 100 * index)
                    ideal = rate * goodput_fraction(exp.fabric.mtu) * len(pairs)
                    expect = (ecmp_expectation(fabric.topo, pairs, seed=seed)
                              if routing == "ecmp" else 1.0)
                    res = run_pattern(fabric, flows, args.duration)
                    paths = [tuple(itertools.pairwise(
                        flow_path(fabric, f.src, f.dst, "tcp", f.cport, f.port))) for f in flows]
                    given = sum(max_min_rates(paths, capacities(fabric.topo))) / (
                        rate * len(pairs))
                    row = {"pattern": pattern, "seed": seed, "routing": routing,
                           "rate_mbps": rate,
                           "flows": len(pairs), "ideal_mbps": ideal,
                           "ratio": res["delivered_mbps"] / ideal, "expected_ratio": expect,
                           "given_paths_ratio": given,
                           "hops": sum(switch_hops(fabric.topo, s, d) for s, d in pairs)
                           / len(pairs), "overrides": args.overrides, **res}
                    rows.append(row)
                    label = pattern if pattern != "permutation" else f"perm(s={seed})"
                    print(f"{label:<12} {rate:>5g} {len(pairs):>5} "
                          f"{row['delivered_mbps']:>8.1f} {ideal:>8.1f} {row['ratio']:>6.3f} "
                          f"{expect:>6.3f} {given:>6.3f} {row['vswitchd_pct']:>5.0f} {row['idle_pct']:>5.0f} "
                          f"{row['pkt_hops_per_s'] / 1e3:>10.1f} "
                          f"{row['avg_packet_bytes']:>6.0f} {row['tx_dropped']:>6}", flush=True)
    for rate in args.rates:
        perms = [r for r in rows if r["pattern"] == "permutation" and r["rate_mbps"] == rate]
        if perms:
            mean = sum(r["ratio"] for r in perms) / len(perms)
            expect = sum(r["expected_ratio"] for r in perms) / len(perms)
            given = sum(r["given_paths_ratio"] for r in perms) / len(perms)
            print(f"permutation at {rate:g} Mbit/s, mean of {len(perms)}: {mean:.3f} of ideal; "
                  f"balls-in-bins expectation {expect:.3f} ({mean / expect:.2f} of it); "
                  f"max-min on the paths the hashes chose {given:.3f} ({mean / given:.2f})")
    good = [r["pkt_hops_per_s"] for r in rows if r["ratio"] >= 0.90 * r["expected_ratio"]]
    print(f"saturation: highest packet x switch-hop rate at >= 0.90 of ideal: "
          f"{max(good, default=0) / 1e3:.1f} k/s; highest seen: "
          f"{max(r['pkt_hops_per_s'] for r in rows) / 1e3:.1f} k/s")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
