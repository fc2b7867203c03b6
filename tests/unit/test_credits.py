"""Credit-based flow control's pure logic (testbed/plan/credits.py): which ingress the bytes in
a FIFO queue came from, each link's credit, stalls, and a credit cycle as a deadlock."""

from __future__ import annotations

import pytest

from testbed.plan.credits import CreditState, FifoShare
from testbed.plan.pause import Feeder

FRAME = 1000


def test_a_fifo_queue_holds_the_latest_bytes_of_each_ingress():
    q = FifoShare()
    q.record({"a": 3000, "b": 0})
    q.record({"a": 3000, "b": 2000})  # 5000 enqueued: a's 3000 first, then b's 2000
    assert q.held(2000) == {"b": 2000}  # a's have left
    assert q.held(3500) == {"a": 1500, "b": 2000}
    q.record({"a": 4000, "b": 2000})
    assert q.held(1000) == {"a": 1000}
    assert q.held(0) == {}


def test_interpolation_between_samples_splits_the_departed_bytes_by_share():
    q = FifoShare()
    q.record({"a": 0, "b": 0})
    q.record({"a": 2000, "b": 2000})  # interleaved between the samples
    assert q.held(2000) == {"a": 1000, "b": 1000}


def _state(credit=4 * FRAME, run=3 * FRAME):
    # switch s1: port p1 fed by ingress i1 (from u1) and i2 (from u2)
    feeders = {"p1": (Feeder("i1", "u1", "h1"), Feeder("i2", "u2", None))}
    return CreditState(feeders, (3,), credit, FRAME, run)


def test_a_link_gets_what_its_buffer_has_left_and_stalls_below_a_frame():
    st = _state()
    grants = st.step(0.0, {("p1", "i1", 3): 0, ("p1", "i2", 3): 0}, {("p1", 3): 0})
    assert grants == []  # plenty of credit: both run (as they already do)
    grants = st.step(0.1, {("p1", "i1", 3): 2000, ("p1", "i2", 3): 0}, {("p1", 3): 2000})
    assert [(g.port, g.credit, g.host) for g in grants] == [("u1", 2000, "h1")]
    grants = st.step(0.2, {("p1", "i1", 3): 3500, ("p1", "i2", 3): 0}, {("p1", 3): 3500})
    assert [(g.port, g.credit) for g in grants] == [("u1", 0)] and grants[0].stalls
    grants = st.step(0.5, {("p1", "i1", 3): 3500, ("p1", "i2", 3): 0}, {("p1", 3): 0})
    assert [(g.port, g.credit) for g in grants] == [("u1", None)]  # drained: runs again
    c = st.counters(0.6)[("u1", 3)]
    assert c["stall_events"] == 1 and c["stalled_s"] == pytest.approx(0.3)
    assert not c["stalled"] and st.deadlocks() == []


def test_a_bucket_spent_is_topped_up_though_the_credit_is_the_same():
    """The link sent two frames and two frames left downstream: its credit is what it was,
    but its bucket is empty; it gets the credit again."""
    st = _state(credit=4 * FRAME, run=100 * FRAME)
    grants = st.step(0.0, {("p1", "i1", 3): 2000, ("p1", "i2", 3): 0}, {("p1", 3): 2000})
    assert [(g.port, g.credit) for g in grants] == [("u1", 2000), ("u2", 4000)]
    st.step(0.1, {("p1", "i1", 3): 2000, ("p1", "i2", 3): 0}, {("p1", 3): 2000})  # nothing new
    grants = st.step(0.2, {("p1", "i1", 3): 4000, ("p1", "i2", 3): 0}, {("p1", 3): 2000})
    assert [(g.port, g.credit) for g in grants] == [("u1", 2000)]


