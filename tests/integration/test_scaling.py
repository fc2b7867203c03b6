"""A time-scaled fabric keeps the real fabric's regime: one experiment in real units (400 Gbit/s,
650 ns per link, 4 KiB frames) run at N and at 2N gives the same real-unit results, and the
agents' delay line makes the round trips the links' latency says."""

from __future__ import annotations

import pytest

from fabriclab import api
from tests.integration.conftest import ROOT  # noqa: F401 - the fixtures' module

# a 4-to-1 uet incast of 256 KiB flows on a 2-leaf, 1-spine fabric of 3 hosts per leaf: about
# 2 s of emulated time at N = 100,000, where the agents' timing binds (a 4 KiB frame in 8 ms)
REAL = """version: 1
name: scaled
fabric:
  topology: leaf_spine
  leaves: 2
  spines: 1
  hosts_per_leaf: 3
  host_link: {{rate_gbps: 400, latency_ns: 650, ecn: {{mode: step, k_bdp: 0.5}}}}
  fabric_link: {{rate_gbps: 400, latency_ns: 650, ecn: {{mode: step, k_bdp: 0.5}}}}
  queue: {{size_bdp: 8}}
  mtu: 4200
emulator: {{datapath: ebpf, time_scale: {n}}}
workload:
  transport: uet
  connections: 1
  timeout_s: 300
  collectives:
    - op: flows
      label: incast
      size: 256KiB
      repetitions: 2
      pairs: [[h1_2, h1_1], [h1_3, h1_1], [h2_1, h1_1], [h2_2, h1_1]]
"""
N = 100_000
TOLERANCE = 0.10  # the bound on real-unit figures at N and 2N


def _run(tmp_path, state_dir, n: float) -> api.Results:
    path = tmp_path / f"scaled-{n:.0f}.yaml"
    path.write_text(REAL.format(n=n))
    results = api.run(path, tmp_path / f"out-{n:.0f}", state_dir=state_dir)
    assert results.complete, results.error
    return results


def _figures(results: api.Results) -> dict[str, float]:
    """The real-unit figures of the incast's repetitions: the last flow's completion (the
    incast's time), the flows' throughput of ideal, and the bottleneck's queue p99 in BDPs."""
    doc = results.document
    rows = doc.collectives
    bdp = doc.fabric.bdp_bytes
    return {"time_us": sum(r.real.time_us for r in rows) / len(rows),
            "fct_p50_us": sum(r.real.fct_s.p50 for r in rows) / len(rows) * 1e6,
            "throughput": sum(r.throughput_of_ideal for r in rows) / len(rows),
            "queue_p99_bdp": max(p.queue_p99_bytes for p in doc.congestion.ports.values())
            / bdp}


def test_one_experiment_at_n_and_2n_gives_the_same_real_units(tmp_path, state_dir):
    low, high = _run(tmp_path, state_dir, N), _run(tmp_path, state_dir, 2 * N)
    for res, n in ((low, N), (high, 2 * N)):
        doc = res.document
        assert doc.time_scale.n == n
        assert doc.fabric.host_rate_mbps == pytest.approx(400_000 / n)
        # the regime as run: the senders' least round trip is their path's (the delay line
        # adds the links' latency), and the agents kept to their schedule
        kept = doc.fidelity.extra["time_scale"]
        assert 0.9 <= kept["packets_per_bdp"]["ratio"] <= 1.1, kept
        assert doc.fidelity.verdict == "ok", doc.fidelity.reasons
    a, b = _figures(low), _figures(high)
    print("at N", a, "at 2N", b)
    for name in ("time_us", "throughput"):
        assert b[name] == pytest.approx(a[name], rel=TOLERANCE), (name, a, b)
    # the queue's p99 is one sample in a hundred: within a tenth of a BDP or the tolerance
    assert abs(b["queue_p99_bdp"] - a["queue_p99_bdp"]) <= max(
        0.1, TOLERANCE * a["queue_p99_bdp"]), (a, b)
