#!/usr/bin/env python3
"""Benchmark (not a test): what the UDP transports' agents cost per packet, and where they bind.

A leaf-spine of two leaves (two hosts each) on the eBPF datapath, so that the switches cost
little; one collective per transport and rate (a 4-rank all-reduce: every host sends and
receives at once), ``--size`` bytes. Per row: the achieved efficiency against the ideal, the
agents' CPU seconds over the job (every rank's process, its start-up included) and the CPU per
DATA packet (sending, receiving and acknowledging it, retransmissions counted) at the margin:
the job runs again at twice the size, and the extra CPU over the extra packets is the cost of a
packet, without the processes' start-up (Python's imports, the barrier), which a longer job
amortises (the cores taken likewise, at the margin); of it, the share in user space (the engine's own work: the rest is the kernel's,
its system calls and the emulated fabric's forwarding of each packet, which runs in the
sender's); how late the agents sent paced packets and released held ones against their
schedule (p99, an upper bound: the histogram's bucket); and the machine's idle share. Where the agents' CPU per second of the job nears a
core per agent, they, not the fabric, set the pace.

Each transport and rate runs once per engine (``--engines``): the compiled one (traffic/native)
and the Python one, side by side.

Usage: bench/agents.py [--rates 20 50 100 200] [--transports uet rocev2] [--size 8MiB]
                       [--engines native python] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from fabriclab.model import experiment as xp  # noqa: E402
from testbed.fabric.fabric import Fabric  # noqa: E402
from testbed.linux import cpu  # noqa: E402
from testbed.plan.delayline import quantile_us  # noqa: E402
from traffic.agents.runner import run_job  # noqa: E402
from traffic.workloads.entries import parse_size  # noqa: E402


def experiment(rate: float, size: str) -> xp.Experiment:
    return xp.parse(yaml.safe_load(
        "version: 1\nname: agents\nfabric:\n  topology: leaf_spine\n  leaves: 2\n  spines: 2\n"
        f"  hosts_per_leaf: 2\n  host_link: {{rate_mbps: {rate}}}\n"
        f"  fabric_link: {{rate_mbps: {rate}}}\n  mtu: 9000\n"
        "emulator: {datapath: ebpf, queue_sample_ms: 0}\n"
        f"workload:\n  collectives:\n    - {{op: all_reduce, size: {size}, ranks: 4}}\n"))


def run_once(transport: str, rate: float, size: str, engine: str) -> dict:
    exp = experiment(rate, size)
    (job,) = exp.workload.jobs
    with Fabric(exp) as fabric:
        before = cpu.sample([])
        (result,) = run_job(fabric, list(job.collectives), timeout_s=600, transport=transport,
                            options={"engine": engine})
        after = cpu.sample([])
    return {"result": result, "packets": (result.transport or {}).get("tx_packets", 0),
            "idle_pct": cpu.usage(before, after).idle_pct}


def measure(transport: str, rate: float, size: str, engine: str) -> dict:
    """One row: the job at ``size`` and again at twice it (the CPU per packet at the margin)."""
    one = run_once(transport, rate, size, engine)
    two = run_once(transport, rate, 2 * parse_size(size, "--size"), engine)
    result, packets, seconds = one["result"], one["packets"], one["result"].time_us / 1e6
    lateness = (result.transport or {}).get("lateness_us") or {}
    extra = two["packets"] - packets
    margin = (two["result"].agent_cpu_s - result.agent_cpu_s) / extra if extra > 0 else None
    user = ((two["result"].agent_user_cpu_s - result.agent_user_cpu_s) / extra if extra > 0
            else None)
    return {"transport": transport, "engine": (result.transport or {}).get("engine"),
            "rate_mbps": rate, "efficiency": round(result.efficiency, 3),
            "seconds": round(seconds, 2), "agent_cpu_s": round(result.agent_cpu_s, 2),
            "packets": packets,
            "us_per_packet_with_startup": (round(result.agent_cpu_s * 1e6 / packets, 1)
                                           if packets else None),
            "us_per_packet": round(margin * 1e6, 1) if margin is not None else None,
            "user_us_per_packet": round(user * 1e6, 1) if user is not None else None,
            "agent_cores": (round((two["result"].agent_cpu_s - result.agent_cpu_s)
                                  / (two["result"].time_us / 1e6 - seconds), 2)
                            if two["result"].time_us / 1e6 > seconds else None),
            "late_tx_p99_us": quantile_us(lateness.get("tx", {}), 0.99),
            "late_rx_p99_us": quantile_us(lateness.get("rx", {}), 0.99),
            "idle_pct": round(one["idle_pct"], 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[20, 50, 100, 200])
    parser.add_argument("--transports", nargs="+", default=["uet", "rocev2"])
    parser.add_argument("--size", default="8MiB")
    parser.add_argument("--engines", nargs="+", default=["native", "python"],
                        choices=["native", "python"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    for t in args.transports:
        for r in args.rates:
            for e in args.engines:
                rows.append(measure(t, r, args.size, e))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(f"{'transport':9} {'engine':7} {'Mbit/s':>7} {'eff':>6} {'s':>6} {'agent cpu s':>11} "
          f"{'packets':>8} {'us/pkt':>7} {'user':>6} {'(+start)':>8} {'cores':>6} "
          f"{'late99':>7} {'idle%':>6}")
    for r in rows:
        print(f"{r['transport']:9} {r['engine'] or '?':7} {r['rate_mbps']:>7g} "
              f"{r['efficiency']:>6} {r['seconds']:>6} "
              f"{r['agent_cpu_s']:>11} {r['packets']:>8} {r['us_per_packet'] or 0:>7} "
              f"{r['user_us_per_packet'] or 0:>6} "
              f"{r['us_per_packet_with_startup'] or 0:>8} "
              f"{r['agent_cores'] or 0:>6} {r['late_tx_p99_us'] or 0:>7g} {r['idle_pct']:>6}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
