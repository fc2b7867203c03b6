"""The time a failed or degraded link's traffic took to move off
(:mod:`testbed.plan.failplan`): over short windows, on average, with samples held back."""

from __future__ import annotations

import pytest


def test_the_time_to_move_off_is_when_the_offered_rate_last_exceeded_the_link():
    from testbed.plan.failplan import time_to_move_off
    rate = 1e6  # bytes/s: 5,000 bytes per 5 ms window
    # offered at 2x the rate for 30 ms after the event at 1.0 s, then at half of it
    samples, total = [], 0
    for i in range(200):
        t = 0.95 + i * 0.001
        samples.append((round(t, 4), total))
        total += int((2 if t < 1.03 else 0.5) * rate * 0.001)
    took = time_to_move_off(samples, 1.0, rate, 1500)
    assert took == pytest.approx(0.03, abs=0.003)
    assert time_to_move_off(samples, 1.0, 10 * rate, 1500) == 0.0  # it always fit
    # still over at the end: it never moved off
    assert time_to_move_off(samples[:70], 1.0, rate, 1500) is None
    # a failed link: anything beyond a frame per window is still offered to it, here until
    # 10 ms after the event: the last window that took more than a frame ends within a
    # window (5 ms) of that
    dead = [(1.0 + i * 0.001, 3000 * min(i, 10)) for i in range(100)]
    assert 0.010 <= time_to_move_off(dead, 1.0, 0.0, 1500) <= 0.015
    assert time_to_move_off([(1.0, 0)], 1.0, rate, 1500) is None


def test_the_time_to_fit_on_average_reads_the_level_not_a_single_burst():
    """``averaged_ms``: from when every 50 ms of the port's traffic fits. Offered twice the
    rate for 30 ms, then half: the 50 ms from 10.7 ms on hold 19.3 ms at twice and 30.7 at
    half, which fits (the short windows say 30 ms). Three frames more at 40 ms, in 0.8 of the
    rate throughout: the short windows see them, the average does not."""
    from testbed.plan.failplan import time_to_fit_on_average, time_to_move_off
    rate, frame = 1e6, 1500

    def series(level, extra=lambda t: 0):
        samples, total = [], 0.0
        for i in range(400):
            t = round(0.95 + i * 0.001, 4)
            samples.append((t, int(total) + extra(t)))
            total += level(t) * rate * 0.001
        return samples

    moved = series(lambda t: 2 if t < 1.03 else 0.5)
    assert 0.009 <= time_to_fit_on_average(moved, 1.0, rate, frame) <= 0.013
    assert time_to_move_off(moved, 1.0, rate, frame) >= 0.03
    burst = series(lambda t: 0.8, lambda t: 3 * frame if t >= 1.04 else 0)
    assert time_to_fit_on_average(burst, 1.0, rate, frame) == 0.0
    assert time_to_move_off(burst, 1.0, rate, frame) == pytest.approx(0.04, abs=0.006)
    assert time_to_fit_on_average(series(lambda t: 2), 1.0, rate, frame) is None
    # by its share where it has alternatives: a third of the traffic into three times its
    # rate, though all of them are offered more than their rates
    over_all = series(lambda t: 1.5)
    others = [(t, 2 * b) for t, b in over_all]
    assert time_to_fit_on_average(over_all, 1.0, rate, frame, others, 2 * rate) == 0.0
    assert time_to_fit_on_average(over_all, 1.0, rate, frame, [(t, b // 2) for t, b in
                                                               over_all], 2 * rate) is None


def test_a_sampler_held_back_does_not_read_a_steady_rate_as_a_burst():
    """Offered 0.8 of the rate throughout, two 1,000-byte frames every 2.5 ms, sampled every
    millisecond but for a gap of 7 ms: a window's start within the gap takes the bytes
    between its two samples as coming evenly, so the port fits from the start (a window cut
    short at the sample after the gap and scaled up read 4 frames in 3 ms as 6.7 in 5)."""
    from testbed.plan.failplan import time_to_move_off
    rate, frame = 1e6, 1000  # 5 ms windows: over above 6,250 bytes

    def offered(t: float, until: float = 2.0, extra: float = 0.0) -> int:
        pairs = int((t - 0.9001) / 0.0025) + 1
        return 2 * frame * pairs + int(extra * frame * max(0.0, min(t, until) - 1.0) / 0.001)

    times = [round(0.99 + i * 0.001, 4) for i in range(51)]
    times += [round(1.0474 + i * 0.001, 4) for i in range(250)]  # 1.040 to 1.0474: held
    assert time_to_move_off([(t, offered(t)) for t in times], 1.0, rate, frame) == 0.0
    # a frame more every millisecond for 20 ms (1.8 of the rate): over, then fitting
    burst = [(t, offered(t, 1.02, 1.0)) for t in times]
    assert 0.02 <= time_to_move_off(burst, 1.0, rate, frame) <= 0.026
