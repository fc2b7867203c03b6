"""The UDP transports' state machines, driven by a fake clock and a scripted network: loss,
reordering and CE marks where a test puts them."""

from __future__ import annotations

import heapq
import itertools

import pytest

from traffic.transports.rocev2 import Dcqcn, DcqcnConfig, RoceConfig, RoceReceiver, RoceSender
from traffic.transports.uet import UetReceiver, UetSender
from traffic.transports.entropy import Feedback, Reps
from traffic.transports.packet import Flag, Kind, Packet, Scale, wire_bytes
from traffic.transports.uet_control import UetConfig

MSS = 1000
QP = (1, 0)


def run(sender, receiver, delay_s=0.001, mangle=None, until_s=60.0):
    """Move packets between a sender and a receiver until the sender has nothing outstanding.

    ``mangle(pkt, n)`` returns the extra delays to deliver data packet ``n`` with (``[]``
    drops it, two values duplicate it) and may set flags on it.
    """
    now, seq = 0.0, itertools.count()
    net: list = []  # (arrival, seq, to_receiver, packet)
    sent = 0
    total = len(sender.lengths)
    while now < until_s:
        while (pkt := sender.poll(now)) is not None:
            extras = mangle(pkt, sent) if mangle else [0.0]
            sent += 1
            for extra in extras:
                heapq.heappush(net, (now + delay_s + extra, next(seq), True, pkt))
        times = [t for t in (sender.next_send_time(), sender.timer(), receiver.timer()) if t]
        if net:
            times.append(net[0][0])
        if not times:
            break
        now = max(now, min(times))
        while net and net[0][0] <= now:
            _, _, to_receiver, pkt = heapq.heappop(net)
            if to_receiver:
                for reply in receiver.on_packet(pkt, now):
                    heapq.heappush(net, (now + delay_s, next(seq), False, reply))
            else:
                sender.on_packet(pkt, now)
        if sender.timer() is not None and sender.timer() <= now:
            sender.on_timer(now)
        if receiver.timer() is not None and receiver.timer() <= now:
            for reply in receiver.on_timer(now):
                heapq.heappush(net, (now + delay_s, next(seq), False, reply))
        acked = sender.una
        if acked >= total and not net:
            break
    return now


def roce(**kw):
    cfg = RoceConfig(MSS, rto_s=0.05, max_outstanding=16, ack_every=2, ack_delay_s=0.002,
                     cnp_interval_s=0.01, line_rate_bps=8e6, **kw)
    return RoceSender(QP, cfg, 0.0), RoceReceiver(QP, cfg)


def test_packet_header_round_trips():
    pkt = Packet(Kind.DATA, (7, 3), psn=9, ack=5, entropy=77, sack=0b101, sent_ns=123,
                 flags=Flag.CE, length=100)
    back = Packet.decode(pkt.encode() + bytes(100))
    assert (back.kind, back.qp, back.psn, back.ack, back.entropy, back.sack, back.sent_ns,
            back.ce, back.length, back.trimmed) == (Kind.DATA, (7, 3), 9, 5, 77, 0b101, 123,
                                                    True, 100, False)
    with pytest.raises(ValueError):
        Packet.decode(b"short")
    with pytest.raises(ValueError, match="says 100"):  # longer than it says: not ours
        Packet.decode(pkt.encode() + bytes(101))


def test_a_trimmed_packet_is_known_by_what_it_says_it_carried():
    """A switch kept the first bytes only: the header says 8,000 payload bytes, 45 came."""
    pkt = Packet(Kind.DATA, (1, 0), psn=42, length=8000)
    back = Packet.decode(pkt.encode() + bytes(45))
    assert (back.psn, back.length, back.trimmed) == (42, 8000, True)
    assert Packet.decode(pkt.encode()).trimmed  # the header alone
    assert not Packet.decode(Packet(Kind.ACK, (1, 0)).encode()).trimmed


