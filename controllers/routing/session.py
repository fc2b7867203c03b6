"""Pure controller session state: what each switch has acknowledged, how it is wired, and what
went wrong, published as the status document the testbed polls.

The os-ken shim (:mod:`controllers.app`) tells this object what it sent and what it received;
nothing here imports os_ken or touches a socket, so every transition is unit-tested. A switch is
*programmed* once every barrier sent to it on its current connection has been answered; a
reconnect or a disconnect forgets the barriers of the old connection (they are never answered).
"""

from __future__ import annotations

from controllers.routing.policy import FabricPolicy

MAX_ERRORS = 50
MAX_EVENTS = 200


class Session:
    """Barrier, wiring and error bookkeeping for one fabric's switches.

    Args:
        policy: the forwarding policy (its topology, connected switches, link state, events).
    """

    def __init__(self, policy: FabricPolicy) -> None:
        self.policy = policy
        self.pending: dict[str, set[int]] = {}  # switch -> barrier xids not yet answered
        self.programmed: set[str] = set()
        self.wiring: dict[tuple[str, int], str | None] = {}  # (switch, port) -> mismatch or None
        self.errors: list[str] = []
        self.warm: dict[str, dict] = {}  # switch -> what its warm start found and changed
        self.fabric_ends = [(e.node, e.port) for link in policy.topo.links
                            if link.tier == "fabric" for e in (link.a, link.b)]
        # each port event's reroute: when it was heard, its changes sent, each switch's
        # barrier answered (the last MAX_EVENTS)
        self.reroutes: list[dict] = []
        self._awaited: dict[tuple[str, int], dict] = {}  # (switch, barrier xid) -> reroute

    # -- barriers ------------------------------------------------------------------------------
    def connected(self, switch: str) -> None:
        """A (re)connection starts from scratch: earlier barriers are never answered."""
        self.pending.pop(switch, None)
        self.programmed.discard(switch)
        self._awaited = {k: v for k, v in self._awaited.items() if k[0] != switch}

    def disconnected(self, switch: str) -> None:
        self.pending.pop(switch, None)
        self.programmed.discard(switch)

    def barrier_sent(self, switch: str, xid: int) -> None:
        self.pending.setdefault(switch, set()).add(xid)
        self.programmed.discard(switch)

    def reroute(self, cause: str, heard: float, sent: float,
                barriers: dict[str, int]) -> None:
        """A port event's changes went out at ``sent`` (heard at ``heard``), each switch's
        ending with the barrier ``barriers[switch]``."""
        item = {"cause": cause, "heard": heard, "sent_ms": round((sent - heard) * 1000, 2),
                "switches": sorted(barriers), "installed_ms": {}}
        self.reroutes = self.reroutes[-(MAX_EVENTS - 1):] + [item]
        for switch, xid in barriers.items():
            self._awaited[(switch, xid)] = item

    def barrier_replied(self, switch: str, xid: int, now: float | None = None) -> bool:
        """Returns whether the switch is now programmed (``now``: when the reply came, for a
        reroute's timing)."""
        item = self._awaited.pop((switch, xid), None)
        if item is not None and now is not None:
            item["installed_ms"][switch] = round((now - item["heard"]) * 1000, 2)
        pending = self.pending.get(switch, set())
        pending.discard(xid)
        if not pending:
            self.programmed.add(switch)
        return switch in self.programmed

    # -- wiring and errors ---------------------------------------------------------------------
    def lldp_seen(self, dpid: int, in_port: int, peer_dpid: int, peer_port: int,
                  now: float) -> bool:
        """Record one LLDP adjacency (checked by the policy); returns whether anything changed."""
        switch = self.policy.topo.switch_by_dpid(dpid)
        if switch is None:
            return False
        key = (switch.name, in_port)
        before = self.wiring.get(key, ...)
        self.wiring[key] = self.policy.lldp_seen(dpid, in_port, peer_dpid, peer_port, now)
        return before != self.wiring[key]

    @property
    def wiring_complete(self) -> bool:
        """Every fabric port end has been seen by LLDP (correctly or not)."""
        return len(self.wiring) >= len(self.fabric_ends)

    def error(self, text: str) -> None:
        self.errors.append(text)

    def warm_started(self, switch: str, flows: int, groups: int, unreadable: int,
                     youngest_s: float | None, ops: list) -> None:
        """A switch's tables read back at a warm start: how many entries it held (and how many
        no policy installs), its youngest flow's age, and the changes sent (by kind)."""
        changes: dict[str, int] = {}
        for op in ops:
            if op.kind != "barrier":
                changes[str(op.kind)] = changes.get(str(op.kind), 0) + 1
        self.warm[switch] = {"flows": flows, "groups": groups, "unreadable": unreadable,
                             "youngest_flow_s": youngest_s, "changes": changes}

    # -- status --------------------------------------------------------------------------------
    def status(self, now: float, pid: int) -> dict:
        """The status document (``controller-status.json``)."""
        policy = self.policy
        return {
            "pid": pid,
            "time": now,
            "switches_expected": len(policy.topo.switches),
            "connected": sorted(policy.connected),
            "programmed": sorted(self.programmed),
            "port_mismatches": [str(m) for ms in policy.mismatches.values() for m in ms],
            "wiring_mismatches": sorted(t for t in self.wiring.values() if t),
            "wiring_verified": sum(1 for e in self.fabric_ends
                                   if e in self.wiring and self.wiring[e] is None),
            "wiring_expected": len(self.fabric_ends),
            "links_down": sorted(n for n, up in policy.link_state().items() if not up),
            "installed": {name: [len(t.flows), len(t.groups)]
                          for name, t in sorted(policy.installed.items())},
            "warm_start": self.warm,
            "errors": self.errors[-MAX_ERRORS:],
            "events": [f"{t:.3f} {text}" for t, text in policy.events[-MAX_EVENTS:]],
            "reroutes": [{**r, "heard": round(r["heard"], 6)} for r in self.reroutes],
        }
