"""PFC's pure parts: the pause state machine, the thresholds and headroom check, the per-priority
tc plan, the actuator's netlink request, and which ports feed a queue."""

from __future__ import annotations

import struct

import pytest

from fabriclab.model import experiment as xp
from testbed.model.congestion import (
    PfcSpec,
    PfcThresholds,
    frame_bytes,
    pfc_headroom_bytes,
    resolve_pfc,
    summarize_congestion,
)
from testbed.errors import ConfigError
from testbed.linux.rawnl import RawTc
from testbed.plan.pause import Feeder, PauseState
from testbed.plan.tcplan import TBF_MAX_BUFFER_S, class_id, leaf_handle, plan_shaping, priority_of_leaf
from testbed.model.topology import feeds
from testbed.model.builders import leaf_spine

KB = 1024


def _th(**kw) -> PfcThresholds:
    base = dict(priorities=(3,), xoff_bytes=100 * KB, xon_bytes=80 * KB, headroom_bytes=50 * KB,
                needed_bytes=50 * KB, worst_port="s-eth1", reaction_s=0.004, watchdog_s=0.5,
                poll_s=0.002)
    return PfcThresholds(**{**base, **kw})


def _state(**kw) -> PauseState:
    # switch s: egress s-eth1 fed by ingress s-eth2 (from switch port u-eth1) and s-eth3 (host h)
    feeders = {"s-eth1": (Feeder("s-eth2", "u-eth1", None), Feeder("s-eth3", "h-eth0", "h"))}
    return PauseState(_th(**kw), feeders)


def test_xoff_pauses_the_feeders_that_sent_and_xon_resumes_them():
    st = _state()
    assert st.step(0.0, {("s-eth1", 3): 50 * KB}, {("s-eth2", 3)}) == []
    acts = st.step(0.01, {("s-eth1", 3): 101 * KB}, {("s-eth2", 3)})
    assert [(a.port, a.priority, a.pause, a.host) for a in acts] == [("u-eth1", 3, True, None)]
    # still over XON, nothing arrives any more (the feeder is paused): it stays paused
    assert st.step(0.02, {("s-eth1", 3): 90 * KB}, set()) == []
    assert st.paused(("u-eth1", 3)) and not st.paused(("h-eth0", 3))
    acts = st.step(0.05, {("s-eth1", 3): 80 * KB}, set())
    assert [(a.port, a.pause) for a in acts] == [("u-eth1", False)]
    counts = st.counters(0.06)[("u-eth1", 3)]
    assert counts["pause_events"] == 1 and counts["paused_s"] == pytest.approx(0.04)
    assert not counts["paused"]
    sent = st.counters(0.06)[("s-eth1", 3)]  # the other direction: the queue that paused it
    assert (sent["xoff_events"], sent["pause_events"]) == (1, 0)


def test_a_host_feeder_is_paused_in_its_namespace():
    st = _state()
    (act,) = st.step(0.0, {("s-eth1", 3): 200 * KB}, {("s-eth3", 3)})
    assert (act.port, act.host, act.pause) == ("h-eth0", "h", True)


def test_the_storm_watchdog_breaks_a_long_pause_and_ignores_it_for_as_long():
    st = _state(watchdog_s=0.1)
    full = {("s-eth1", 3): 200 * KB}
    st.step(0.0, full, {("s-eth2", 3)})
    assert st.step(0.05, full, set()) == []
    (act,) = st.step(0.11, full, set())  # held 110 ms > 100 ms
    assert not act.pause and st.counters(0.11)[("u-eth1", 3)]["watchdog_events"] == 1
    assert st.step(0.15, full, {("s-eth2", 3)}) == []  # quarantined until 0.21
    (again,) = st.step(0.22, full, {("s-eth2", 3)})
    assert again.pause and st.counters(0.22)[("u-eth1", 3)]["pause_events"] == 2


def test_close_releases_every_pause_and_counts_the_time():
    st = _state()
    st.step(0.0, {("s-eth1", 3): 200 * KB}, {("s-eth2", 3), ("s-eth3", 3)})
    acts = st.close(1.0)
    assert sorted(a.port for a in acts) == ["h-eth0", "u-eth1"] and not any(a.pause for a in acts)
    assert st.counters(2.0)[("u-eth1", 3)]["paused_s"] == pytest.approx(1.0)