def test_scale_brings_published_constants_to_the_emulated_fabric():
    scale = Scale(10e6, 0.02, 9000)
    assert scale.time == pytest.approx(2000)  # 20 ms against 10 us
    assert scale.bdp_bytes == 25_000
    cfg = DcqcnConfig.scaled(scale)
    assert cfg.rate_period_s == pytest.approx(0.11) and cfg.rate_ai_bps == pytest.approx(10e3)
    assert cfg.byte_counter == int(10 * 1024 * 1024 / 50_000 * 25_000)
    assert "byte counter" in cfg.describe()


def test_dcqcn_profiles_scale_their_own_published_constants():
    scale = Scale(10e6, 0.02, 9000)
    cx = DcqcnConfig.scaled(scale, "connectx")
    # ConnectX's 300 us timer, 4 us monitor period and CNP interval, in 10 us RTTs
    assert cx.rate_period_s == pytest.approx(0.6) and cx.cut_interval_s == pytest.approx(0.008)
    assert cx.cnp_interval_s == pytest.approx(0.008) and cx.fast_recovery_stages == 1
    # 32767 B against 100 Gbit/s x 10 us = 125 kB, of a 25 kB BDP; AI 5 Mbit/s of 100 Gbit/s
    assert cx.byte_counter == 9000  # 6,553 B, at least one packet
    assert cx.rate_ai_bps == pytest.approx(500) and not cx.clamp_target
    assert "connectx" in cx.describe() and "paper" in DcqcnConfig.scaled(scale).describe()
    assert RoceConfig.scaled(scale, "connectx").cnp_interval_s == pytest.approx(0.008)
    assert "go-back-N" in RoceConfig.scaled(scale).describe()
    with pytest.raises(ValueError, match="no published constants"):
        DcqcnConfig.scaled(scale, "cx9")
    with pytest.raises(ValueError, match="unknown profile 'cx9'"):
        RoceConfig.scaled(scale, "cx9")


def test_dcqcn_off_keeps_the_line_rate_whatever_the_cnps():
    scale = Scale(10e6, 0.02, 9000)
    cfg = RoceConfig.scaled(scale, "off")
    assert cfg.dcqcn is None and "no rate control" in cfg.describe()
    tx = RoceSender(QP, cfg, 0.0)
    tx.offer(3 * 9000)
    tx.on_packet(Packet(Kind.CNP, QP), 0.0)
    assert tx.stats["cnps"] == 1 and tx.rate_bps == 10e6 and tx.summary()["rate_cuts"] == 0
    assert tx.poll(0.0) is not None and tx.next_send_time() == pytest.approx(
        wire_bytes(9000) * 8 / 10e6)


def test_connectx_dcqcn_cuts_once_per_monitor_period_and_clamps_only_after_a_timer_stage():
    cfg = DcqcnConfig(10e6, g=1 / 16, alpha_period_s=1.0, rate_period_s=0.1,
                      byte_counter=10**9, fast_recovery_stages=1, rate_ai_bps=1e5,
                      rate_hai_bps=1e6, clamp_target=False, cut_interval_s=0.05)
    cc = Dcqcn(cfg, 0.0)
    cc.on_cnp(0.0)
    assert cc.rate == pytest.approx(5e6) and cc.target == 10e6
    cc.on_cnp(0.02)  # within the monitor period: ignored
    assert cc.rate == pytest.approx(5e6) and cc.cuts == 1
    cc.on_cnp(0.06)  # a second cut with no timer stage between: the target stays
    assert cc.cuts == 2 and cc.target == 10e6 and cc.rate < 2.6e6
    cc.on_timer(0.16)  # a timer stage: halfway back to the old target (F = 1: plus AI)
    assert cc.rate > 6e6
    rate = cc.rate
    cc.on_cnp(0.2)  # after a timer increase the cut clamps the target to the rate
    assert cc.target == pytest.approx(rate)


