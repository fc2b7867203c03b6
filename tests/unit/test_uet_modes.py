"""uet's NSCC window, receiver credits (RCCC) and delivery modes end to end over a scripted network with a
fake clock: an incast through one bottleneck queue, with and without credits; UUD's losses
given up rather than resent."""

from __future__ import annotations

import heapq
import itertools

from traffic.transports.packet import Kind, Packet, wire_bytes
from traffic.transports.rccc import CreditReceiver
from traffic.transports.uet import UetReceiver, UetSender
from traffic.transports.uet_control import Nscc, UetConfig

MSS = 1000
RATE = 8e6  # bit/s at the bottleneck and at every sender
DELAY = 0.001  # each way, besides the queue


def incast(senders: int, nbytes: int, rccc: bool, until_s: float = 30.0,
           queue_limit: int = 1 << 30) -> dict:
    """``senders`` uet queue pairs into one receiver whose link (``RATE``) has a FIFO queue
    of ``queue_limit`` bytes; returns the largest queue seen, the completion time and the
    counters."""
    cfg = UetConfig(MSS, RATE, 4 * DELAY, rto_s=0.2, rccc=rccc)
    txs = {i: UetSender((i, 0), cfg, 0.0, entropy=i) for i in range(senders)}
    rxs = {i: UetReceiver((i, 0), cfg) for i in range(senders)}
    credit = CreditReceiver(RATE / 8 * MSS / wire_bytes(MSS), cfg.rccc_window_bytes, MSS,
                            cfg.rccc_initial_bytes)
    for tx in txs.values():
        tx.offer(nbytes)
    seq = itertools.count()
    net: list = []  # (time, seq, "rx" | "tx", packet)
    link_free, queued, max_queue, drops, now = 0.0, [], 0, 0, 0.0

    def to_receiver(pkt: Packet, t: float) -> None:
        nonlocal link_free, max_queue, drops
        size = wire_bytes(pkt.length)
        backlog = sum(s for s, done in queued if done > t)
        if backlog + size > queue_limit:
            drops += 1
            return
        link_free = max(link_free, t) + size * 8 / RATE
        queued.append((size, link_free))
        max_queue = max(max_queue, backlog + size)
        heapq.heappush(net, (link_free + DELAY, next(seq), "rx", pkt))

    while now < until_s:
        for tx in txs.values():
            while (pkt := tx.poll(now)) is not None:
                to_receiver(pkt, now + DELAY)
        for qp, total in credit.poll(now):
            heapq.heappush(net, (now + DELAY, next(seq), "tx", Packet(Kind.GRANT, qp,
                                                                      sack=total)))
        queued[:] = [q for q in queued if q[1] > now]
        times = [t for x in (*txs.values(), *rxs.values()) for t in
                 ((x.next_send_time(), x.timer()) if isinstance(x, UetSender) else (x.timer(),))
                 if t is not None]
        times += [t for t in (credit.next_time(),) if t is not None]
        if net:
            times.append(net[0][0])
        if all(tx.una >= len(tx.lengths) for tx in txs.values()) and not net:
            break
        now = max(now + 1e-6, min(times))
        while net and net[0][0] <= now:
            _, _, where, pkt = heapq.heappop(net)
            if where == "rx":
                rx = rxs[pkt.qp[0]]
                if pkt.kind == Kind.REQ:
                    credit.on_request(pkt.qp, pkt.sack)
                    continue
                before = rx.received_bytes
                replies = rx.on_packet(pkt, now)
                credit.on_data(pkt.qp, rx.received_bytes - before)
            else:
                txs[pkt.qp[0]].on_packet(pkt, now)
                replies = []
            for r in replies:
                heapq.heappush(net, (now + DELAY, next(seq), "tx", r))
        for x in (*txs.values(), *rxs.values()):
            t = x.timer()
            if t is not None and t <= now:
                for r in x.on_timer(now) or ():
                    heapq.heappush(net, (now + DELAY, next(seq), "tx", r))
    return {"max_queue": max_queue, "end": now, "drops": drops,
            "delivered": [rx.delivered for rx in rxs.values()],
            "tx": [tx.summary() for tx in txs.values()],
            "rx": [rx.stats for rx in rxs.values()]}


def test_receiver_credits_keep_an_incasts_queue_short_at_the_same_throughput():
    plain = incast(16, 40 * MSS, rccc=False)
    credits = incast(16, 40 * MSS, rccc=True)
    ideal = 16 * 40 * wire_bytes(MSS) * 8 / RATE
    for run in (plain, credits):
        assert run["delivered"] == [40 * MSS] * 16
    assert credits["end"] < ideal * 1.1 + 0.02, (credits["end"], ideal)
    assert credits["end"] < plain["end"] * 1.1
    # the credit window (4 BDPs), paced grants and the first packets' unasked credit bound the queue;
    # the senders' own windows alone let it grow to several BDPs per sender
    assert credits["max_queue"] * 2 <= plain["max_queue"], (credits["max_queue"],
                                                            plain["max_queue"])
    assert sum(t["grants"] for t in credits["tx"]) > 0
    assert all(t["credit_requests"] >= 1 for t in credits["tx"])


