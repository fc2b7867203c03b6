"""What the hosts' delay relay (``emulator.delay_line: hosts``) kept of a time-scaled fabric's
regime: a round trip probed before the workload over the fabric's longest path
(:mod:`testbed.linux.rttprobe`), less the links' latency the relay holds packets for, is what
the emulation adds; the relay's lateness against its schedule over the run. Both go to
:func:`fabriclab.model.timescale.judge` beside the agents' own figures.
"""

from __future__ import annotations

import json
import sys

from testbed.contract import RunningFabric

PROBES = 5
PROBE_TIMEOUT_S = 120.0


def farthest_pair(fabric: RunningFabric) -> tuple[str, str, float]:
    """The first host and the host farthest from it (by the links' one-way delay), with that
    delay."""
    hosts = [h.name for h in fabric.topo.hosts]
    delays, _ = fabric.spec.path_timing_s(hosts[:1] + hosts)
    row = delays[0][1:]
    far = max(range(len(hosts)), key=lambda i: row[i])
    return hosts[0], hosts[far], row[far]


def probe(fabric: RunningFabric) -> dict:
    """Round trips from the first host to the farthest, less twice its one-way delay:
    ``probe_excess_min_us`` and ``_max_us`` (what the emulation adds), ``rtt_min_us``.
    Empty when the probe got no answer (its error under ``error``)."""
    src, dst, one_way_s = farthest_pair(fabric)
    address = fabric.topo.nodes[dst].ip
    argv = [sys.executable, "-m", "testbed.linux.rttprobe", address, str(PROBES)]
    code, out, err = fabric.run_parallel({src: argv}, PROBE_TIMEOUT_S)[src]
    try:
        rtts = json.loads(out)["rtts_s"] if out.strip() else []
    except (ValueError, KeyError):
        rtts = []
    if not rtts:
        return {"error": f"{src} -> {dst}: {(err or out).strip()[-300:] or f'exit {code}'}"}
    excess = [max(0.0, r - 2 * one_way_s) for r in rtts]
    return {"path": f"{src} -> {dst}", "rtt_min_us": round(min(rtts) * 1e6, 1),
            "probe_excess_min_us": round(min(excess) * 1e6, 1),
            "probe_excess_max_us": round(max(excess) * 1e6, 1)}