def test_rocev2_delivers_in_order_without_retransmitting():
    tx, rx = roce()
    end = tx.offer(20 * MSS + 10)
    run(tx, rx)
    assert tx.acked == end == 21 and rx.delivered == 20 * MSS + 10
    assert tx.summary()["retransmitted"] == 0 and rx.stats["out_of_order"] == 0


def test_rocev2_goes_back_n_after_a_loss():
    tx, rx = roce()
    tx.offer(20 * MSS)
    run(tx, rx, mangle=lambda pkt, n: [] if n == 5 else [0.0])
    assert tx.acked == 20 and rx.delivered == 20 * MSS
    s = tx.summary()
    # everything sent after PSN 5 before the NAK came back was thrown away and sent again
    assert s["naks"] >= 1 and s["retransmitted"] >= 2 and rx.stats["out_of_order"] >= 1
    assert s["retransmitted_bytes"] == s["retransmitted"] * MSS


def test_rocev2_collapses_under_reordering_that_uet_absorbs():
    def swap(pkt, n):  # every 4th packet overtaken by the next
        return [0.0015] if n % 4 == 1 else [0.0]

    tx, rx = roce()
    tx.offer(40 * MSS)
    run(tx, rx, mangle=swap)
    assert tx.acked == 40 and tx.summary()["retransmitted"] > 5

    cfg = UetConfig(MSS, 8e6, 0.002, rto_s=0.05)
    utx, urx = UetSender(QP, cfg, 0.0), UetReceiver(QP, cfg)
    utx.offer(40 * MSS)
    run(utx, urx, mangle=swap)
    assert utx.una == 40 and urx.delivered == 40 * MSS
    assert utx.summary()["retransmitted"] == 0 and urx.stats["out_of_order"] > 5


def test_rocev2_tail_loss_is_recovered_by_the_timeout():
    tx, rx = roce()
    tx.offer(3 * MSS)
    lost = {2}
    run(tx, rx, mangle=lambda pkt, n: [] if n in lost else [0.0])
    assert tx.acked == 3 and tx.summary()["timeouts"] == 1


def test_ce_marks_become_cnps_at_most_one_per_interval_and_cut_the_rate():
    tx, rx = roce(dcqcn=DcqcnConfig(8e6, alpha_period_s=1.0, rate_period_s=1.0))

    def mark(pkt, n):
        pkt.flags |= Flag.CE
        return [0.0]

    tx.offer(30 * MSS)
    end = run(tx, rx, mangle=mark)
    # every packet marked, but at most one CNP per 10 ms interval (the rate falls with each)
    assert rx.stats["ce"] == 30 and 2 <= rx.stats["cnps"] < 30
    assert rx.stats["cnps"] <= end / 0.01 + 1
    assert tx.summary()["rate_cuts"] == rx.stats["cnps"] and tx.rate_bps < 8e6


def test_dcqcn_cuts_by_alpha_then_recovers_fast_then_additively_then_hyper():
    cfg = DcqcnConfig(10e6, g=1 / 16, alpha_period_s=0.1, rate_period_s=0.1,
                      byte_counter=10**9, fast_recovery_stages=2, rate_ai_bps=1e5,
                      rate_hai_bps=1e6)
    cc = Dcqcn(cfg, 0.0)
    cc.on_cnp(0.0)
    assert cc.rate == pytest.approx(5e6) and cc.target == 10e6  # alpha 1: half
    assert cc.alpha == pytest.approx(1.0)
    cc.on_timer(0.1)  # stage 1: fast recovery, halfway to the target
    assert cc.rate == pytest.approx(7.5e6) and cc.alpha < 1.0
    cc.on_cnp(0.15)
    assert cc.target == pytest.approx(7.5e6) and cc.rate < 7.5e6 * 0.6
    targets = []
    for i in range(1, 4):
        cc.on_timer(0.15 + 0.1 * i)
        targets.append(cc.target)
    # stage 1 (under F = 2): fast recovery, the target holds; then additive increase
    assert targets[0] == pytest.approx(7.5e6)
    assert targets[1] == pytest.approx(7.5e6 + 1e5) and targets[2] == pytest.approx(7.5e6 + 2e5)
    cc.timer_stage = cc.byte_stage = 3  # both counters past F: hyper increase
    before = cc.target
    cc._increase()
    assert cc.target == pytest.approx(before + 2 * 1e6)  # (min(3, 3) - 2 + 1) x HAI