def test_a_sender_without_credit_asks_again_after_a_timeout_when_grants_are_lost():
    cfg = UetConfig(MSS, RATE, 0.004, rto_s=0.2, rccc=True)
    tx = UetSender((1, 0), cfg, 0.0)
    tx.offer(10 * MSS)
    first = tx.poll(0.0)
    assert first.kind == Kind.REQ and first.sack == 10 * MSS  # how much there is, first
    sent = [tx.poll(t / 1000) for t in range(1, 20)]
    data = [p for p in sent if p is not None]
    assert all(p.kind == Kind.DATA for p in data)
    assert sum(p.length for p in data) == cfg.rccc_initial_bytes  # its unasked credit only
    assert tx.next_send_time() >= 0.2  # blocked: the next thing is a repeated request
    tx.on_packet(Packet(Kind.ACK, (1, 0), psn=len(data) - 1, ack=len(data)), 0.02)
    again = tx.poll(0.25)
    assert again.kind == Kind.REQ and tx.summary()["credit_stalls"] == 1
    tx.on_packet(Packet(Kind.GRANT, (1, 0), sack=10 * MSS), 0.26)
    assert tx.poll(0.26).kind == Kind.DATA


def test_uud_gives_up_a_lost_packet_and_ends_the_message_without_resending():
    cfg = UetConfig(MSS, RATE, 0.004, rto_s=0.05, delivery="uud")
    tx, rx = UetSender((1, 0), cfg, 0.0), UetReceiver((1, 0), cfg)
    tx.offer(20 * MSS)
    tx.offer(5 * MSS + 300)
    now, out = 0.0, []
    while now < 2.0 and (tx.una < len(tx.lengths) or rx.delivered < 25 * MSS + 300):
        while (pkt := tx.poll(now)) is not None:
            if pkt.psn not in (7, 25):  # one in the middle, the second message's last
                out += [(now + DELAY, p) for p in rx.on_packet(pkt, now + DELAY)]
        for t, reply in [o for o in out if o[0] <= now]:
            tx.on_packet(reply, now)
        out = [o for o in out if o[0] > now]
        for x in (tx, rx):
            t = x.timer()
            if t is not None and t <= now:
                out += [(now + DELAY, r) for r in x.on_timer(now) or ()]
        now += 0.0005
    assert rx.delivered == 25 * MSS + 300  # both messages are over
    assert rx.stats["lost"] == 2 and rx.stats["lost_bytes"] == MSS + 300
    assert tx.summary()["retransmitted"] == 0


def test_nscc_reads_ecn_and_delay_together_as_its_four_quadrants():
    cfg = UetConfig(MSS, 8e6, 0.010, rto_s=0.05)  # queueing delay target 15 ms
    w = Nscc(cfg)
    w.on_ack(0, 0.010, ce=False, now=0.0)  # starts quick adapt's period
    start = w.cwnd
    w.on_ack(MSS, 0.012, ce=True, now=0.001)  # CE, delay under the target: another path
    assert w.cwnd == start and w.cuts == 0  # is congested (REPS leaves it): no change
    w.on_ack(MSS, 0.010, ce=False, now=0.002)  # no CE, no queue: the bytes acknowledged
    assert w.cwnd == start + MSS
    w.on_ack(2 * MSS, 0.0175, ce=False, now=0.003)  # half the target: half of them
    assert w.cwnd == start + 2 * MSS
    start = w.cwnd
    w.on_ack(MSS, 0.030, ce=False, now=0.004)  # over the target without CE: a packet per
    assert w.cwnd == start + MSS * MSS // start  # window (fair increase)
    start = w.cwnd
    w.on_ack(MSS, 0.040, ce=True, now=0.005)  # both: cut by gamma x (q - target) / q
    q = max(w.avg_q, 0.030)
    assert w.cwnd == int(start * (1 - cfg.gamma * (q - 0.015) / q)) and w.cuts == 1
    w.on_ack(MSS, 0.040, ce=True, now=0.006)  # within the same RTT: once
    assert w.cuts == 1
    w.on_ack(MSS, 0.400, ce=True, now=0.1)  # a huge delay: the cut is bounded by md
    assert w.cwnd >= int(w.cwnd / (1 - cfg.md)) * (1 - cfg.md) - 1


def test_nscc_quick_adapt_sets_the_window_to_what_the_period_achieved_after_a_trim():
    cfg = UetConfig(MSS, 8e6, 0.010, rto_s=0.05, init_bdps=4)  # period 10 + 15 ms
    w = Nscc(cfg)
    w.on_ack(0, 0.010, ce=False, now=0.0)
    big = w.cwnd
    for i in range(3):
        w.on_ack(MSS, 0.030, ce=False, now=0.005 * (i + 1))  # 3 packets in the period
    w.on_trim(0.030, now=0.020)  # within the period: waits for its end
    assert w.cwnd >= big and w.quick_adapts == 0
    w.on_ack(MSS, 0.030, ce=False, now=0.026)  # the period is over: 4 packets achieved
    assert w.cwnd == 4 * MSS and w.quick_adapts == 1
    for i in range(3):  # the next period without a trigger: no quick adapt
        w.on_ack(MSS, 0.010, ce=False, now=0.03 + 0.005 * i)
    w.on_ack(MSS, 0.010, ce=False, now=0.06)
    assert w.quick_adapts == 1 and w.cwnd > 4 * MSS


def test_without_nscc_the_window_ignores_the_network():
    cfg = UetConfig(MSS, 8e6, 0.010, rto_s=0.05, nscc=False)
    tx = UetSender((1, 0), cfg, 0.0)
    full = tx.window.cwnd
    tx.window.on_ack(MSS, 1.0, ce=True, now=0.0)
    tx.window.on_trim(1.0, 0.0)
    tx.window.on_timeout()
    assert tx.window.cwnd == full == int(cfg.max_bdps * cfg.bdp_bytes)
