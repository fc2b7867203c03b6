"""Shortest-path IPv4 routing as an os-ken app (the Ryu API): a controller of your own on a
fabriclab fabric.

    controller: {app: ../examples/shortest_path.py}   # in an experiment file

The fabric comes from its topology file (the path in ``FABRICLAB_TOPOLOGY``): switches with
their datapath ids, hosts with their addresses, links with port numbers. fabriclab gives every
host a static neighbour table, so no ARP crosses the fabric: each switch gets one flow per
host, ``ipv4_dst -> output`` on a shortest path, as soon as it connects. OpenFlow 1.3 or 1.5,
so it runs on every datapath. ``shortest_path_lldp.py`` finds the links by LLDP instead.
"""

import json
import os

import networkx as nx
from os_ken.base import app_manager
from os_ken.controller import ofp_event
from os_ken.controller.handler import CONFIG_DISPATCHER, set_ev_cls
from os_ken.ofproto import ofproto_v1_3, ofproto_v1_5


class ShortestPath(app_manager.OSKenApp):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION, ofproto_v1_5.OFP_VERSION]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        with open(os.environ["FABRICLAB_TOPOLOGY"], encoding="utf-8") as fh:
            topo = json.load(fh)
        dpid = {n["name"]: n["dpid"] for n in topo["nodes"] if n.get("dpid")}
        ip = {n["name"]: n["ip"] for n in topo["nodes"] if n.get("ip")}
        self.hosts = {}  # host address -> (its switch's dpid, the switch's port to it)
        self.graph = nx.DiGraph()  # dpid -> dpid, with the port that leads there
        for link in topo["links"]:
            for near, far in ((link["a"], link["b"]), (link["b"], link["a"])):
                if near["node"] in ip and far["node"] in dpid:
                    self.hosts[ip[near["node"]]] = (dpid[far["node"]], far["port"])
                elif near["node"] in dpid and far["node"] in dpid:
                    self.graph.add_edge(dpid[near["node"]], dpid[far["node"]], port=near["port"])
        self.datapaths = {}
        self.installed = {}  # dpid -> {address: port}

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def switch_features(self, ev):
        datapath = ev.msg.datapath
        self.datapaths[datapath.id] = datapath
        self.installed[datapath.id] = {}
        self.route(datapath)

    def route(self, datapath):
        """Install what changed of ``datapath``'s routes to every host."""
        for address, (edge, port) in self.hosts.items():
            if datapath.id != edge:
                try:
                    path = nx.shortest_path(self.graph, datapath.id, edge)
                except (nx.NetworkXNoPath, nx.NodeNotFound):
                    continue  # no way there (yet)
                port = self.graph.edges[path[0], path[1]]["port"]
            if self.installed[datapath.id].get(address) != port:
                ofp, parser = datapath.ofproto, datapath.ofproto_parser
                actions = [parser.OFPActionOutput(port)]
                datapath.send_msg(parser.OFPFlowMod(
                    datapath=datapath, priority=100,
                    match=parser.OFPMatch(eth_type=0x0800, ipv4_dst=address),
                    instructions=[parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS,
                                                               actions)]))
                self.installed[datapath.id][address] = port