def test_uet_retransmits_only_what_was_lost():
    cfg = UetConfig(MSS, 8e6, 0.002, rto_s=0.05)
    tx, rx = UetSender(QP, cfg, 0.0), UetReceiver(QP, cfg)
    tx.offer(40 * MSS)
    run(tx, rx, mangle=lambda pkt, n: [] if n in (5, 17) else [0.0])
    assert tx.una == 40 and rx.delivered == 40 * MSS
    assert tx.summary()["retransmitted"] == 2  # selective: the two lost, nothing else
    assert tx.summary()["retransmitted_bytes"] == 2 * MSS


def _trim(which):
    """A mangle: data packets ``which`` arrive as a trimming switch leaves them."""
    def mangle(pkt, n):
        if n in which:
            pkt.trimmed = True
        return [0.0]
    return mangle


def test_uet_resends_a_trimmed_packet_at_once_where_a_drop_waits():
    """Trimmed, the receiver NACKs the packet as it arrives and the sender resends it first:
    no timeout, no reordering window, the window cut once; the same packets dropped are
    recovered later."""
    cfg = UetConfig(MSS, 8e6, 0.002, rto_s=0.05)
    tx, rx = UetSender(QP, cfg, 0.0), UetReceiver(QP, cfg)
    tx.offer(40 * MSS)
    trimmed_s = run(tx, rx, mangle=_trim({5, 17}))
    st = tx.summary()
    assert tx.una == 40 and rx.delivered == 40 * MSS
    assert (st["trim_naks"], st["retransmitted"], st["timeouts"]) == (2, 2, 0)
    assert rx.stats["trimmed"] == 2 and rx.stats["naks"] == 0
    assert st["rate_cuts"] >= 1
    ends = {}
    for how, mangle in (("trimmed", _trim({39})), ("dropped", lambda p, n: [] if n == 39
                                                    else [0.0])):  # the tail packet
        tx2, rx2 = UetSender(QP, cfg, 0.0), UetReceiver(QP, cfg)
        tx2.offer(40 * MSS)
        ends[how] = run(tx2, rx2, mangle=mangle)
        assert tx2.una == 40 and tx2.summary()["timeouts"] == 0
    clean = UetSender(QP, cfg, 0.0)
    clean.offer(40 * MSS)
    ends["clean"] = run(clean, UetReceiver(QP, cfg))
    # trimmed: one round trip (2 ms) and a resend late; dropped: a probe's wait besides
    assert ends["trimmed"] - ends["clean"] < 0.006 < ends["dropped"] - ends["clean"], ends
    assert trimmed_s > 0


def test_a_trimmed_nack_for_a_packet_acknowledged_since_changes_nothing():
    cfg = UetConfig(MSS, 8e6, 0.002, rto_s=0.05)
    tx = UetSender(QP, cfg, 0.0)
    tx.offer(2 * MSS)
    first = tx.poll(0.0)
    tx.on_packet(Packet(Kind.ACK, QP, psn=first.psn, ack=1, sent_ns=0), 0.01)
    tx.on_packet(Packet(Kind.NAK, QP, psn=first.psn, flags=Flag.TRIMMED), 0.02)
    assert tx.summary()["trim_naks"] == 1 and tx.summary()["retransmitted"] == 0
    assert tx.una == 1


