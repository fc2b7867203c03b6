"""A controller's warm start: each switch's flow and group tables read back when it connects
(``OFPMP_FLOW_DESC`` and ``OFPMP_GROUP_DESC``), then only what differs from the desired state
changed, so a restarted controller takes over a fabric that kept forwarding without flushing
it (faucet's warm start). A mixin of :class:`controllers.app.FabricController`: it calls
:meth:`WarmStart._programme` with what it read, and the session records per switch what was
found and what was changed (the status document's ``warm_start``)."""

from __future__ import annotations

from controllers.ofmsgs import flow_entry
from controllers.routing.tables import SwitchTables


class ReadBack:
    """A switch's tables being read back at a warm start: the replies awaited (by xid) and
    what they said so far."""

    def __init__(self, dp, ports: dict, xids: set[int]) -> None:
        self.dp, self.ports, self.waiting = dp, ports, xids
        self.flows: dict[tuple, object] = {}
        self.groups: dict[int, object] = {}
        self.unreadable = 0
        self.youngest_s: float | None = None


class WarmStart:
    """The read-back half of the controller app (needs its ``policy``, ``session``,
    ``readback``, ``_programme`` and ``write_status``)."""

    def _read_back(self, dp, name: str, ports: dict) -> None:
        parser, ofp = dp.ofproto_parser, dp.ofproto
        requests = [parser.OFPFlowDescStatsRequest(dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY,
                                                   ofp.OFPG_ANY, 0, 0, parser.OFPMatch()),
                    parser.OFPGroupDescStatsRequest(dp, 0, ofp.OFPG_ALL)]
        for req in requests:
            dp.set_xid(req)
        self.readback[name] = ReadBack(dp, ports, {req.xid for req in requests})
        for req in requests:
            dp.send_msg(req)

    def _read_back_reply(self, msg) -> bool:
        """A reply to a read-back request (taken in; True), or not one (False)."""
        switch = self.policy.topo.switch_by_dpid(msg.datapath.id)
        back = self.readback.get(switch.name) if switch is not None else None
        if back is None or back.dp is not msg.datapath or msg.xid not in back.waiting:
            return False
        for part in msg.body:
            if hasattr(part, "instructions"):  # a flow
                entry = flow_entry(part)
                sec, nsec = part.stats.get("duration", (0, 0))
                age = sec + nsec / 1e9
                back.youngest_s = age if back.youngest_s is None else min(back.youngest_s, age)
                if entry is None:
                    back.unreadable += 1
                else:
                    back.flows[entry.key] = entry
            elif part.entry is not None:  # a group (controllers.ofmsgs.GroupDesc)
                back.groups[part.entry.group_id] = part.entry
            else:
                back.unreadable += 1
        if not msg.flags & msg.datapath.ofproto.OFPMPF_REPLY_MORE:
            back.waiting.discard(msg.xid)
        if not back.waiting:
            del self.readback[switch.name]
            ops = self._programme(back.dp, back.ports, SwitchTables(back.flows, back.groups))
            self.session.warm_started(switch.name, len(back.flows), len(back.groups),
                                      back.unreadable, back.youngest_s, ops)
            self.write_status()
        return True
