"""A controller's warm start: each switch's flow and group tables read back when it connects
(``OFPMP_FLOW_DESC`` and ``OFPMP_GROUP_DESC``), then only what differs from the desired state
changed, so a restarted controller takes over a fabric that kept forwarding without flushing
it (faucet's warm start). :class:`WarmStart` is a part of :class:`controllers.app.FabricController`:
it hands what it read of a switch to the app's callback, which programmes the switch from it
and records per switch what was found and changed (the status document's ``warm_start``)."""

from __future__ import annotations

from collections.abc import Callable

from controllers.routing.ofmsgs import flow_entry
from testbed.model.topology import Topology


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
    """The switches' tables being read back at a warm start.

    Args:
        topo: the fabric's model (a reply's switch by its datapath id).
        done: called with a switch's name and what was read of it, once every reply is in.
    """

    def __init__(self, topo: Topology, done: Callable[[str, ReadBack], None]) -> None:
        self.topo = topo
        self.done = done
        self.pending: dict[str, ReadBack] = {}  # switch -> its tables being read back

    def request(self, dp, name: str, ports: dict) -> None:
        """Ask ``dp`` (switch ``name``, its ports described) for its flows and groups."""
        parser, ofp = dp.ofproto_parser, dp.ofproto
        requests = [parser.OFPFlowDescStatsRequest(dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY,
                                                   ofp.OFPG_ANY, 0, 0, parser.OFPMatch()),
                    parser.OFPGroupDescStatsRequest(dp, 0, ofp.OFPG_ALL)]
        for req in requests:
            dp.set_xid(req)
        self.pending[name] = ReadBack(dp, ports, {req.xid for req in requests})
        for req in requests:
            dp.send_msg(req)

    def forget(self, name: str, dp) -> None:
        """A switch disconnected: its next connection reads its tables again."""
        back = self.pending.get(name)
        if back is not None and back.dp is dp:
            del self.pending[name]

    def reply(self, msg) -> bool:
        """A reply to a read-back request (taken in; True), or not one (False)."""
        switch = self.topo.switch_by_dpid(msg.datapath.id)
        back = self.pending.get(switch.name) if switch is not None else None
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
            elif part.entry is not None:  # a group (controllers.routing.ofmsgs.GroupDesc)
                back.groups[part.entry.group_id] = part.entry
            else:
                back.unreadable += 1
        if not msg.flags & msg.datapath.ofproto.OFPMPF_REPLY_MORE:
            back.waiting.discard(msg.xid)
        if not back.waiting:
            del self.pending[switch.name]
            self.done(switch.name, back)
        return True