def test_rocev2_discards_a_trimmed_packet_and_goes_back_n():
    tx, rx = roce()
    tx.offer(20 * MSS)
    run(tx, rx, mangle=_trim({5}))
    assert tx.una == 20 and rx.delivered == 20 * MSS
    assert rx.stats["trimmed"] == 1 and tx.summary()["retransmitted"] >= 1


def test_uet_rod_mode_orders_like_roce():
    cfg = UetConfig(MSS, 8e6, 0.002, rto_s=0.05, delivery="rod", init_bdps=4)
    tx, rx = UetSender(QP, cfg, 0.0), UetReceiver(QP, cfg)
    tx.offer(20 * MSS)
    run(tx, rx, mangle=lambda pkt, n: [0.0015] if n == 3 else [0.0])
    assert tx.una == 20 and rx.delivered == 20 * MSS
    assert rx.stats["naks"] >= 1 and tx.summary()["retransmitted"] >= 1


def test_uet_sprays_over_entropies_and_reuses_those_without_ce():
    import random
    reps = Reps(4, random.Random(3))
    first = [reps.choose() for _ in range(4)]
    assert reps.explored == 4  # the first packets explore
    reps.feedback(first[0], Feedback.GOOD)
    reps.feedback(first[1], Feedback.ECN)  # a congested path: not reused
    assert reps.choose() == first[0] and reps.recycled == 1 and reps.penalised == 1
    reps.choose()
    assert reps.explored == 5  # none in hand: explore again
    cfg = UetConfig(MSS, 8e6, 0.002, rto_s=0.05, entropies=16)
    tx, rx = UetSender(QP, cfg, 0.0), UetReceiver(QP, cfg)
    tx.offer(50 * MSS)
    run(tx, rx)
    assert tx.summary()["entropies"] > 1 and tx.summary()["entropies_recycled"] > 0
    single = UetSender(QP, UetConfig(MSS, 8e6, 0.002, rto_s=0.05, spray=False), 0.0, entropy=9)
    single.offer(10 * MSS)
    run(single, UetReceiver(QP, single.cfg))
    assert single.summary()["entropies"] == 1


def _on_a_queued_path(**cfg_kw) -> tuple[float, dict]:
    """400 packets of one queue pair over entropies of which a quarter hash onto a path with
    6 ms of queue (3 base RTTs): the share of them sent there past the first exploration,
    and the sender's counters."""
    cfg = UetConfig(MSS, 8e6, 0.002, rto_s=0.5, entropies=16, **cfg_kw)
    tx, rx = UetSender(QP, cfg, 0.0), UetReceiver(QP, cfg)
    sent = []
    tx.offer(400 * MSS)
    run(tx, rx, mangle=lambda pkt, n: sent.append(pkt.entropy)
        or ([0.006] if pkt.entropy % 4 == 0 else [0.0]))
    assert tx.una == 400 and rx.delivered == 400 * MSS
    later = sent[100:]
    counters = tx.summary()
    assert counters["entropies_explored"] + counters["entropies_recycled"] == len(sent)
    return sum(1 for e in later if e % 4 == 0) / len(later), counters


def test_uet_leaves_a_path_whose_rtt_shows_a_queue():
    # RED marks at low probability may never report the queue, the RTT does
    shares = {slack: _on_a_queued_path(path_slack=slack)[0] for slack in (0.0, 1.0)}
    assert shares[0.0] > 0.15, shares  # blind recycling keeps using it
    assert shares[1.0] < shares[0.0] / 2, shares
    # the same path, each choice of entropy: oblivious keeps its quarter, the others leave it
    for choice in ("oblivious", "reps", "bitmap"):
        shares[choice], counters = _on_a_queued_path(entropy=choice)
        assert (counters["entropies_penalised"] > 0) == (choice != "oblivious"), choice
    assert shares["oblivious"] == pytest.approx(0.25, abs=0.03), shares
    assert shares["reps"] < 0.15 and shares["bitmap"] < 0.15, shares
    assert "over the flow's least" in UetConfig(MSS, 8e6, 0.002, rto_s=0.5).describe()


