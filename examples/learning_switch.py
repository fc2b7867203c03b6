"""A learning switch as an os-ken app (the Ryu API) speaking OpenFlow 1.3: the first app of
most Ryu tutorials, on a fabriclab fabric.

    controller: {app: ../examples/learning_switch.py}   # in an experiment file

Every switch sends the controller what no flow matches (a table-miss flow). From each such
frame the app learns behind which port of that switch the frame's source address is; it sends
the frame on to the port of its destination if known, else floods it (every port but the one
it came in on), and once both ends are known it installs a flow for the pair (in port,
destination and source address), so the rest of their frames stay in the switch. Floods
circle forever in a fabric with loops: run it on a loop-free one (a leaf-spine of one spine,
a tree). It needs nothing from fabriclab (no topology file), and runs on both datapaths.
"""

from os_ken.base import app_manager
from os_ken.controller import ofp_event
from os_ken.controller.handler import CONFIG_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from os_ken.lib.packet import ethernet, ether_types, packet
from os_ken.ofproto import ofproto_v1_3

#: a learned pair's flow outranks the table-miss flow (priority 0)
LEARNED_PRIORITY = 1


class LearningSwitch(app_manager.OSKenApp):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ports = {}  # datapath id -> {MAC address: the port it is behind}

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def switch_features(self, ev):
        """A switch connected: what no flow matches comes to the controller, whole."""
        datapath = ev.msg.datapath
        ofp, parser = datapath.ofproto, datapath.ofproto_parser
        self.ports[datapath.id] = {}
        to_controller = parser.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER)
        self._add_flow(datapath, 0, parser.OFPMatch(), [to_controller])

    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    def packet_in(self, ev):
        msg = ev.msg
        datapath = msg.datapath
        ofp, parser = datapath.ofproto, datapath.ofproto_parser
        in_port = msg.match["in_port"]
        eth = packet.Packet(msg.data).get_protocol(ethernet.ethernet)
        if eth is None or eth.ethertype == ether_types.ETH_TYPE_LLDP:
            return  # not a frame to forward (a link-layer discovery probe)
        known = self.ports.setdefault(datapath.id, {})
        known[eth.src] = in_port
        out_port = known.get(eth.dst, ofp.OFPP_FLOOD)
        actions = [parser.OFPActionOutput(out_port)]
        if out_port != ofp.OFPP_FLOOD:
            match = parser.OFPMatch(in_port=in_port, eth_dst=eth.dst, eth_src=eth.src)
            self._add_flow(datapath, LEARNED_PRIORITY, match, actions)
        datapath.send_msg(parser.OFPPacketOut(
            datapath=datapath, buffer_id=msg.buffer_id, in_port=in_port, actions=actions,
            data=msg.data if msg.buffer_id == ofp.OFP_NO_BUFFER else None))

    @staticmethod
    def _add_flow(datapath, priority, match, actions):
        ofp, parser = datapath.ofproto, datapath.ofproto_parser
        datapath.send_msg(parser.OFPFlowMod(
            datapath=datapath, priority=priority, match=match,
            instructions=[parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions)]))
