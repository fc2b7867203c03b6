"""The controller's way to its switches (os-ken): each switch's ops sent as OpenFlow messages
over its connection, barriers told to the session, and reroutes sent in loop-free stages
(:mod:`controllers.routing.staging`): the first now, the second once every switch has
answered the first."""

from __future__ import annotations

import time
from collections import Counter

from controllers.routing.ofmsgs import to_messages
from controllers.routing.policy import FabricPolicy
from controllers.routing.session import Session
from controllers.routing.staging import Stager
from controllers.routing.tables import Op, OpKind


class Outbox:
    """The connected switches' datapaths (by name) and what was sent to them."""

    def __init__(self, policy: FabricPolicy, session: Session) -> None:
        self.policy = policy
        self.session = session
        self.datapaths: dict[str, object] = {}
        self.op_counts: Counter[str] = Counter()  # OpenFlow operations sent, by kind
        self.stager = Stager()  # a reroute's second stage, held

    def send(self, name: str, ops: list[Op]) -> int | None:
        """Send a switch its ops; returns the xid of the last barrier among them."""
        dp = self.datapaths.get(name)
        if dp is None:
            return None
        self.op_counts.update(str(op.kind) for op in ops)
        barrier = None
        for op in ops:
            for msg in to_messages(dp, op):
                dp.send_msg(msg)
                if op.kind == OpKind.BARRIER:
                    self.session.barrier_sent(name, msg.xid)
                    barrier = msg.xid
        return barrier

    def send_all(self, per_switch: dict[str, list[Op]], held_first: bool = True
                 ) -> dict[str, int]:
        """Send every switch its ops (after what a reroute holds for it, unless
        ``held_first`` is False); returns each switch's last barrier xid."""
        barriers = {}
        for name, ops in (self.stager.before_send(per_switch) if held_first
                          else per_switch).items():
            xid = self.send(name, ops)
            if xid is not None:
                barriers[name] = xid
        return barriers

    def reroute(self, changes: dict[str, list[Op]], cause: str, heard: float) -> None:
        """Send a reroute's changes: the first stage now (the session records it), the
        second held until the first is answered."""
        ops, staged = self.stager.plan(self.policy.previous, changes, heard, cause)
        barriers = self.send_all(ops, held_first=False)
        if staged:
            self.stager.awaiting(barriers)
        if any(changes.values()):
            self.session.reroute(cause, heard, time.time(), barriers)

    def release(self, held: dict[str, list[Op]]) -> None:
        """Send a reroute's second stage (recorded as a reroute of its own)."""
        if held:
            self.session.reroute(f"{self.stager.cause}, ports added", self.stager.heard,
                                 time.time(), self.send_all(held, held_first=False))