@pytest.mark.parametrize("lost", [47, 49])  # one of the last packets; the very last one
def test_uet_recovers_a_lost_tail_packet_without_a_timeout(lost):
    # too few packets follow for the count rule: the reordering timer (RACK) finds a loss
    # behind an acknowledged packet, a tail probe one that nothing follows
    cfg = UetConfig(MSS, 8e6, 0.002, rto_s=1.0, init_bdps=8, max_bdps=8)
    tx, rx = UetSender(QP, cfg, 0.0), UetReceiver(QP, cfg)
    tx.offer(50 * MSS)
    end = run(tx, rx, mangle=lambda pkt, n: [] if n == lost else [0.0])
    s = tx.summary()
    assert tx.una == 50 and rx.delivered == 50 * MSS
    assert s["timeouts"] == 0 and s["retransmitted"] == 1 and end < 0.2, (s, end)
    assert s["probes"] == (1 if lost == 49 else 0) and s["spurious"] == 0


def test_an_ack_covers_up_to_four_packets_in_any_order_and_echoes_each_entropy():
    cfg = UetConfig(MSS, 8e6, 0.002, rto_s=0.05, ack_delay_s=0.005)
    rx = UetReceiver(QP, cfg)
    data = [Packet(Kind.DATA, QP, psn, length=MSS, entropy=10 + psn, sent_ns=psn)
            for psn in range(12)]
    assert rx.on_packet(data[0], 0.0) == [] and rx.timer() == 0.005
    data[1].flags |= Flag.CE
    assert rx.on_packet(data[1], 0.001) == []
    assert rx.on_packet(data[3], 0.002) == []  # out of order: coalesced too (SACK covers it)
    (filled,) = rx.on_packet(data[2], 0.003)  # the gap closes: at once
    assert (filled.ack, filled.sack, filled.entropy, filled.echo) == (4, 0, 12, (13, 11, 10))
    assert filled.ce and filled.echoed()[2] == (11, True) and rx.timer() is None
    assert Packet.decode(filled.encode()) == filled  # the echo survives the wire
    rx.on_packet(data[4], 0.004)
    (timed,) = rx.on_timer(0.010)  # a lone packet is acknowledged after the delay
    assert timed.ack == 5 and timed.echo == () and Packet.decode(timed.encode()).echo == ()
    for psn in (6, 7, 8):  # PSN 5 missing
        assert rx.on_packet(data[psn], 0.011) == []
    (fourth,) = rx.on_packet(data[9], 0.012)  # four pending: one ACK, SACK bits for 6..9
    assert (fourth.ack, fourth.sack, fourth.ce) == (5, 0b1111, False)
    (dup,) = rx.on_packet(data[2], 0.013)  # a duplicate: at once, flagged for the sender
    assert dup.flags & Flag.DUP and rx.stats["duplicates"] == 1 and rx.stats["acks"] == 4


def test_uet_widens_its_reordering_window_after_a_spurious_retransmission():
    # every 10th packet takes 15 ms longer (a deeper queue on its path): overtaken by more than
    # the count threshold, late by more than the first window (one base RTT, 2 ms)
    def skew(pkt, n):
        return [0.015] if n % 10 == 3 and not pkt.flags & Flag.RETX else [0.0]

    cfg = UetConfig(MSS, 8e6, 0.002, rto_s=0.2, init_bdps=8, max_bdps=8)
    tx, rx = UetSender(QP, cfg, 0.0), UetReceiver(QP, cfg)
    tx.offer(200 * MSS)
    run(tx, rx, mangle=skew)
    s = tx.summary()
    assert tx.una == 200 and rx.delivered == 200 * MSS
    # the first late packets were resent for nothing; the window then covered the skew
    assert 1 <= s["spurious"] <= 4 and s["retransmitted"] <= 4, s
    assert s["reorder_window_ms"] > 15 and rx.stats["duplicates"] == s["retransmitted"]