def test_a_ring_of_ports_each_paused_by_the_next_is_a_deadlock():
    # three switches in a ring: a-cw feeds b, whose b-cw feeds c, whose c-cw feeds a
    feeders = {"b-cw": (Feeder("b-ccw", "a-cw", None),), "c-cw": (Feeder("c-ccw", "b-cw", None),),
               "a-cw": (Feeder("a-ccw", "c-cw", None),)}
    st = PauseState(_th(), feeders)
    full = {(p, 3): 200 * KB for p in ("a-cw", "b-cw", "c-cw")}
    st.step(1.0, full, {("a-ccw", 3), ("b-ccw", 3), ("c-ccw", 3)})
    (cycle,) = st.deadlocks()
    # a-cw is paused by b-cw (it feeds that queue), b-cw by c-cw, c-cw by a-cw
    assert cycle == {"priority": 3, "ports": ["a-cw", "b-cw", "c-cw"], "first_seen": 1.0}
    # one queue drains: the cycle is broken, the one seen stays reported
    st.step(1.1, {**full, ("b-cw", 3): 0}, set())
    assert len(st.deadlocks()) == 1 and not st.paused(("a-cw", 3))


def test_headroom_sums_the_feeding_links_and_refuses_less_naming_the_number():
    fan_in = {"leaf1-eth1": [(10, 0), (10, 0), (20, 0)], "spine1-eth1": [(20, 0)]}
    th = resolve_pfc(PfcSpec(priorities=(3,), poll_ms=2), fan_in, 128 * KB, 9000)
    reaction = th.reaction_s
    need = 2 * pfc_headroom_bytes(10, 0, reaction, 9000) + pfc_headroom_bytes(20, 0, reaction,
                                                                                9000)
    assert (th.needed_bytes, th.headroom_bytes, th.worst_port) == (need, need, "leaf1-eth1")
    assert th.xoff_bytes == 128 * KB and th.xon_bytes == 128 * KB - 2 * frame_bytes(9000)
    assert th.limit_bytes == 128 * KB + need
    with pytest.raises(ConfigError) as err:
        resolve_pfc(PfcSpec(priorities=(3,), headroom_kb=20), fan_in, 128 * KB, 9000)
    assert err.value.path == "fabric.pfc.headroom_kb"
    assert f"needs at least {-(-need // KB)} KiB" in err.value.message
    assert "leaf1-eth1" in err.value.message
    with pytest.raises(ConfigError) as err:
        resolve_pfc(PfcSpec(priorities=(3,), xoff_kb=50, xon_kb=60), fan_in, 128 * KB, 9000)
    assert err.value.path == "fabric.pfc.xon_kb"
    assert resolve_pfc(PfcSpec(), fan_in, 128 * KB, 9000) is None


PFC_LS = {"topology": "leaf_spine", "leaves": 3, "spines": 1, "hosts_per_leaf": 3,
          "host_link": {"rate_mbps": 10}, "fabric_link": {"rate_mbps": 20},
          "queue": {"size_kb": 128}, "traffic_classes": {"dscp_to_priority": {"26": 3}}}


@pytest.mark.parametrize("pfc, path, text", [
    ({"priorities": [3], "headroom_kb": 10}, "fabric.pfc.headroom_kb", "needs at least"),
    ({"priorities": [9]}, "fabric.pfc.priorities[0]", "<= 7"),
    ({"priorities": [3], "xof_kb": 9}, "fabric.pfc.xof_kb", "unknown key"),
    ({"xoff_kb": 9}, "fabric.pfc.priorities", "required"),
])
def test_bad_pfc_settings_name_the_field(pfc, path, text):
    with pytest.raises(ConfigError) as err:
        xp.parse({"version": 1, "fabric": {**PFC_LS, "pfc": pfc}})
    assert err.value.path == path and text in err.value.message, err.value


def test_pfc_refuses_a_netem_link_and_a_packet_sized_queue():
    with pytest.raises(ConfigError) as err:
        xp.parse({"version": 1, "fabric": {**PFC_LS, "pfc": {"priorities": [3]},
                                           "queue": {"size_packets": 100}}})
    assert err.value.path == "fabric.pfc" and "size_kb" in err.value.message


