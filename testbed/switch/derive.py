"""What the switch agent derives from every connected switch's tables at once: the groups less
the ports fault notices took from them (:mod:`testbed.plan.notices`), the next switches'
groups whose path quality switch-local choices weigh (:mod:`testbed.plan.lookahead`), and a log
of what the notices did. Kept apart from the agent's connections: the agent hands it the
switches' sessions and installs the groups it returns."""

from __future__ import annotations

from testbed.model.openflow import GroupEntry
from testbed.openflow.session import SwitchSession
from testbed.plan import lookahead, notices

#: the notices' log keeps the newest this many entries (failures[].notices reads it)
LOG_KEEP = 1000

#: per bucket, what it weighs beyond its port as the datapath holds it (the next switch's
#: index, its group, the link's switch index and port; 0: none), None: nothing
NextHops = list[tuple[int, int, int, int] | None]


def may_strand(session: SwitchSession) -> bool:
    """Whether a switch's tables may strand a destination: a dead port or an empty group."""
    return (any(not p.live for p in session.ports.values())
            or any(not g.ports for g in session.groups.values()))


def weighs_next(session: SwitchSession) -> bool:
    """Whether a switch has a group whose choice weighs the next switch."""
    return any(g.selection in lookahead.WEIGHS_NEXT for g in session.groups.values())


class Derived:
    """The notices' exclusions and the next switches' groups, as last worked out.

    ``notify``: fault notices on; ``peers``: per switch, port -> the switch behind it;
    ``index``: switch name -> its index in the datapath's maps (the switches of this machine:
    only theirs can be weighed)."""

    def __init__(self, notify: bool, peers: dict[str, dict[int, str]],
                 index: dict[str, int]) -> None:
        self.notify, self.peers, self.index = notify, peers, index
        self.excluded: notices.Exclusions = {}
        self.ahead: lookahead.NextGroups = {}
        #: what the notices did, the newest LOG_KEEP: (monotonic time, switch, group, ports out)
        self.log: list[tuple[float, str, int, tuple[int, ...]]] = []

    def wanted(self, sessions: list[SwitchSession]) -> bool:
        """Whether the switches' tables call for working it out (again)."""
        return bool(self.ahead) or any(weighs_next(s) for s in sessions) or self.notify and (
            bool(self.excluded) or any(may_strand(s) for s in sessions))

    def update(self, sessions: dict[str, SwitchSession], now: float) -> set[str]:
        """Worked out again from the switches' sessions; the switches whose groups are to be
        installed again (their exclusions or next switches' groups changed)."""
        views = {name: notices.SwitchView(
                    tuple(s.flows.values()), s.groups,
                    frozenset(n for n, p in s.ports.items() if not p.live),
                    self.peers.get(name, {}))
                 for name, s in sessions.items()}
        excluded = notices.exclusions(views) if self.notify and any(
            may_strand(s) for s in sessions.values()) else {}
        ahead = lookahead.next_groups(views) if any(
            weighs_next(s) for s in sessions.values()) else {}
        changed = {name for name in sessions
                   if excluded.get(name, {}) != self.excluded.get(name, {})
                   or ahead.get(name, {}) != self.ahead.get(name, {})}
        for name in sorted(changed):
            old, new = self.excluded.get(name, {}), excluded.get(name, {})
            for gid in set(old) | set(new):
                if old.get(gid) != new.get(gid):
                    self.log.append((now, name, gid, tuple(sorted(new.get(gid, ())))))
        del self.log[:-LOG_KEEP]  # a long run's: its latest events' (failures[].notices)
        self.excluded, self.ahead = excluded, ahead
        return changed

    def group(self, name: str, gid: int, group: GroupEntry) -> tuple[GroupEntry, NextHops]:
        """Switch ``name``'s group ``gid`` as the datapath is to hold it: less the ports
        notices took, and per bucket left the next switch's group it weighs ([]: none)."""
        group = notices.narrowed(group, self.excluded.get(name, {}).get(gid))
        ahead = self.ahead.get(name, {}).get(gid, {})
        hops: NextHops = []
        for port in group.ports:
            beyond = ahead.get(port)
            if beyond is None or beyond.switch not in self.index:
                hops.append(None)
                continue
            link = beyond.link if beyond.link and beyond.link[0] in self.index else None
            hops.append((self.index[beyond.switch], beyond.group or 0,
                         self.index[link[0]] if link else 0, link[1] if link else 0))
        return group, hops if any(hops) else []