def test_a_nack_rides_on_an_ack_and_resends_an_overdue_packet():
    cfg = UetConfig(MSS, 8e6, 0.002, rto_s=1.0, ack_every=4, init_bdps=8, max_bdps=8)
    tx, rx = UetSender(QP, cfg, 0.0), UetReceiver(QP, cfg)
    tx.offer(12 * MSS)
    sent = [tx.poll(0.002 * n) for n in range(12)]  # paced: one every 2 ms
    assert [p.psn for p in sent] == list(range(12))
    acks = []
    for pkt in sent[:1] + sent[2:11]:  # PSN 1 lost; 9 packets beyond it
        acks += rx.on_packet(pkt, 0.020)
    acks += rx.on_timer(0.030)  # the NACK rides on the next ACK, here the delayed one
    nacks = [a for a in acks if a.flags & Flag.NACK]
    assert len(nacks) == 1 and nacks[0].ack == 1 and rx.stats["naks"] == 1
    assert all(a.kind == Kind.ACK for a in acks)  # no packet of its own
    tx.on_packet(nacks[0], 0.012)  # sent at 2 ms: 10 ms out, over RTT + window (2 + 2 ms)
    assert tx.poll(0.05).psn == 1 and tx.summary()["retransmitted"] == 1


@pytest.mark.parametrize("transport", ["rocev2", "uet"])
def test_a_message_after_an_idle_spell_does_not_time_out_at_once(transport):
    if transport == "rocev2":
        tx, rx = roce()
        rto = tx.cfg.rto_s
    else:
        cfg = UetConfig(MSS, 8e6, 0.002, rto_s=0.05)
        tx, rx = UetSender(QP, cfg, 0.0), UetReceiver(QP, cfg)
        rto = cfg.rto_s
    tx.offer(4 * MSS)
    end = run(tx, rx)
    tx.offer(4 * MSS)  # the next collective, long after the last acknowledgement
    pkt = tx.poll(end + 10 * rto)
    assert pkt is not None and tx.timer() >= end + 10 * rto + rto * 0.99
    assert tx.summary()["timeouts"] == 0


def test_the_uet_timeout_stretches_with_the_measured_rtt():
    cfg = UetConfig(MSS, 8e6, 0.002, rto_s=0.05)
    tx, rx = UetSender(QP, cfg, 0.0), UetReceiver(QP, cfg)
    tx.offer(80 * MSS)
    # a queue builds: each packet waits 1 ms longer, up to 60 ms (a 50 ms timeout would fire)
    run(tx, rx, mangle=lambda pkt, n: [min(0.060, 0.001 * n)])
    assert tx.rto_s > 0.060 and tx.summary()["timeouts"] == 0


def test_a_timeout_frees_a_window_that_a_lost_packet_holds():
    # PSN 0 is NACKed and waits for resending; PSN 1, in flight, is lost; the window has
    # shrunk to one packet, which PSN 1 holds: only the timeout can free it
    cfg = UetConfig(MSS, 8e6, 0.002, rto_s=0.05)
    tx = UetSender(QP, cfg, 0.0)
    tx.offer(3 * MSS)
    assert [tx.poll(0.0).psn, tx.poll(0.002).psn] == [0, 1]
    tx.on_packet(Packet(Kind.ACK, QP, psn=2, ack=0, flags=Flag.NACK, sent_ns=0), 0.02)
    tx.window.cwnd = MSS  # after earlier timeouts
    assert tx.poll(0.03) is None and tx.retx and 1 in tx.outstanding
    tx.on_timer(tx.timer())
    assert tx.poll(tx.timer() - cfg.rto_s + 0.001).psn == 0  # the oldest first
    rx = UetReceiver(QP, cfg)
    run(tx, rx)  # and the rest completes
    assert tx.una == 3 and rx.delivered == 3 * MSS