def test_the_plan_gives_each_priority_a_class_and_a_lossless_one_a_tbf():
    plan = plan_shaping(10, 9000, 128, priorities=(0, 3), lossless={3: 300 * KB})
    assert [(c.priority, c.lossless, c.limit_bytes) for c in plan.classes] == [
        (0, False, 128 * KB), (3, True, 300 * KB)]
    assert plan.burst_bytes == 2 * frame_bytes(9000)  # no super-packet burst on resume
    assert all(c.rate_kbit == 5000 for c in plan.classes)
    paused, running = plan.paused(plan.classes[1]), plan.running(plan.classes[1])
    assert paused.burst_bytes == frame_bytes(9000)  # nothing larger is dropped at enqueue
    assert paused.burst_bytes * 8 / (paused.rate_kbit * 1000) <= TBF_MAX_BUFFER_S
    assert running.rate_kbit == 20_000 and running.limit_bytes == 300 * KB
    assert plan_shaping(10, 9000, 128).classes == ()  # one class: the plain layout
    assert plan_shaping(10, 9000, 128, priorities=(0, 3)).burst_bytes > 64 * KB
    assert (class_id(3), leaf_handle(3), leaf_handle(0)) == (0x10013, 0x130000, 0x100000)
    assert [priority_of_leaf(h) for h in (0x130000, 0x100000, 0x10000, 0x130001)] == [
        3, 0, None, None]


def test_a_strict_priority_class_is_served_first():
    plan = plan_shaping(10, 9000, 128, priorities=(0, 6), strict=(6,))
    assert [(c.priority, c.strict, c.htb_prio) for c in plan.classes] == [
        (0, False, 1), (6, True, 0)]
    exp = xp.parse({"version": 1, "fabric": {**PFC_LS, "traffic_classes": {
        "dscp_to_priority": {"48": 6}, "strict": [6]}}})
    assert exp.fabric.traffic_classes.strict == (6,)
    with pytest.raises(ConfigError) as err:  # a strict priority nothing is mapped to
        xp.parse({"version": 1, "fabric": {**PFC_LS, "traffic_classes": {
            "dscp_to_priority": {"48": 6}, "strict": [5]}}})
    assert err.value.path == "fabric.traffic_classes.strict[0]" and "5" in err.value.message


def test_the_actuator_request_is_a_tbf_change_of_the_priority_leaf():
    plan = plan_shaping(10, 9000, 128, priorities=(0, 3), lossless={3: 300 * KB})
    paused = plan.paused(plan.classes[1])
    msg = RawTc.request(42, 3, paused)
    length, kind, flags = struct.unpack_from("=IHH", msg)
    assert (length, kind, flags) == (len(msg), 36, 0x5)  # RTM_NEWQDISC, request + ack: change
    _family, index, handle, parent, _ = struct.unpack_from("=BxxxiIII", msg, 16)
    assert (index, handle, parent) == (42, leaf_handle(3), class_id(3))
    assert b"tbf\0" in msg
    rate = struct.unpack_from("=I", msg, msg.index(b"tbf\0") + 4 + 4 + 4 + 8)[0]
    assert rate == paused.rate_kbit * 125
    assert msg.endswith(struct.pack("=HHI", 8, 6, paused.burst_bytes))  # TCA_TBF_BURST


def test_up_down_routing_decides_which_ports_feed_a_queue():
    topo = leaf_spine(2, 2, 2)
    up1, up2 = (topo.find_link("leaf1", s) for s in ("spine1", "spine2"))
    host1, host2 = topo.host_link("h1_1"), topo.host_link("h1_2")
    assert feeds(topo, "leaf1", host1, up1) and feeds(topo, "leaf1", host1, host2)
    assert feeds(topo, "leaf1", up1, host1)
    assert not feeds(topo, "leaf1", up1, up2)  # what came down never goes back up
    assert not feeds(topo, "leaf1", up1, up1)
    down1, down2 = topo.find_link("spine1", "leaf1"), topo.find_link("spine1", "leaf2")
    assert feeds(topo, "spine1", down1, down2)


