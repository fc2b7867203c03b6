"""``shortest_path.py`` with the switch-to-switch links found by os-ken's LLDP discovery
(``os_ken.topology``, as ``ryu-manager --observe-links``) instead of the topology file: a
link's arrival or loss re-routes every switch, at most twice a second. The hosts still come
from the topology file (LLDP finds switches, not hosts that never send).

os-ken's discovery speaks OpenFlow 1.0 to 1.4, so this app speaks 1.3, which both datapaths'
switches speak (Open vSwitch's bridges and the eBPF switches).
"""

import os
import sys

from os_ken.lib import hub
from os_ken.ofproto import ofproto_v1_3
from os_ken.controller.handler import set_ev_cls
from os_ken.topology import event as topology_event

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shortest_path import ShortestPath  # noqa: E402 - the example beside this one


class ShortestPathLldp(ShortestPath):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]
    _REQUIRED_APP = ["os_ken.topology.switches"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.graph.clear()  # links: as LLDP finds them
        self.dirty = False
        hub.spawn(self.reroute_loop)

    @set_ev_cls([topology_event.EventLinkAdd, topology_event.EventLinkDelete])
    def link_changed(self, ev):
        src, dst = ev.link.src, ev.link.dst
        if isinstance(ev, topology_event.EventLinkAdd):
            self.graph.add_edge(src.dpid, dst.dpid, port=src.port_no)
        elif self.graph.has_edge(src.dpid, dst.dpid):
            self.graph.remove_edge(src.dpid, dst.dpid)
        self.dirty = True

    def reroute_loop(self):
        while True:
            hub.sleep(0.5)
            if self.dirty:
                self.dirty = False
                for datapath in list(self.datapaths.values()):
                    self.route(datapath)
