"""Receiver credits (Ultra Ethernet 1.0's receiver-credit congestion control, RCCC), sans I/O:
the receiver of an incast knows its own link, so it, not the senders, decides how fast they
may send. Each sender starts with a little unsolicited credit and announces how much it has
to send; the receiver grants credit, packet-sized, round robin over the senders that still
need some, at its line rate and never more than ``window_bytes`` outstanding (granted, not yet
arrived), so the senders' data arrives at about the rate its link drains, and its queue stays
short however many senders there are.

:class:`CreditReceiver` is the receiver's scheduler (one per receiving rank, over its queue
pairs); :class:`CreditSender` a sender's account. Both take ``now`` and return what to do, so
they are tested with a fake clock.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass
class CreditSender:
    """A queue pair's credit: what it may send beyond what it sent.

    Args:
        initial_bytes: unsolicited credit (the first round trip's worth, before any grant).
    """

    initial_bytes: int
    granted: int = field(init=False)
    sent: int = 0

    def __post_init__(self) -> None:
        self.granted = self.initial_bytes

    @property
    def available(self) -> int:
        """Credit left; below zero after a packet larger than what was left (UET's rule: a
        packet may leave on *any* credit, so no remainder smaller than a packet is stranded)."""
        return self.granted - self.sent

    def may_send(self, nbytes: int) -> bool:
        return self.available > 0

    def on_send(self, nbytes: int) -> None:
        self.sent += nbytes

    def on_grant(self, total_granted: int) -> None:
        """A grant carries the receiver's running total for this queue pair (a lost grant is
        made good by the next one)."""
        self.granted = max(self.granted, total_granted)


@dataclass
class _Demand:
    wanted: int = 0  # bytes the sender said it has to send, in all
    granted: int = 0  # bytes granted so far (its initial credit included)
    arrived: int = 0  # bytes that arrived


class CreditReceiver:
    """A receiving rank's credit scheduler.

    Args:
        rate_bytes_s: its link's rate.
        window_bytes: the most credit outstanding at once (granted, not yet arrived), over all
            its senders: about a bandwidth-delay product.
        grant_bytes: one grant's size (a packet's payload).
        initial_bytes: the credit every sender starts with, unasked.
    """

    def __init__(self, rate_bytes_s: float, window_bytes: int, grant_bytes: int,
                 initial_bytes: int) -> None:
        if rate_bytes_s <= 0 or window_bytes <= 0 or grant_bytes <= 0 or initial_bytes < 0:
            raise ValueError("credit rate, window and grant must be > 0")
        self.rate = rate_bytes_s
        self.window = window_bytes
        self.grant_bytes = grant_bytes
        self.initial = initial_bytes
        self.demand: OrderedDict[tuple[int, int], _Demand] = OrderedDict()
        self.next_grant_at = 0.0
        self.grants = 0

    def on_request(self, qp: tuple[int, int], wanted_bytes: int) -> None:
        """A sender says how much it has to send in all (a new message raises it)."""
        d = self.demand.setdefault(qp, _Demand(granted=self.initial))
        d.wanted = max(d.wanted, wanted_bytes)

    def on_data(self, qp: tuple[int, int], nbytes: int) -> None:
        d = self.demand.setdefault(qp, _Demand(granted=self.initial))
        d.arrived += nbytes

    @property
    def outstanding(self) -> int:
        """Credit granted beyond the initial and not yet used by arrived data (data uses the
        initial credit first)."""
        return sum(max(0, d.granted - max(d.arrived, self.initial))
                   for d in self.demand.values())

    def granted(self, qp: tuple[int, int]) -> int | None:
        """The credit granted to ``qp`` so far beyond its initial (None: none): what a sender
        that asks again is told again (its grants may have been lost)."""
        d = self.demand.get(qp)
        return d.granted if d is not None and d.granted > self.initial else None

    def next_time(self) -> float | None:
        """When the next grant is due (None: nobody needs one, or the window is full: data
        arriving opens it)."""
        if self.outstanding + self.grant_bytes > self.window or not self._needy():
            return None
        return self.next_grant_at

    def _needy(self) -> list[tuple[int, int]]:
        return [qp for qp, d in self.demand.items() if d.granted < d.wanted]

    def poll(self, now: float) -> list[tuple[tuple[int, int], int]]:
        """The grants due at ``now``: (queue pair, its total granted so far), round robin,
        paced at the line rate, within the window."""
        out = []
        while now >= self.next_grant_at and self.outstanding + self.grant_bytes <= self.window:
            needy = self._needy()
            if not needy:
                break
            qp = needy[0]
            d = self.demand[qp]
            d.granted = min(d.wanted, d.granted + self.grant_bytes)
            self.demand.move_to_end(qp)  # round robin: the next one first next time
            out.append((qp, d.granted))
            self.grants += 1
            self.next_grant_at = max(self.next_grant_at, now - self.grant_bytes / self.rate) \
                + self.grant_bytes / self.rate
        return out
