"""Pure measurement definitions, as NCCL-tests defines them (its doc/PERFORMANCE.md).

* ``algbw = size / time``: the application's view (size as in :mod:`traffic.workloads.schedules`).
* ``busbw = algbw * factor``: the bandwidth each rank's busiest link must carry, comparable with
  the link rate whatever the rank count: all-reduce ``2(n-1)/n``; all-gather, reduce-scatter and
  all-to-all ``(n-1)/n``; broadcast and send/recv ``1``.
* efficiency: busbw over the line rate of the ranks' links.
"""

from __future__ import annotations

import math

BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "all_to_allv": lambda n: 1.0,  # size is the most loaded rank's network bytes
    "broadcast": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
    "flows": lambda n: 1.0,  # size is per flow: busbw is the slowest flow's rate
}


def bus_factor(op: str, ranks: int) -> float:
    """NCCL-tests' busbw / algbw ratio for ``op`` over ``ranks`` ranks."""
    return BUS_FACTOR[op](ranks)


def algbw_GBps(size_bytes: int, duration_s: float) -> float:  # noqa: N802 - GB/s, not Gb/s
    """Algorithm bandwidth in GB/s (10^9 bytes per second), as NCCL-tests prints it."""
    return size_bytes / duration_s / 1e9


def busbw_GBps(op: str, ranks: int, size_bytes: int, duration_s: float) -> float:  # noqa: N802
    """Bus bandwidth in GB/s (10^9 bytes per second), as NCCL-tests prints it."""
    return algbw_GBps(size_bytes, duration_s) * bus_factor(op, ranks)


def ideal_time_s(op: str, ranks: int, size_bytes: int, rate_mbps: float,
                 goodput_fraction: float = 1.0) -> float:
    """The time at which busbw equals the line rate (times the payload share of the wire)."""
    return size_bytes * 8 * bus_factor(op, ranks) / (rate_mbps * 1e6 * goodput_fraction)


def throughput_of_ideal(flows: list[tuple[int, float]], rate_mbps: float,
                        goodput_fraction: float = 1.0) -> float:
    """Hedera's measure for a pattern of flows: their aggregate throughput as a fraction of
    ideal, the mean over flows of the time each would take alone at line rate over its
    completion time (``flows``: (bytes, completion seconds from the start)). Unlike busbw,
    which the last flow decides, a straggler counts for its own share only."""
    if not flows:
        raise ValueError("throughput of no flows")
    return sum(nbytes * 8 / (rate_mbps * 1e6 * goodput_fraction) / max(fct, 1e-9)
               for nbytes, fct in flows) / len(flows)


def efficiency(op: str, ranks: int, size_bytes: int, duration_s: float,
               rate_mbps: float) -> float:
    """busbw over the line rate."""
    return busbw_GBps(op, ranks, size_bytes, duration_s) * 8e3 / rate_mbps


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100), nearest-rank, of a non-empty list."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]
