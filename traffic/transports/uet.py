"""Ultra-Ethernet-like transport: packet spraying with recycled entropy (REPS), out-of-order
placement, SACK and selective retransmission, the NSCC window, receiver credits (RCCC) and
UET's three delivery modes (RUD, ROD, UUD).

Sender (one per queue pair):

* entropy per packet (the engine sends it from source port ``base + entropy``, which the
  switches' ECMP hash covers), chosen as ``entropy`` says (:mod:`traffic.transports.entropy`:
  oblivious, REPS by default, or a bitmap of penalised entropies). REPS keeps the entropies
  whose ACKs came back without CE and reuses them first; with none in hand it explores a random
  one. An ACK's own entropy (its latest packet's, whose RTT the ACK measures) also counts as
  congested when that RTT is more than
  ``path_slack`` base RTTs above the least the flow has seen: a queue on that path, which
  RED-style marking at a low probability rarely reports (on the 3 Mbit/s permutation this took
  uet from 0.83-0.89 of the line rate to 0.92-0.93). ``spray=False`` keeps one
  entropy for the flow (the single-path baseline);
* every ACK carries the cumulative PSN and a 64-bit SACK map beyond it. Loss is decided by
  transmission order *and* time (RACK's idea): a packet is lost once ``reorder_threshold``
  later transmissions are acknowledged and one sent more than the reordering window after it
  has been. Sprayed paths differ by their queues, so the window adapts: it starts at a base
  RTT and doubles (up to half the RTO) whenever an ACK reports a duplicate, i.e. a
  retransmission that was not needed. A NACK names a missing PSN and counts under the same
  time rule; a retransmission timeout (the configured one, or SRTT + 4 RTTVAR when queues make
  that longer; it runs from the last progress or from the first packet after an idle spell)
  counts everything in flight as lost, resends it oldest first and halves the window;
* window: NSCC (:class:`traffic.transports.uet_control.Nscc`: ECN and delay read together,
  quick adapt on a trim or a loss), or fixed with ``nscc=False``. Sending is paced at the line
  rate within the window;
* receiver credits (``rccc=True``, :mod:`traffic.transports.rccc`): new data also waits for
  credit. A queue pair starts with half a BDP unasked, tells its receiver what it has to send
  (a REQ, again after a timeout without a grant: a credit stall) and spends the GRANTs that
  come back; retransmissions need none;
* delivery (``delivery``): RUD as above; ROD keeps one entropy and goes back N on the
  receiver's NAK; UUD never resends: a packet declared lost is given up, and each packet says
  where its message ends, so the receiver ends the message without it.

Receiver: :mod:`traffic.transports.uet_receiver`.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from traffic.transports.packet import (
    SACK_BITS,
    Flag,
    Kind,
    Packet,
    next_send,
    packetize,
    wire_bytes,
)
from traffic.transports.rccc import CreditSender
from traffic.transports.entropy import Feedback
from traffic.transports.entropy import make as entropy_choice
from traffic.transports.uet_control import UetConfig, window_for
from traffic.transports.uet_receiver import UetReceiver

INF = float("inf")
__all__ = ["UetReceiver", "UetSender"]


@dataclass
class UetSender:
    """The sending side of a queue pair."""

    qp: tuple[int, int]
    cfg: UetConfig
    now: float
    entropy: int = 0  # the flow's entropy without spraying
    rng: random.Random = field(default_factory=lambda: random.Random(1))

    def __post_init__(self) -> None:
        self.lengths: list[int] = []
        self.last_of_message: set[int] = set()
        self.una = 0  # every PSN below is acknowledged
        self.nxt = 0  # the next new PSN
        self.acked: set[int] = set()  # acknowledged PSNs at or above una
        self.outstanding: dict[int, int] = {}  # PSN in flight -> its entropy
        self.retx: deque[int] = deque()
        self.queued: set[int] = set()
        self.tsn = 0  # transmissions so far (a retransmission gets a new one)
        self.tsn_of: dict[int, int] = {}  # PSN -> its latest transmission
        self.sent_order: deque[tuple[int, int]] = deque()  # (tsn, PSN), in sending order
        self.inflight = 0  # payload bytes outstanding
        self.sent_at: dict[int, float] = {}  # PSN -> when its latest transmission left
        self.highest_acked_tsn = -1
        self.latest_acked_sent = -INF  # the latest send time among acknowledged packets
        self.reo_wnd = self.cfg.base_rtt_s  # the reordering window (adapts, see above)
        self.srtt: float | None = None
        self.min_rtt = INF
        self.rttvar = 0.0
        self.next_send = self.now
        self.progress_at = self.now
        self.reorder_due: float | None = None  # when the reordering timer fires (RACK)
        self.probed = False  # a tail probe went out since the last progress
        self.probe_psn = -1  # the latest probe's PSN (its duplicate is no spurious resend)
        self.paths = entropy_choice(self.cfg.entropy, self.cfg.entropies, self.rng)
        self.window = window_for(self.cfg)
        # receiver credits: new data waits for them; the receiver hears how much there is to
        # send from a request (REQ) whenever that grows
        self.credit = CreditSender(self.cfg.rccc_initial_bytes) if self.cfg.rccc else None
        self.wanted = 0  # bytes offered in all
        self.announced = 0  # the total the receiver was last told
        self.asked_at = -INF  # when the latest request or grant passed
        self.message_end: dict[int, tuple[int, int]] = {}  # UUD: PSN -> its message's end
        self.stats = {"packets": 0, "bytes": 0, "retransmitted": 0, "retransmitted_bytes": 0,
                      "naks": 0, "timeouts": 0, "sack_losses": 0, "spurious": 0, "ce_acks": 0,
                      "probes": 0, "trim_naks": 0, "credit_requests": 0, "grants": 0,
                      "credit_stalls": 0, "lost": 0, "lost_bytes": 0,
                      "entropies": set()}

    # -- the application's side ------------------------------------------------------------
    def offer(self, nbytes: int) -> int:
        """Queue a message; returns the PSN its last packet ends before (done when acked, or
        given up on in UUD)."""
        first = len(self.lengths)
        end = packetize(self.lengths, self.last_of_message, nbytes, self.cfg.mss)
        self.wanted += nbytes
        if not self.cfg.reliable:  # each packet says where its message ends (PSN, byte)
            for psn in range(first, end):
                self.message_end[psn] = (end, self.wanted)
        return end

    def inflight_bytes(self) -> int:
        return self.inflight

    # -- sending ---------------------------------------------------------------------------
    def _candidate(self) -> int | None:
        while self.retx and (self.retx[0] in self.acked or self.retx[0] < self.una):
            self.queued.discard(self.retx.popleft())
        if self.retx:
            return self.retx[0]
        return self.nxt if self.nxt < len(self.lengths) else None

    def _request_due(self) -> float | None:
        """RCCC: when a credit request must leave (None: none needed): at once when there is
        more to send than the receiver was told, again after a timeout without a grant while
        credit holds the data back."""
        if self.credit is None or self.announced >= self.wanted and not self._credit_blocked():
            return None
        if self.announced < self.wanted:
            return self.next_send
        return self.asked_at + self.rto_s

    def _credit_blocked(self) -> bool:
        psn = self._candidate()
        return (self.credit is not None and psn is not None and psn not in self.queued
                and not self.credit.may_send(self.lengths[psn]))

    def next_send_time(self) -> float | None:
        request = self._request_due()
        psn = self._candidate()
        if psn is None or self._credit_blocked():
            return request
        if self.inflight_bytes() + self.lengths[psn] > self.window.cwnd and self.outstanding:
            return request
        return self.next_send if request is None else min(request, self.next_send)

    def poll(self, now: float) -> Packet | None:
        due = self.next_send_time()
        if due is None or due > now:
            return None
        request = self._request_due()
        if request is not None and request <= now:
            return self._request(now)
        psn = self._candidate()
        if not self.outstanding:  # the timeout runs from this packet, not from the last
            self.progress_at = now  # acknowledgement (maybe a collective ago)
        retx = psn in self.queued
        if retx:
            self.retx.popleft()
            self.queued.discard(psn)
        else:
            self.nxt += 1
        if not self.cfg.spray or self.cfg.ordered:
            entropy = self.entropy
        else:
            entropy = self.paths.choose()
        if self.credit is not None and not retx:
            self.credit.on_send(self.lengths[psn])
        self.outstanding[psn] = entropy
        self.inflight += self.lengths[psn]
        self.tsn_of[psn] = self.tsn
        self.sent_order.append((self.tsn, psn))
        self.tsn += 1
        self.sent_at[psn] = now
        length = self.lengths[psn]
        self.next_send = next_send(now, self.next_send,
                                   wire_bytes(length) * 8 / self.cfg.line_rate_bps)
        st = self.stats
        st["packets"] += 1
        st["bytes"] += length
        st["retransmitted"] += 1 if retx else 0
        st["retransmitted_bytes"] += length if retx else 0
        st["entropies"].add(entropy)
        flags = (Flag.RETX if retx else 0) | (Flag.LAST if psn in self.last_of_message else 0)
        end_psn, end_byte = self.message_end.get(psn, (0, 0))
        return Packet(Kind.DATA, self.qp, psn, end_psn, length, entropy, sack=end_byte,
                      flags=flags, sent_ns=int(now * 1e9))

    def _request(self, now: float) -> Packet:
        """A credit request: the bytes there are to send, in all."""
        if self.announced >= self.wanted:
            self.stats["credit_stalls"] += 1  # asked again: no grant came for a timeout
        self.announced = self.wanted
        self.asked_at = now
        self.stats["credit_requests"] += 1
        self.next_send = next_send(now, self.next_send, wire_bytes(0) * 8 / self.cfg.line_rate_bps)
        return Packet(Kind.REQ, self.qp, sack=self.wanted, sent_ns=int(now * 1e9))

    def _forget(self, psn: int) -> None:
        """``psn`` is no longer in flight (acknowledged, or declared lost)."""
        if self.outstanding.pop(psn, None) is not None:
            self.inflight -= self.lengths[psn]

    def _path_lost(self, psn: int, what: Feedback) -> None:
        """The entropy ``psn`` went out on lost it (a trim, a loss, a timeout): said to the
        choice of entropy when the queue pair sprays."""
        if self.cfg.spray and not self.cfg.ordered:
            self.paths.feedback(self.outstanding[psn], what)

    def _queue_retx(self, psn: int) -> None:
        if psn in self.queued or psn in self.acked or psn < self.una:
            return
        if not self.cfg.reliable:  # UUD: lost for good; the message goes on without it
            self.stats["lost"] += 1
            self.stats["lost_bytes"] += self.lengths[psn]
            self.acked.add(psn)
            self._advance()
            return
        self.queued.add(psn)
        self.retx.append(psn)

    def _advance(self) -> None:
        while self.una in self.acked:
            self.acked.discard(self.una)
            self.una += 1

    # -- feedback --------------------------------------------------------------------------
    def on_packet(self, pkt: Packet, now: float) -> None:
        if pkt.kind == Kind.ACK:
            self._on_ack(pkt, now)
        elif pkt.kind == Kind.GRANT and self.credit is not None:
            self.stats["grants"] += 1
            self.credit.on_grant(pkt.sack)
            self.asked_at = now
        elif pkt.kind == Kind.NAK and pkt.flags & Flag.TRIMMED:
            self._on_trimmed(pkt.psn, now)
        elif pkt.kind == Kind.NAK:
            self.stats["naks"] += 1
            if self.cfg.ordered:  # ROD: go back to the receiver's next expected PSN
                for psn in range(max(pkt.ack, self.una), self.nxt):
                    self._forget(psn)
                    self._queue_retx(psn)

    def _on_trimmed(self, psn: int, now: float) -> None:
        """A switch trimmed ``psn`` and the receiver says so: it is lost, for certain and now
        (no reordering window, no timeout): resent first, and the window cut as on CE with a
        high delay."""
        self.stats["trim_naks"] += 1
        if psn in self.outstanding:
            self._path_lost(psn, Feedback.NACK)
            self._forget(psn)
            self._queue_retx(psn)
            self.progress_at = now  # the receiver answers: the path is alive
        self.window.on_trim(self.srtt if self.srtt is not None else self.cfg.base_rtt_s, now)

    def _overdue(self, psn: int, now: float) -> bool:
        """A NACKed packet is lost if it has been out for longer than an RTT and the
        reordering window (not if it was resent since the NACK's evidence)."""
        rtt = self.srtt if self.srtt is not None else self.cfg.base_rtt_s
        return now - self.sent_at.get(psn, -INF) > rtt + self.reo_wnd

    def _on_ack(self, pkt: Packet, now: float) -> None:
        if pkt.flags & Flag.NACK:
            self.stats["naks"] += 1
            if pkt.ack in self.outstanding and self._overdue(pkt.ack, now):
                self._forget(pkt.ack)
                self._queue_retx(pkt.ack)
        newly = []
        if pkt.psn in self.outstanding and pkt.psn not in self.acked:
            newly.append(pkt.psn)
        for psn in range(self.una, min(pkt.ack, self.nxt)):
            if psn not in self.acked:
                newly.append(psn)
        bits = pkt.sack & ((1 << SACK_BITS) - 1)
        while bits:  # only the set bits
            low = bits & -bits
            psn = pkt.ack + low.bit_length()
            bits ^= low
            if self.una <= psn < self.nxt and psn not in self.acked:  # (a stale ACK's
                newly.append(psn)  # bits below una are acknowledged already)
        acked_bytes = 0
        for psn in set(newly):
            self.acked.add(psn)
            self._forget(psn)
            acked_bytes += self.lengths[psn]
            self.highest_acked_tsn = max(self.highest_acked_tsn, self.tsn_of.get(psn, -1))
            self.latest_acked_sent = max(self.latest_acked_sent, self.sent_at.get(psn, -INF))
        if pkt.flags & Flag.DUP and pkt.psn != self.probe_psn:  # a resend arrived after its
            self.stats["spurious"] += 1  # original: too eager (a tail probe may well)
            self.reo_wnd = min(self.reo_wnd * 2, self.cfg.rto_s / 2)
        self._advance()
        if acked_bytes:
            self.progress_at = now
            self.probed = False
        rtt = max(0.0, now - pkt.sent_ns / 1e9)
        if self.srtt is None:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:  # RFC 6298's estimators
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt
        if pkt.ce:
            self.stats["ce_acks"] += 1
        self.min_rtt = min(self.min_rtt, rtt)
        if self.cfg.spray and not self.cfg.ordered:
            # the ACK's own entropy is its latest packet's, whose RTT this is: a path whose
            # queues hold it more than path_slack base RTTs above the flow's best is not reused
            slow = (self.cfg.path_slack > 0
                    and rtt > self.min_rtt + self.cfg.path_slack * self.cfg.base_rtt_s)
            for i, (entropy, ce) in enumerate(pkt.echoed()):
                congested = ce or (slow and i == 0)
                self.paths.feedback(entropy, Feedback.ECN if congested else Feedback.GOOD)
        self.window.on_ack(acked_bytes, rtt, pkt.ce, now)
        self._detect_losses(now)

    def _detect_losses(self, now: float) -> None:
        """Declare lost, in transmission order, the packets overtaken by an acknowledged later
        transmission that are either overtaken by enough of them and sent long enough before
        the latest acknowledged one, or out for longer than an RTT and the reordering window
        (RACK's timer: the last packets of a message have too few behind them for the count);
        arm :attr:`reorder_due` for the first one not lost yet."""
        order = self.sent_order
        rtt = self.srtt if self.srtt is not None else self.cfg.base_rtt_s
        self.reorder_due = None
        while order:
            tsn, psn = order[0]
            current = psn in self.outstanding and self.tsn_of[psn] == tsn
            if current:
                if tsn >= self.highest_acked_tsn:
                    break  # nothing sent after it is acknowledged yet
                overtaken = (self.highest_acked_tsn - tsn > self.cfg.reorder_threshold
                             and self.latest_acked_sent - self.sent_at[psn] > self.reo_wnd)
                due = self.sent_at[psn] + rtt + self.reo_wnd
                if not overtaken and now < due:
                    self.reorder_due = due
                    break
            order.popleft()
            if current and psn not in self.queued:
                self.stats["sack_losses"] += 1
                self._path_lost(psn, Feedback.NACK)
                self._forget(psn)
                self._queue_retx(psn)
                self.window.on_trim(rtt, now)  # a loss: quick adapt, as a trim

    @property
    def rto_s(self) -> float:
        """The retransmission timeout: the configured one, or longer where the measured RTT
        (queues of several hops at an emulated rate) needs it (RFC 6298: SRTT + 4 RTTVAR)."""
        if self.srtt is None:
            return self.cfg.rto_s
        return max(self.cfg.rto_s, self.srtt + 4 * self.rttvar)

    def _probe_due(self) -> float | None:
        """When to probe the tail (RACK-TLP's idea): two SRTTs without progress while nothing
        new may leave, once per stall."""
        if (self.probed or not self.outstanding or self.srtt is None or self.retx
                or not self.cfg.reliable):
            return None
        if self.next_send_time() is not None:
            return None
        return self.progress_at + 2 * self.srtt

    def timer(self) -> float | None:
        if self.outstanding or self.retx:
            times = [self.progress_at + self.rto_s, self.reorder_due, self._probe_due()]
            return min(t for t in times if t is not None)
        return None

    def on_timer(self, now: float) -> None:
        if self.reorder_due is not None and now >= self.reorder_due:
            self._detect_losses(now)
        probe = self._probe_due()
        if probe is not None and now >= probe and now < self.progress_at + self.rto_s:
            # resend the newest packet in flight: its ACK (SACK) tells which earlier ones are
            # missing, and the reordering timer then finds them
            psn = max(self.outstanding)
            self.probed, self.probe_psn = True, psn
            self.stats["probes"] += 1
            self._forget(psn)
            self._queue_retx(psn)
        if (self.outstanding or self.retx) and now >= self.progress_at + self.rto_s:
            self.stats["timeouts"] += 1
            self.window.on_timeout()
            if self.outstanding:  # the oldest packet's path: the one the timer ran for
                self._path_lost(min(self.outstanding), Feedback.TIMEOUT)
            # everything in flight counts as lost (as TCP's timeout does): a window shrunk to one
            # packet that a lost packet holds would otherwise keep an earlier resend waiting
            for psn in sorted(self.outstanding):
                self._forget(psn)
                self._queue_retx(psn)
            self.retx = deque(sorted(self.retx))  # the oldest first
            self.progress_at = now

    def describe(self) -> str:
        """Where an unfinished queue pair stands (for a stuck job's report)."""
        return (f"{self.una}/{len(self.lengths)} packets acknowledged, {len(self.outstanding)} "
                f"in flight, {len(self.retx)} to resend, window {self.window.cwnd} B, timeout "
                f"{self.rto_s:.2f} s, {self.stats['timeouts']} timeouts")

    def summary(self) -> dict:
        out = {k: v for k, v in self.stats.items() if k != "entropies"}
        out.update(entropies=len(self.stats["entropies"]), rate_cuts=self.window.cuts,
                   reorder_window_ms=round(self.reo_wnd * 1e3, 3),
                   cwnd_bytes=self.window.cwnd, **self.paths.counters())
        return out
