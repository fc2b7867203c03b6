"""The failure service (testbed.fabric.failures.FailureInjector) against a fake fabric: a
degrade is applied as a rate change, and the bytes offered to the link's switch ports are
watched every millisecond until they fit the new rate."""

from __future__ import annotations

import threading
import time

import pytest

from fabriclab.model import experiment as xp
from testbed.model.congestion import frame_bytes
from testbed.fabric.failures import FailureInjector
from testbed.plan.failplan import plan_failures
from tests.unit.fakefabric import FakeFabric


class OfferingFabric(FakeFabric):
    """Its link's ports are offered 8 MB/s until ``calm_after_s`` after the degrade, then
    nothing."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.rated_at: float | None = None
        self.failed_at: float | None = None
        self.calm_after_s = 0.05

    def set_rates(self, pairs, factor: float, netlink=None) -> dict[str, float]:
        self.rated_at = time.monotonic()
        return super().set_rates(pairs, factor, netlink)

    def offered_bytes(self, names: set[str]) -> dict[str, int]:
        since = time.monotonic() - (self.rated_at or time.monotonic())
        offered = int(min(since, self.calm_after_s) * 8_000_000)
        return {name: offered for name in names}

    def largest_packets(self, names: set[str]) -> dict[str, int]:
        """agg1_1's ports have seen 12 kB packets (larger than a frame), core1's frames."""
        return {name: 12_000 for name in names if name.startswith("agg")}

    def switch_notices(self) -> list[tuple[float, str, int, tuple[int, ...]]]:
        """After a failure, agg2_1 took port 3 out of its group 7 at once; one from long
        before the event does not count."""
        if self.failed_at is None:
            return []
        ago = time.monotonic() - self.failed_at
        return [(ago + 30.0, "agg3_1", 2, (1,)), (ago - 0.004, "agg2_1", 7, (3,))]

    def set_links(self, pairs, up: bool, netlink=None) -> dict[str, float]:
        self.failed_at = None if up else time.monotonic()
        return super().set_links(pairs, up, netlink)

    def link_counters(self, names, netlink=None) -> dict:
        return {}


EIGHT_MBPS = {"version": 1, "fabric": {"topology": "fat_tree", "k": 4,
                                        "fabric_link": {"rate_mbps": 8}},
              "workload": {"collectives": [{"op": "all_reduce", "size": 64, "ranks": 2}]}}


def _inject(tmp_path, event: dict):
    """One event on agg1_1-core1 of an 8 Mbit/s k=4 fat-tree whose ports are offered 8 MB/s
    for 50 ms after a degrade (nothing after a failure), watched for 0.5 s: (the fake
    fabric, the experiment, the event as reported, the injector)."""
    exp = xp.parse(EIGHT_MBPS)
    fabric = OfferingFabric(exp, tmp_path)
    injector = FailureInjector(fabric, plan_failures(
        exp.topology, [{"at_s": 0.0, "link": ["agg1_1", "core1"], **event}]))
    stop = threading.Event()
    thread = threading.Thread(target=injector, args=(stop,))
    thread.start()
    try:
        injector.begin()
        time.sleep(0.5)
        injector.finish()
    finally:
        stop.set()
        thread.join(timeout=5)
    (applied,) = injector.report()
    return fabric, exp, applied, injector


def test_a_failed_links_window_is_sized_by_its_rate_as_built(tmp_path):
    _fabric, exp, event, _ = _inject(tmp_path, {"action": "down"})
    move = event["move_off"]
    assert set(move["rates_mbps"].values()) == {0.0}
    # four packets at 8 Mbit/s, the rate it was built with: 48 and 36 ms
    window = {p: 4 * b / 1e6 * 1000 for p, b in move["packet_bytes"].items()}
    assert move["packet_bytes"]["agg1_1-eth3"] == 12_000
    assert move["window_ms"] == {p: pytest.approx(w, abs=0.1) for p, w in window.items()}
    assert set(move["ms"].values()) == {0.0}  # nothing offered after it
    # what the switches' fault notices did after it, as the agent logged them
    (notice,) = event["notices"]
    assert (notice["switch"], notice["group"], notice["ports_out"]) == ("agg2_1", 7, [3])
    assert 0 <= notice["ms"] <= 50, notice


def test_a_degrade_is_applied_and_its_ports_watched_until_the_traffic_fits(tmp_path):
    fabric, exp, event, injector = _inject(tmp_path, {"action": "degrade",
                                                      "rate_factor": 0.5})
    events = injector.events
    assert fabric.log == ["set_rates [('agg1_1', 'core1')] x0.5"]
    assert event["action"] == "degrade" and event["rate_factor"] == 0.5
    move = event["move_off"]
    # both switch ends of agg1_1-core1, at half of 8 Mbit/s now
    assert sorted(move["rates_mbps"].values()) == [4.0, 4.0]
    assert move["samples"] > 50  # every millisecond or so, on a busy machine fewer
    # windows of four packets at 0.5 MB/s (the resolution): frames at core1's end, at
    # agg1_1's the largest the datapath saw there or at its alternative (agg1_1-core2)
    packets = {"agg1_1-eth3": 12_000, "core1-eth1": frame_bytes(exp.fabric.mtu)}
    assert move["packet_bytes"] == packets
    window = {p: 4 * b / 0.5e6 * 1000 for p, b in packets.items()}  # 96 and 72 ms
    assert move["window_ms"] == {p: pytest.approx(w, abs=0.1) for p, w in window.items()}
    for port, took in move["ms"].items():  # 8 MB/s offered for 50 ms against 0.5 MB/s
        assert 40 <= took <= 50 + window[port] + 20, move
    assert "real_ms" not in move  # not time-scaled
    scaled = FailureInjector(fabric, events, time_scale=10)
    scaled.applied, scaled._fine = injector.applied, injector._fine
    scaled._rates, scaled._groups = injector._rates, injector._groups
    scaled._windows, scaled._packets = injector._windows, injector._packets
    (again,) = scaled.report()
    assert again["move_off"]["real_ms"] == pytest.approx(
        {p: v / 10 for p, v in move["ms"].items()})
    assert set(again["move_off"]["real_rates_mbps"].values()) == {40.0}


def test_a_slow_ports_rate_is_measured_over_windows_of_four_packets():
    """A time-scaled fabric's port at 3.3 Mbit/s sends a 9,014-byte frame in 21.7 ms: a 5 ms
    window holds one frame or none, which fits the one packet a window may take beyond the
    rate: it reads a port offered twice its rate as fitting. Windows of four frames read
    the rate."""
    from testbed.plan.failplan import MOVE_WINDOW_S, move_window_s, time_to_move_off
    rate, frame = 3.33e6 / 8, 9014

    def offered(factor_then_after):  # cumulative bytes every ms, whole frames as they come
        samples, total, due = [], 0, 0.0
        for i in range(1500):
            t = round(0.99 + i * 0.001, 4)
            due += factor_then_after(t) * rate * 0.001
            while due >= frame:
                total, due = total + frame, due - frame
            samples.append((t, total))
        return samples

    under = offered(lambda t: 0.9)
    over = offered(lambda t: 2 if t < 1.3 else 0.9)  # twice its rate for 300 ms, then 0.9
    assert time_to_move_off(over, 1.0, rate, frame) == 0.0  # 5 ms: blind to it
    window = move_window_s(rate, frame)
    assert window == pytest.approx(4 * frame / rate)  # 87 ms
    assert move_window_s(100e6 / 8, frame) == MOVE_WINDOW_S  # 4 frames: 2.9 ms at 100 Mbit/s
    # kernel TCP's 64 KiB offload units pass the switches whole: 42 ms at 50 Mbit/s
    assert move_window_s(50e6 / 8, 65536) == pytest.approx(0.0419, abs=1e-4)
    assert move_window_s(0.0, frame) == MOVE_WINDOW_S  # a failed link
    assert time_to_move_off(under, 1.0, rate, frame, window) == 0.0
    took = time_to_move_off(over, 1.0, rate, frame, window)
    assert took is not None and 0.3 <= took <= 0.3 + window + 0.002


def test_a_degraded_port_of_a_group_moves_off_when_its_share_fits_its_rate():
    from testbed.model.builders import fat_tree
    from testbed.plan.failplan import alternatives, time_to_move_off
    # a port at half rate beside one at full rate: 1/3 of the group's capacity. Offered half
    # of the group's traffic for 40 ms after the event, a third after: moved off at 40 ms,
    # though both stay busy (the absolute rate says nothing here)
    samples, others, mine, rest = [], [], 0, 0
    for i in range(300):
        t = round(1.0 + i * 0.001, 4)
        samples.append((t, mine))
        others.append((t, rest))
        mine += 1500 if t < 1.04 else 1000
        rest += 1500 if t < 1.04 else 2000
    took = time_to_move_off(samples, 1.0, 0.5e6, 1500, siblings=others,
                            sibling_rate_bytes_s=1e6)
    assert took == pytest.approx(0.04, abs=0.003)
    # its siblings: an aggregation switch's other uplinks going up; going down, the other
    # cores' links into the same aggregation switch (the switches above choose among them)
    topo = fat_tree(4)
    ends = lambda link, sw: [(e.node, topo.link_at(e.node, e.port).other(e.node).node)  # noqa
                             for e in alternatives(topo, link, sw)]
    up = topo.find_link("agg1_1", "core1")
    assert ends(up, "agg1_1") == [("agg1_1", "core2")]
    assert ends(up, "core1") == [("core2", "agg1_1")]
    edge = topo.find_link("edge1_1", "agg1_1")
    assert ends(edge, "edge1_1") == [("edge1_1", "agg1_2")]
    assert ends(edge, "agg1_1") == [("agg1_2", "edge1_1")]
    assert alternatives(topo, topo.find_link("h1_1_1", "edge1_1"), "edge1_1") == []
