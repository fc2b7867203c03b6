"""Differential testing of the compiled transport engine against the Python reference
(traffic/transports): a generated network (delays, reordering, loss, duplicates, CE marks,
trims, INT stamps, late wake-ups) drives a sender and a receiver of each implementation in
lockstep; every packet either emits, every time it asks to be woken at and every counter must
be the same. The first difference raises :class:`Diverged` with the step and both values.

The network's choices are drawn from the sequence's own generator and depend only on what the
reference emitted, so a sequence is replayed exactly from its seed."""

from __future__ import annotations

import heapq
import itertools
import os
import random
from dataclasses import dataclass, field

import pytest

from traffic.native import engine
from traffic.transports.packet import INT_SIZE, Flag, Hop, Kind, Packet

#: the differential tests need the compiled engine
needs_engine = pytest.mark.skipif(engine is None, reason="the compiled engine is not built")
#: FABRICLAB_DIFFERENTIAL_SCALE multiplies the sequences each test runs
SCALE = float(os.environ.get("FABRICLAB_DIFFERENTIAL_SCALE", "1"))
#: a test's sequences in this many cases, so that a failure names its seeds' block
BLOCKS = 10


def seeds(block: int, sequences: int) -> range:
    """The seeds of one block of a test's ``sequences`` (scaled)."""
    return range(block, int(sequences * SCALE), BLOCKS)


class Diverged(AssertionError):
    """The native engine and the reference disagreed."""


@dataclass
class Twin:
    """One object of each implementation, called alike; every answer compared."""

    ref: object
    native: object
    trace: list = field(default_factory=list)  # the calls so far (for the report)

    def call(self, method: str, *args):
        self.trace.append((method, args))
        want = getattr(self.ref, method)(*args)
        got = getattr(self.native, method)(*args)
        if _plain(want) != _plain(got):
            raise Diverged(f"{method}{args!r} after {len(self.trace)} calls: reference "
                           f"{want!r}, native {got!r}\nlast calls: {self.trace[-12:]!r}")
        return want

    def same(self, attr: str):
        want, got = getattr(self.ref, attr), getattr(self.native, attr)
        if callable(want):
            want, got = want(), got()
        if _plain(want) != _plain(got):
            raise Diverged(f"{attr}: reference {want!r}, native {got!r} after "
                           f"{len(self.trace)} calls\nlast calls: {self.trace[-12:]!r}")
        return want


def _plain(value):
    """A value as compared: packets by their fields, a list's items alike."""
    if isinstance(value, Packet):
        return (int(value.kind), value.qp, value.psn, value.ack, value.length, value.entropy,
                value.sack, value.sent_ns, int(value.flags), tuple(value.echo), value.ce_mask,
                value.trimmed, tuple(value.hops))
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


@dataclass
class Network:
    """What the path does to packets, drawn per sequence."""

    delay_s: float
    jitter_s: float  # extra delay, uniform up to this: reordering
    loss: float
    reply_loss: float
    duplicate: float
    ce: float
    trim: float
    hops: int  # INT hops stamped on a flagged packet
    late_s: float  # how late a wake-up may be

    @classmethod
    def draw(cls, rng: random.Random, rtt_s: float) -> Network:
        return cls(delay_s=rtt_s / 2 * rng.choice([0.5, 1, 2]),
                   jitter_s=rng.choice([0, 0, rtt_s / 4, rtt_s * 2]),
                   loss=rng.choice([0, 0, 0.01, 0.05, 0.2]),
                   reply_loss=rng.choice([0, 0, 0.02, 0.1]),
                   duplicate=rng.choice([0, 0, 0.02]),
                   ce=rng.choice([0, 0.05, 0.3, 1.0]),
                   trim=rng.choice([0, 0, 0.05]),
                   hops=rng.choice([1, 2, 3]),
                   late_s=rng.choice([0, 0, rtt_s / 10]))


