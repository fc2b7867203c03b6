"""The Ultra-Ethernet-like transport's receiving side (see :mod:`traffic.transports.uet`):
placement in any order, coalesced ACKs with SACK and echoed entropies, NACKs; in ROD only the
next PSN; in UUD, gaps given up instead of waited for: a PSN overtaken half an RTO ago, or a
message's tail when nothing arrived for two RTOs, counts as lost and the message ends without
it (``delivered`` jumps to the message's end, ``lost_bytes`` counts what was not there)."""

from __future__ import annotations

from dataclasses import dataclass

from traffic.transports.packet import MAX_ECHO, SACK_BITS, Flag, Kind, Packet
from traffic.transports.uet_control import UetConfig

#: a PSN this far or more beyond the cumulative one is not this queue pair's (a stray or forged
#: datagram): ignored, so that no datagram makes a receiver track millions of PSNs
PSN_WINDOW = 1 << 20


@dataclass
class UetReceiver:
    """The receiving side of a queue pair."""

    qp: tuple[int, int]
    cfg: UetConfig

    def __post_init__(self) -> None:
        self.cum = 0  # every PSN below is placed
        self.placed: dict[int, int] = {}  # PSN above cum -> its length
        self.delivered = 0  # bytes of the contiguous prefix
        self.nacked = -1
        self.nack_due = False  # the next ACK carries a NACK for ``cum``
        self.pending: list[Packet] = []  # received, not yet acknowledged
        self.ack_due: float | None = None
        self.received_bytes = 0  # payload placed, each PSN once (what receiver credits count)
        # UUD: message ends (end PSN -> end byte offset) the packets told of, PSNs missing since
        # when, the latest arrival; a gap is given up after ``gap_wait_s``
        self.ends: dict[int, int] = {}
        self.missing_since: dict[int, float] = {}
        self.highest = -1
        self.last_arrival = 0.0
        self.gap_wait_s = self.cfg.rto_s / 2  # a PSN overtaken this long ago
        self.tail_wait_s = 2 * self.cfg.rto_s  # a message's end, nothing arriving this long
        self.message_received = 0  # UUD: bytes placed of the message under way
        self.stats = {"packets": 0, "out_of_order": 0, "duplicates": 0, "naks": 0, "ce": 0,
                      "acks": 0, "trimmed": 0, "lost": 0, "lost_bytes": 0}

    def on_packet(self, pkt: Packet, now: float) -> list[Packet]:
        st = self.stats
        st["packets"] += 1
        if pkt.psn - self.cum >= PSN_WINDOW or (not self.cfg.reliable
                                                 and pkt.ack - self.cum >= PSN_WINDOW):
            return []
        st["ce"] += 1 if pkt.ce else 0
        out = []
        if pkt.trimmed:  # its header only: NACK it at once (nothing placed)
            st["trimmed"] += 1
            if not self.cfg.reliable:  # UUD: lost, and known to be
                self._uud_seen(pkt, now)
                self._give_up([pkt.psn])
            return [Packet(Kind.NAK, self.qp, psn=pkt.psn, ack=self.cum, entropy=pkt.entropy,
                           sent_ns=pkt.sent_ns, flags=Flag.TRIMMED)]
        if not self.cfg.reliable:
            self._uud_seen(pkt, now)
        if self.cfg.ordered and pkt.psn > self.cum:
            st["out_of_order"] += 1
            if self.nacked != self.cum:
                self.nacked = self.cum
                st["naks"] += 1
                out.append(Packet(Kind.NAK, self.qp, psn=self.cum, ack=self.cum))
            return out
        cum_before = self.cum
        duplicate = pkt.psn < self.cum or pkt.psn in self.placed
        if duplicate:
            st["duplicates"] += 1
        else:
            if pkt.psn != self.cum:
                st["out_of_order"] += 1
            self.placed[pkt.psn] = pkt.length
            self.received_bytes += pkt.length
            self.missing_since.pop(pkt.psn, None)
            self._advance()
        self.pending.append(pkt)
        if len(self.placed) >= self.cfg.reorder_threshold and self.nacked != self.cum:
            self.nacked = self.cum  # rides on the next ACK: no packet of its own
            self.nack_due = True
            st["naks"] += 1
        filled = self.cum > cum_before + 1  # a gap closed: tell the sender at once
        if (not duplicate and not filled and len(self.pending) < self.cfg.ack_every
                and not pkt.flags & Flag.LAST):
            if self.ack_due is None:
                self.ack_due = now + self.cfg.ack_delay_s
        else:  # a duplicate, a gap filled, a message's end, or enough: at once
            out.append(self._ack(dup=duplicate))
        return out

    def _ack(self, dup: bool = False) -> Packet:
        """One ACK for the pending packets: the cumulative PSN, the SACK map, the latest
        packet's send time, every pending packet's entropy (latest first) and which carried
        CE, CE if any did, DUP if the latest was a duplicate, NACK with a new gap."""
        last = self.pending[-1]
        covered = self.pending[::-1][:MAX_ECHO]
        ce_mask = sum(1 << i for i, p in enumerate(covered) if p.ce)
        ce = any(p.ce for p in self.pending)  # also those beyond the echoed ones
        flags = (Flag.CE if ce else 0) | (Flag.DUP if dup else 0)
        if self.nack_due:
            flags |= Flag.NACK
            self.nack_due = False
        self.pending = []
        self.ack_due = None
        sack = 0
        for psn in self.placed:
            if self.cum < psn <= self.cum + SACK_BITS:
                sack |= 1 << (psn - self.cum - 1)
        self.stats["acks"] += 1
        return Packet(Kind.ACK, self.qp, psn=last.psn, ack=self.cum, entropy=last.entropy,
                      sack=sack, sent_ns=last.sent_ns, flags=flags,
                      echo=tuple(p.entropy for p in covered[1:]), ce_mask=ce_mask)

    def _advance(self) -> None:
        """Move ``cum`` over the placed PSNs (and, in UUD, those given up): bytes delivered."""
        while self.cum in self.placed:
            length = self.placed.pop(self.cum)
            self.cum += 1
            if self.cfg.reliable:
                self.delivered += length
                continue
            self.message_received += length
            if self.cum in self.ends:  # UUD: a message is over, whatever it lost
                end = self.ends.pop(self.cum)
                self.stats["lost_bytes"] += end - self.delivered - self.message_received
                self.delivered, self.message_received = end, 0

    # -- UUD: gaps given up ------------------------------------------------------------------
    def _uud_seen(self, pkt: Packet, now: float) -> None:
        """Note a UUD packet's message end, and the PSNs it overtook as missing from now."""
        if pkt.ack > 0:
            self.ends.setdefault(pkt.ack, pkt.sack)
        for psn in range(max(self.highest + 1, self.cum), pkt.psn):
            if psn not in self.placed:
                self.missing_since.setdefault(psn, now)
        self.highest = max(self.highest, pkt.psn)
        self.last_arrival = now

    def _give_up(self, psns: list[int]) -> None:
        for psn in psns:
            self.missing_since.pop(psn, None)
            if psn >= self.cum and psn not in self.placed:
                self.placed[psn] = 0
                self.stats["lost"] += 1
        self._advance()

    def _gap_due(self) -> float | None:
        if self.cfg.reliable:
            return None
        times = [t + self.gap_wait_s for t in self.missing_since.values()]
        if any(end > self.highest + 1 for end in self.ends):  # a message's tail is missing
            times.append(self.last_arrival + self.tail_wait_s)
        return min(times, default=None)

    def timer(self) -> float | None:
        times = [t for t in (self.ack_due, self._gap_due()) if t is not None]
        return min(times, default=None)

    def on_timer(self, now: float) -> list[Packet]:
        out = []
        due = self._gap_due()
        if due is not None and now >= due:
            aged = [p for p, t in self.missing_since.items() if now >= t + self.gap_wait_s]
            if now >= self.last_arrival + self.tail_wait_s:  # a message's tail, too
                tail = max((e for e in self.ends if e > self.highest + 1), default=0)
                aged += range(self.highest + 1, tail)
                self.highest = max(self.highest, tail - 1)
            self._give_up(sorted(set(aged)))
            if self.pending:  # cum moved: the sender hears it now
                out.append(self._ack())
        if self.ack_due is not None and now >= self.ack_due and self.pending:
            out.append(self._ack())
        return out
