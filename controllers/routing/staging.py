"""Loop-free reroutes (pure): a reroute's changes in two stages.

The switches forward as OpenFlow switches do, without decrementing an IP TTL: a packet caught
in a forwarding loop circles until a table changes, at the links' rate, and takes the machine's
CPU with it (the switch agents that must apply the change that ends the loop included). A
reroute changes several switches' groups at once over separate connections, so in whatever
order they land, no mix of old and new groups may form a loop. A k=4 fat-tree's core1 losing
its link to pod 2 is one: core1's groups towards pod 2 become "back up to another pod" (its
shortest way now), while the other pods' aggregation switches stop sending pod 2's traffic
to core1; where core1 changed first, a flow whose hash at agg3_1 still picked core1 went
agg3_1 -> core1 -> agg3_1 -> ... until agg3_1 changed.

Two stages, as for loop-free convergence: first every group that changes loses the ports it
will not keep (it keeps, in the new order, only those it has in both its old and new
version; none left: it drops, as a switch with no way to a destination does); every switch
then has a subset of its old next hops, and the old tables were loop-free. Once every switch
has answered the first stage's barrier, the second sends everything else (the ports groups
gain, flows, groups added or deleted): each switch then has its first-stage groups or its new
ones, both subsets of the new next hops, and the new tables are loop-free. A stage is only
held back where the first has something to do; a switch that leaves, or a first stage not
answered within ``timeout_s``, does not hold the second forever.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from controllers.routing.tables import Op, OpKind, SwitchTables
from testbed.model.openflow import GroupEntry

#: how long a second stage waits for the first's barriers before it is sent anyway (s)
STAGE_TIMEOUT_S = 1.0


def narrowed(old: GroupEntry, new: GroupEntry) -> GroupEntry | None:
    """``new`` kept to the ports ``old`` has too (their weights ``new``'s), or None where
    ``new`` adds no port (it can go in the first stage whole)."""
    if set(new.ports) <= set(old.ports):
        return None
    keep = [i for i, port in enumerate(new.ports) if port in old.ports]
    return replace(new, ports=tuple(new.ports[i] for i in keep),
                   weights=tuple(new.weights[i] for i in keep) if new.weights else ())


def split(old: SwitchTables | None, ops: list[Op]) -> tuple[list[Op], list[Op]]:
    """One switch's ops (:func:`controllers.routing.tables.diff_tables` against ``old``) as
    the two stages, each ending with a barrier where it has anything to do. A switch whose old
    tables are unknown (programmed from a clear) has no first stage."""
    first: list[Op] = []
    then: list[Op] = []
    for op in ops:
        if op.kind == OpKind.BARRIER:
            continue
        previous = old.groups.get(op.entry.group_id) if (
            old is not None and op.kind == OpKind.GROUP_MOD) else None
        if previous is None:
            then.append(op)
            continue
        narrow = narrowed(previous, op.entry)
        if narrow is None:
            first.append(op)
            continue
        if narrow != previous:  # it loses a port too (a group that only gains waits whole)
            first.append(Op(OpKind.GROUP_MOD, narrow))
        then.append(op)
    return ([*first, Op(OpKind.BARRIER)] if first else [],
            [*then, Op(OpKind.BARRIER)] if then else [])


@dataclass
class Stager:
    """The second stage of the last reroute, held until its first stage is answered.

    The controller sends what :meth:`plan` returns, tells :meth:`awaiting` the barriers it
    sent, and sends what :meth:`answered`, :meth:`left` and :meth:`expired` return; every
    other message for a switch goes after its held stage (:meth:`before_send`), so a held
    stage never lands over a newer change."""

    timeout_s: float = STAGE_TIMEOUT_S
    held: dict[str, list[Op]] = field(default_factory=dict)
    waiting: dict[str, int] = field(default_factory=dict)  # switch -> first-stage barrier xid
    cause: str = ""  # the held stage's reroute: what caused it, when it was heard
    heard: float = 0.0

    def plan(self, old: dict[str, SwitchTables | None], changes: dict[str, list[Op]],
             now: float, cause: str = "") -> tuple[dict[str, list[Op]], bool]:
        """What to send now of ``changes`` (``old``: each switch's tables before them; ``now``:
        when the reroute was heard, from which its second stage's wait counts), and
        whether a second stage is now held (the first's barriers to be :meth:`awaiting`):
        the first stage, or everything at once where no group loses a port; a stage still
        held for one of these switches goes before it."""
        stale = {name: self.held.pop(name) for name in list(self.held) if name in changes}
        stages = {name: split(old.get(name), ops) for name, ops in changes.items()}
        first = {name: f for name, (f, _) in stages.items() if f}
        if first:
            self.held.update({name: t for name, (_, t) in stages.items() if t})
            self.waiting, self.cause, self.heard = {}, cause, now
        now_ops = first or {name: ops for name, ops in changes.items() if ops}
        names = list(dict.fromkeys([*stale, *now_ops]))
        return {n: [*stale.get(n, []), *now_ops.get(n, [])] for n in names}, bool(first)

    def awaiting(self, barriers: dict[str, int]) -> None:
        """The first stage went out; ``barriers``: each switch's last barrier xid."""
        self.waiting = dict(barriers)

    def answered(self, switch: str, xid: int) -> dict[str, list[Op]]:
        """A barrier reply: the held stage once every first-stage barrier is answered."""
        if self.waiting.get(switch) == xid:
            del self.waiting[switch]
        return self._release() if not self.waiting else {}

    def left(self, switch: str) -> dict[str, list[Op]]:
        """A switch disconnected or was programmed from a clear: what was held for it is
        stale, and it no longer holds the others back."""
        self.held.pop(switch, None)
        self.waiting.pop(switch, None)
        return self._release() if not self.waiting else {}

    def expired(self, now: float) -> dict[str, list[Op]]:
        """The held stage, if its first has waited ``timeout_s`` for an answer."""
        return self._release() if self.held and now - self.heard >= self.timeout_s else {}

    def before_send(self, per_switch: dict[str, list[Op]]) -> dict[str, list[Op]]:
        """``per_switch`` with each switch's held stage first (and no longer held)."""
        return {name: [*self.held.pop(name, []), *ops] for name, ops in per_switch.items()}

    def _release(self) -> dict[str, list[Op]]:
        out, self.held, self.waiting = self.held, {}, {}
        return out
