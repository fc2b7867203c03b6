"""rocev2's HPCC and Swift (traffic/transports/rate_control.py) with a fake clock and scripted
INT: HPCC's window law (the IETF draft's MeasureInflight and ComputeWind), the INT area's wire
format, the ACK that echoes it, Swift's delay law."""

from __future__ import annotations

import pytest

from traffic.transports.packet import INT_SIZE, Flag, Hop, Kind, Packet, int_bytes, parse_int
from traffic.transports.rate_control import Hpcc, HpccConfig, Swift, SwiftConfig
from traffic.transports.rocev2 import RoceConfig, RoceReceiver, RoceSender

MSS = 1000
RATE = 8e6  # bit/s: 1 MB/s
T = 0.010  # base RTT: a BDP of 10 kB


def hop(t_s: float, sent: int, qlen: int, rate_bps: float = RATE) -> Hop:
    return Hop(int(t_s * 1e9), sent % (1 << 32), qlen, int(rate_bps / 1000))


def test_an_int_area_round_trips_in_a_packet_and_its_ack():
    hops = (hop(1.0, 5000, 300), hop(1.001, (1 << 32) + 7, 0, 40e6))
    assert parse_int(int_bytes(hops)) == hops and len(int_bytes()) == INT_SIZE
    pkt = Packet(Kind.DATA, (1, 0), psn=3, length=2000, flags=Flag.INT, hops=hops)
    wire = pkt.encode() + bytes(pkt.filler)
    back = Packet.decode(wire)
    assert back.hops == hops and back.length == 2000 and not back.trimmed
    assert hops[1].rate_bytes_s == 5e6


def test_hpcc_cuts_to_the_bottleneck_share_when_a_queue_builds_and_grows_when_idle():
    cfg = HpccConfig(RATE, T, MSS)
    cc = Hpcc(cfg, 0.0)
    assert cc.window == 10_000 and cc.rate == RATE
    # a hop at full rate with a BDP of queue: utilization 2 (twice eta's share)
    cc.on_ack(1, 10, (hop(0.0, 0, 10_000),), T, 0.0)  # the first sample: no change
    assert cc.window == 10_000
    cc.on_ack(11, 20, (hop(T, 10_000, 10_000),), T, T)  # tau = T: U is this sample's
    assert cc.u == pytest.approx(2.0)
    assert cc.wc == pytest.approx(10_000 / (2.0 / 0.95) + cfg.additive_bytes)
    assert cc.cuts == 1
    cut = cc.window
    # then an idle link: U falls under eta and the window grows by W_ai per round trip
    t, sent = T, 10_000
    for i in range(3):
        t += T
        sent += 2_000
        cc.on_ack(21 + 10 * i, 30 + 10 * i, (hop(t, sent, 0),), T, t)
    assert cc.u == pytest.approx(0.2) and cc.stage == 3
    assert cc.window == pytest.approx(cut + 3 * cfg.additive_bytes)


def test_hpcc_reads_the_most_loaded_hop_and_resets_on_a_new_path():
    cc = Hpcc(HpccConfig(RATE, T, MSS), 0.0)
    cc.on_ack(1, 5, (hop(0, 0, 0), hop(0, 0, 0, 4 * RATE)), T, 0.0)
    cc.on_ack(6, 9, (hop(T / 2, 5_000, 0), hop(T / 2, 5_000, 0, 4 * RATE)), T, T / 2)
    # hop 1 sends at its rate (u 1), hop 2 at a quarter of its; tau T/2 weighs it half
    assert cc.u == pytest.approx(0.95 / 2 + 1.0 / 2)
    before = cc.u
    cc.on_ack(10, 12, (hop(T, 9_000, 0),), T, T)  # one hop now: a new path, no sample
    assert cc.u == before and len(cc.links) == 1


def test_rocev2_with_hpcc_stamps_nothing_itself_and_its_ack_echoes_the_switches_int():
    cfg = RoceConfig.scaled(_scale(), cc="hpcc")
    assert cfg.congestion_control == "hpcc" and cfg.dcqcn is None and "HPCC" in cfg.describe()
    tx, rx = RoceSender((1, 0), cfg, 0.0), RoceReceiver((1, 0), cfg)
    tx.offer(3 * cfg.mss)
    pkt = tx.poll(0.0)
    assert pkt.flags & Flag.INT and pkt.hops == ()
    stamped = Packet(pkt.kind, pkt.qp, pkt.psn, 0, pkt.length, flags=pkt.flags | Flag.LAST,
                     sent_ns=pkt.sent_ns, hops=(hop(0.001, 9_000, 0),))
    (ack,) = rx.on_packet(stamped, 0.002)
    assert ack.kind == Kind.ACK and ack.flags & Flag.INT and ack.hops == stamped.hops
    assert ack.sent_ns == pkt.sent_ns and Packet.decode(ack.encode()).hops == stamped.hops


def test_hpcc_and_swift_windows_bound_what_rocev2_has_in_flight():
    for cc in ("hpcc", "swift"):
        cfg = RoceConfig.scaled(_scale(), cc=cc)
        tx = RoceSender((1, 0), cfg, 0.0)
        tx.cc.window = 2.5 * cfg.mss
        tx.offer(20 * cfg.mss)
        sent = [p for t in range(100) if (p := tx.poll(t * 0.01))]
        assert len(sent) == 2, cc  # two whole packets fit in 2.5


def test_swift_grows_under_its_target_delay_and_cuts_over_it_once_per_rtt():
    cfg = SwiftConfig(RATE, T, MSS)
    cc = Swift(cfg, 0.0)
    start = cc.window
    cc.on_ack(1, 2, (), 0.012, 0.0)  # under 15 ms: AI packets per window
    assert cc.window == pytest.approx(start + MSS * MSS / start)
    w = cc.window
    cc.on_ack(2, 3, (), 0.030, 0.01)  # twice the target: cut by beta x 15/30
    assert cc.window == pytest.approx(w * (1 - 0.8 * 0.5)) and cc.cuts == 1
    cc.on_ack(3, 4, (), 0.030, 0.02)  # within the round trip: once
    assert cc.cuts == 1
    cc.on_ack(4, 5, (), 1.0, 0.1)  # a huge delay: at most max_mdf
    assert cc.cuts == 2 and cc.window == pytest.approx(w * 0.6 * 0.5)


def _scale():
    from traffic.transports.packet import Scale
    return Scale(RATE, T, 8936)