def _stamp(pkt: Packet, now: float, rng: random.Random, counters: list[int], rate_kbps: int,
           hops: int) -> None:
    """Switches' INT on a flagged DATA packet: times, bytes sent and queues per hop."""
    if not pkt.flags & Flag.INT or pkt.length < INT_SIZE:
        return
    stamps = []
    for h in range(hops):
        counters[h] = (counters[h] + pkt.length + rng.randrange(0, 20000)) % (1 << 32)
        stamps.append(Hop(int(now * 1e9) + h * 1000, counters[h], rng.randrange(0, 200000),
                          rate_kbps))
    pkt.hops = tuple(stamps)


def drive(sender: Twin, receiver: Twin, rng: random.Random, net: Network, rtt_s: float,
          rate_bps: float, offers: list[tuple[float, int]], until_s: float,
          max_steps: int = 4000, credit=None) -> int:
    """Run both pairs until every offer is acknowledged, ``until_s`` or ``max_steps``;
    returns the steps taken. ``credit``: the receiver's credit scheduler (the reference's
    :class:`~traffic.transports.rccc.CreditReceiver`), whose grants go to both senders."""
    now, seq = 0.0, itertools.count()
    wire: list = []  # (arrival, seq, to_receiver, packet)
    pending = sorted(offers)
    counters = [0] * net.hops
    for step in range(max_steps):
        while pending and pending[0][0] <= now:
            sender.call("offer", pending.pop(0)[1])
        while (pkt := sender.call("poll", now)) is not None:
            _send(pkt, now, rng, net, wire, seq, counters, rate_bps)
        for qp, total in credit.poll(now) if credit else ():
            grant = Packet(Kind.GRANT, qp, sack=total)
            heapq.heappush(wire, (now + net.delay_s, next(seq), False, grant))
        times = [t for t in (sender.call("next_send_time"), sender.call("timer"),
                             receiver.call("timer"), credit and credit.next_time())
                 if t is not None and t < 1e300]
        if wire:
            times.append(wire[0][0])
        if pending:
            times.append(pending[0][0])
        if not times:
            break
        now = max(now, min(times)) + (rng.random() * net.late_s if net.late_s else 0.0)
        if now > until_s:
            break
        while wire and wire[0][0] <= now:
            _, _, to_receiver, pkt = heapq.heappop(wire)
            if to_receiver and pkt.kind == Kind.REQ:
                credit.on_request(pkt.qp, pkt.sack)
            elif to_receiver:
                before = receiver.same("received_bytes") if credit else 0
                for reply in receiver.call("on_packet", pkt, now):
                    if rng.random() >= net.reply_loss:
                        heapq.heappush(wire, (now + net.delay_s, next(seq), False, reply))
                if credit:
                    credit.on_data(pkt.qp, receiver.same("received_bytes") - before)
            else:
                sender.call("on_packet", pkt, now)
        timer = sender.call("timer")
        if timer is not None and timer <= now:
            sender.call("on_timer", now)
        timer = receiver.call("timer")
        if timer is not None and timer <= now:
            for reply in receiver.call("on_timer", now):
                heapq.heappush(wire, (now + net.delay_s, next(seq), False, reply))
    return step


def _send(pkt: Packet, now: float, rng: random.Random, net: Network, wire: list, seq,
          counters: list[int], rate_bps: float) -> None:
    if pkt.kind == Kind.REQ:  # a credit request: to the receiver's credit scheduler
        heapq.heappush(wire, (now + net.delay_s, next(seq), True, pkt))
        return
    if rng.random() < net.loss:
        return
    copies = 2 if rng.random() < net.duplicate else 1
    for _ in range(copies):
        out = Packet(pkt.kind, pkt.qp, pkt.psn, pkt.ack, pkt.length, pkt.entropy, pkt.sack,
                     pkt.sent_ns, pkt.flags, pkt.echo, pkt.ce_mask)
        if rng.random() < net.ce:
            out.flags |= Flag.CE
        if rng.random() < net.trim:
            out.trimmed = True
        _stamp(out, now, rng, counters, int(rate_bps / 1000), net.hops)
        extra = rng.random() * net.jitter_s if net.jitter_s else 0.0
        heapq.heappush(wire, (now + net.delay_s + extra, next(seq), True, out))
