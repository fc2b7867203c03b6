"""Receiver credits (traffic/transports/rccc.py) with a fake clock: grants paced at the
receiver's line rate and shared round robin, never more than the window outstanding, a
sender never beyond its credit, a lost grant made good by the next."""

from __future__ import annotations

import pytest

from traffic.transports.rccc import CreditReceiver, CreditSender

MSS = 1000
RATE = 1_000_000  # bytes/s: a grant per ms


def test_sixteen_senders_share_the_receivers_line_rate_round_robin():
    rx = CreditReceiver(RATE, window_bytes=8 * MSS, grant_bytes=MSS, initial_bytes=MSS)
    qps = [(i, 0) for i in range(16)]
    for qp in qps:
        rx.on_request(qp, 10 * MSS)
        rx.on_data(qp, MSS)  # its first packet, on its initial credit
    granted_at: list[tuple[float, tuple[int, int]]] = []
    now = 0.0
    while now < 0.2 and rx.next_time() is not None:
        for qp, _total in rx.poll(now):
            granted_at.append((now, qp))
            rx.on_data(qp, MSS)  # the data comes at once: only the pace limits
        now += 0.0005
    # 16 x 9 more packets' credit, one per ms: 144 grants over 0.144 s
    assert len(granted_at) == 16 * 9
    assert granted_at[-1][0] == pytest.approx(0.1435, abs=0.002)
    first_round = [qp for _, qp in granted_at[:16]]
    assert sorted(first_round) == qps  # everyone once before anyone twice


def test_the_window_bounds_the_credit_outstanding():
    rx = CreditReceiver(RATE * 1000, window_bytes=4 * MSS, grant_bytes=MSS, initial_bytes=0)
    for i in range(8):
        rx.on_request((i, 0), 10 * MSS)
    grants = [g for t in range(100) for g in rx.poll(1.0 + t * 1e-5)]  # time enough at a
    assert len(grants) == 4 and rx.outstanding == 4 * MSS  # fast line: the window holds it
    assert rx.poll(2.0) == []
    rx.on_data(grants[0][0], MSS)
    assert len(rx.poll(2.0)) == 1 and rx.outstanding == 4 * MSS


def test_no_grant_beyond_what_a_sender_asked_for():
    rx = CreditReceiver(RATE, window_bytes=100 * MSS, grant_bytes=MSS, initial_bytes=MSS)
    rx.on_request((1, 0), 2500)
    totals = [total for _, total in rx.poll(10.0)]
    assert totals == [2000, 2500] and rx.next_time() is None


def test_a_sender_sends_on_any_credit_and_a_lost_grant_is_made_good():
    tx = CreditSender(initial_bytes=MSS // 2)
    assert tx.may_send(MSS)  # half a packet's credit lets a whole packet go (UET's rule)
    tx.on_send(MSS)
    assert not tx.may_send(1) and tx.available == -MSS // 2
    tx.on_grant(3 * MSS)  # the grant for 2 * MSS was lost: the total says it all
    assert tx.available == 2 * MSS
    tx.on_grant(2 * MSS)  # a late, older grant takes nothing back
    assert tx.available == 2 * MSS


def test_partial_credits_are_not_stranded_and_a_repeated_request_is_told_the_total():
    """Credit in packet-sized grants against an initial credit of a packet and a half: every
    sender's leftover half packet would fill the window for good if it could not be spent."""
    rx = CreditReceiver(RATE, window_bytes=4 * MSS, grant_bytes=MSS, initial_bytes=MSS * 3 // 2)
    txs = {(i, 0): CreditSender(MSS * 3 // 2) for i in range(8)}
    for qp in txs:
        rx.on_request(qp, 20 * MSS)
    sent = dict.fromkeys(txs, 0)
    now = 0.0
    while now < 1.0 and any(v < 20 * MSS for v in sent.values()):
        for qp, tx in txs.items():
            while sent[qp] < 20 * MSS and tx.may_send(MSS):
                tx.on_send(MSS)
                sent[qp] += MSS
                rx.on_data(qp, MSS)
        for qp, total in rx.poll(now):
            txs[qp].on_grant(total)
        now += 0.0005
    assert all(v == 20 * MSS for v in sent.values()), sent  # nobody stuck
    assert rx.granted((0, 0)) > 19 * MSS and rx.granted((99, 0)) is None


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        CreditReceiver(0, 1, 1, 0)