def test_the_summary_counts_pauses_and_lossless_drops_per_port_and_priority():
    def port(packets, drops3, pauses, paused_s):
        return {"queue": {"packets": packets, "drops": drops3},
                "priorities": {3: {"packets": packets, "ect": 0, "marked": 0,
                                   "queue": {"drops": drops3},
                                   "pfc": {"pause_events": pauses, "paused_s": paused_s,
                                           "watchdog_events": 0, "paused": False}}}}

    before = {"s-eth1": port(10, 0, 1, 0.5), "h-eth0": {"priorities": {3: {"pfc": {
        "pause_events": 0, "paused_s": 0.0, "watchdog_events": 0, "paused": False}}}}}
    after = {"s-eth1": port(110, 2, 4, 2.0), "h-eth0": {"priorities": {3: {"pfc": {
        "pause_events": 3, "paused_s": 1.25, "watchdog_events": 1, "paused": True}}}}}
    doc = summarize_congestion(before, after, {}, lossless=(3,))
    assert (doc["pfc_pause_events"], doc["pfc_paused_s"], doc["pfc_watchdog_events"]) == (
        6, 2.75, 1)
    assert doc["lossless_drops"] == 2 and doc["drops"] == 2
    assert doc["ports"]["h-eth0"]["priorities"]["3"]["pfc"]["pause_events"] == 3
    assert doc["ports"]["h-eth0"]["priorities"]["3"]["pfc"]["xoff_events"] == 0
    assert doc["ports"]["s-eth1"]["priorities"]["3"]["drops"] == 2


def test_a_red_leaf_marks_like_the_marker_step_and_never_drops_early():
    from testbed.linux.rawnl import TC_RED_ECN, TC_RED_NODROP, red_options
    from testbed.plan.tcplan import red_plan

    step = red_plan("step", 27 * KB, 0, 0, 0.0, 128 * KB, 9000)
    assert (step.min_bytes, step.max_bytes, step.max_p) == (27 * KB, 27 * KB + 9014, 1.0)
    assert red_plan("off", 1, 1, 2, 0.1, 128 * KB, 9000) is None
    plan = plan_shaping(10, 9000, 128, priorities=(0, 3), lossless={3: 300 * KB},
                        red={0: ("step", 27 * KB, 0, 0, 0.0), 3: ("step", 27 * KB, 0, 0, 0.0)})
    assert plan.classes[0].red == step and plan.classes[1].red is None  # lossless: the marker
    opts = red_options(step)
    limit, qmin, qmax, wlog, _plog, scell, flags = struct.unpack_from("=IIIBBBB", opts, 4)
    assert (limit, qmin, qmax, wlog, scell, flags) == (128 * KB, step.min_bytes,
                                                      step.max_bytes, 0, 0, 0)
    both = TC_RED_ECN | TC_RED_NODROP  # in TCA_RED_FLAGS only (the kernel refuses both places)
    assert opts.endswith(struct.pack("=HHII", 12, 4, both, both))


def test_the_switches_send_buffer_covers_every_queue_full():
    from testbed.plan.portplan import TRUESIZE_FACTOR, send_buffer_bytes, switch_queue_bytes

    exp = xp.parse({"version": 1, "fabric": {**PFC_LS, "pfc": {"priorities": [3]}}})
    total = switch_queue_bytes(exp)
    # 3 leaves x (3 host ports + 1 uplink) + 3 spine ports, each with a 128 KiB lossy class
    # and a lossless one of XOFF + headroom
    ports = 3 * (3 + 1) + 3
    assert total == ports * (128 * KB + exp.pfc.limit_bytes)
    assert send_buffer_bytes(total) == TRUESIZE_FACTOR * total


def test_the_summary_counts_a_links_random_loss_apart_from_queue_drops():
    before = {"h-eth0": {"priorities": {0: {"loss_drops": 2}}}}
    after = {"h-eth0": {"priorities": {0: {"loss_drops": 9}}},
             "s-eth1": {"queue": {"packets": 50, "drops": 1},
                        "priorities": {0: {"packets": 50, "ect": 0, "marked": 0,
                                           "loss_drops": 3}}}}
    doc = summarize_congestion(before, after, {})
    assert (doc["link_loss_drops"], doc["drops"]) == (10, 1)
    assert doc["ports"]["h-eth0"]["priorities"]["0"]["link_loss_drops"] == 7