def test_a_cycle_of_stalled_links_each_waiting_on_the_next_is_a_deadlock():
    # a ring of three switches: sX's port pX sends to s(X+1)'s ingress i(X+1), whose bytes
    # wait in s(X+1)'s port p(X+1)
    feeders = {"p1": (Feeder("i1", "p3", None),), "p2": (Feeder("i2", "p1", None),),
               "p3": (Feeder("i3", "p2", None),)}
    st = CreditState(feeders, (3,), 4 * FRAME, FRAME, 3 * FRAME)
    full = {(f"p{x}", f"i{x}", 3): 4000 for x in (1, 2, 3)}
    backlog = {(f"p{x}", 3): 4000 for x in (1, 2, 3)}
    grants = st.step(0.0, full, backlog)
    assert sorted(g.port for g in grants if g.stalls) == ["p1", "p2", "p3"]
    (cycle,) = st.deadlocks()
    assert cycle["priority"] == 3 and sorted(cycle["ports"]) == ["p1", "p2", "p3"]
    released = st.close(1.0)
    assert sorted(g.port for g in released) == ["p1", "p2", "p3"]
    assert all(g.credit is None for g in released)


def _fabric(classes: dict, pfc: dict | None = None):
    from fabriclab.model import experiment as config

    raw = {"version": 1, "fabric": {"topology": "leaf_spine", "leaves": 2, "spines": 1,
                                    "hosts_per_leaf": 4, "mtu": 9000,
                                    "queue": {"size_kb": 256},
                                    "traffic_classes": {"dscp_to_priority": {26: 3},
                                                        **classes}}}
    if pfc is not None:
        raw["fabric"]["pfc"] = pfc
    return config.parse(raw)


def test_cbfc_is_a_lossless_mode_with_a_credit_per_link_of_two_frames_at_least():
    from testbed.model.spec import TestbedSpec

    exp = _fabric({"lossless": {"mode": "cbfc"}}, {"priorities": [3]})
    th = TestbedSpec(fabric=exp.fabric, controller=exp.controller,
                     emulator=exp.emulator).pfc
    assert th.mode == "cbfc" and th.priorities == (3,)
    assert th.credit_bytes >= 2 * 9042
    exp = _fabric({"lossless": {"mode": "cbfc", "credit_kb": 40}}, {"priorities": [3]})
    assert TestbedSpec(fabric=exp.fabric, controller=exp.controller,
                       emulator=exp.emulator).pfc.credit_bytes == 40 * 1024


@pytest.mark.parametrize("classes,pfc,path", [
    ({"lossless": {"mode": "cbfc"}}, None, "fabric.traffic_classes.lossless"),
    ({"lossless": {"mode": "xon"}}, {"priorities": [3]}, "fabric.traffic_classes.lossless.mode"),
    ({"lossless": {"mode": "cbfc", "credit_kb": 4}}, {"priorities": [3]},
     "fabric.traffic_classes.lossless.credit_kb"),
])
def test_bad_lossless_settings_name_the_field(classes, pfc, path):
    from testbed.errors import ConfigError
    from testbed.model.spec import TestbedSpec

    with pytest.raises(ConfigError) as err:
        exp = _fabric(classes, pfc)
        TestbedSpec(fabric=exp.fabric, controller=exp.controller, emulator=exp.emulator).pfc
    assert err.value.path == path, err.value


def test_the_summary_counts_credit_stalls_apart_from_pfc_pauses():
    from testbed.model.congestion import summarize_congestion

    before = {"leaf2-eth3": {"priorities": {3: {"pfc": {"stall_events": 1, "stalled_s": 0.5,
                                                        "stalled": False}}}}}
    after = {"leaf2-eth3": {"priorities": {3: {"pfc": {"stall_events": 4, "stalled_s": 1.25,
                                                       "stalled": False}}}}}
    c = summarize_congestion(before, after, {}, (3,))
    assert c["credit_stall_events"] == 3 and c["credit_stalled_s"] == 0.75
    assert c["pfc_pause_events"] == 0
    assert c["ports"]["leaf2-eth3"]["priorities"]["3"]["cbfc"] == {"stall_events": 3,
                                                                   "stalled_s": 0.75}
