"""Topologies in other tools' files, in and out (pure: text in, text out). In: a containerlab
topology, networkx node-link JSON or GML, an HPCC (ns-3) topology file, each to the nodes and
links of ``fabric.topology: custom``. Out: the same formats from a fabric's topology, and a
Mininet topology module that ``mn --custom FILE --topo fabriclab`` loads.

What a host is: containerlab's kinds ``linux`` and ``host``; a networkx node whose ``kind``
(or ``type``) attribute says ``host``, else one of degree 1; HPCC's nodes not in its switch
list. Rates: a networkx link's ``rate_mbps`` (or ``bandwidth`` in bit/s), HPCC's
``100Gbps``-style rate and ``1us``-style delay.
"""

from __future__ import annotations

import json
import re

import networkx as nx
import yaml

from testbed.errors import ConfigError
from testbed.model.custom import NAME
from testbed.model.topology import Topology

FORMATS = ("containerlab", "networkx", "gml", "hpcc")
CLAB_HOST_KINDS = ("linux", "host")
_UNITS = {"g": 1e3, "m": 1.0, "k": 1e-3, "": 1e-6}  # bit/s prefixes -> Mbit/s
_TIME = {"s": 1e6, "ms": 1e3, "us": 1.0, "ns": 1e-3}


def read(fmt: str, text: str, where: str = "fabric.import") -> tuple[list[dict], list[dict]]:
    """The nodes and links of a custom fabric from ``text`` in ``fmt``.

    Raises:
        ConfigError: under ``where``, naming what the file got wrong.
    """
    try:
        if fmt == "containerlab":
            return _containerlab(yaml.safe_load(text))
        if fmt == "networkx":
            return _graph(nx.node_link_graph(json.loads(text), edges="links"
                                             if '"links"' in text else "edges"))
        if fmt == "gml":
            return _graph(nx.parse_gml(text, label="label"))
        if fmt == "hpcc":
            return _hpcc(text)
    except ConfigError as err:
        raise err.under(where) from None
    except (ValueError, KeyError, TypeError, AttributeError, nx.NetworkXError,
            yaml.YAMLError) as err:
        raise ConfigError(where, f"not a {fmt} topology: {type(err).__name__}: {err}") from None
    raise ConfigError(f"{where}.format", f"{fmt!r}: one of {', '.join(FORMATS)}")


def _name(raw: object) -> str:
    name = str(raw)
    if NAME.match(name):
        return name
    cleaned = re.sub(r"[^A-Za-z0-9_]", "_", name)
    cleaned = cleaned if cleaned[:1].isalpha() else f"n{cleaned}"
    if not NAME.match(cleaned):
        raise ConfigError("nodes", f"{name!r}: a node name of 10 characters at most (it "
                                   "names interfaces): rename it in the file")
    return cleaned


def _containerlab(doc: dict) -> tuple[list[dict], list[dict]]:
    topo = doc["topology"]
    nodes = [{"name": _name(n), "kind": "host" if (spec or {}).get("kind") in CLAB_HOST_KINDS
              else "switch"} for n, spec in topo["nodes"].items()]
    links = []
    for link in topo.get("links") or []:
        ends = link["endpoints"]
        names = [e["node"] if isinstance(e, dict) else str(e).split(":", 1)[0] for e in ends]
        links.append({"a": _name(names[0]), "b": _name(names[1])})
    return nodes, links


def _graph(graph: nx.Graph) -> tuple[list[dict], list[dict]]:
    nodes = []
    for n, attrs in graph.nodes(data=True):
        kind = str(attrs.get("kind") or attrs.get("type") or "").lower()
        host = kind == "host" if kind in ("host", "switch") else graph.degree(n) == 1
        nodes.append({"name": _name(attrs.get("name", n)), "kind": "host" if host else "switch"})
    names = {n: _name(attrs.get("name", n)) for n, attrs in graph.nodes(data=True)}
    links = []
    for a, b, attrs in graph.edges(data=True):
        link = {"a": names[a], "b": names[b]}
        rate = attrs.get("rate_mbps") or (attrs["bandwidth"] / 1e6 if "bandwidth" in attrs
                                          else None)
        if rate:
            link["rate_mbps"] = float(rate)
        if "delay_us" in attrs:
            link["delay_us"] = float(attrs["delay_us"])
        links.append(link)
    return nodes, links


def _quantity(text: str, units: dict[str, float], suffix: str) -> float:
    m = re.fullmatch(rf"([0-9.]+)([a-zA-Z]*?){suffix}", text.strip(), re.IGNORECASE)
    if not m or m.group(2).lower() not in units:
        raise ConfigError("links", f"{text!r}: not a quantity such as 100G{suffix}")
    return float(m.group(1)) * units[m.group(2).lower()]


def _hpcc(text: str) -> tuple[list[dict], list[dict]]:
    lines = [line.split() for line in text.splitlines() if line.strip()]
    count, switches, n_links = (int(v) for v in lines[0][:3])
    switch_ids = {int(v) for v in lines[1][:switches]}
    nodes = [{"name": f"n{i}", "kind": "switch" if i in switch_ids else "host"}
             for i in range(count)]
    links = []
    for fields in lines[2:2 + n_links]:
        link = {"a": f"n{int(fields[0])}", "b": f"n{int(fields[1])}",
                "rate_mbps": _quantity(fields[2], _UNITS, "bps")}
        if len(fields) > 3:
            link["delay_us"] = _quantity(fields[3], _TIME, "")
        links.append(link)
    return nodes, links


# -- out ---------------------------------------------------------------------------------------
def _ends(topo: Topology):
    for link in topo.links:
        yield link.a.node, link.b.node, link


def write(fmt: str, topo: Topology, delay_us: dict[str, float]) -> str:
    """``topo`` in ``fmt`` (:data:`FORMATS` or ``mininet``); ``delay_us``: each link tier's."""
    kinds = {n: ("host" if not node.is_switch else "switch") for n, node in topo.nodes.items()}
    if fmt == "containerlab":
        return yaml.safe_dump({"name": topo.kind, "topology": {
            "nodes": {n: {"kind": "linux", "image": "alpine:3"} if k == "host"
                      else {"kind": "ovs-bridge"} for n, k in kinds.items()},
            "links": [{"endpoints": [f"{a}:eth{l.a.port}", f"{b}:eth{l.b.port}"]}
                      for a, b, l in _ends(topo)]}}, sort_keys=False)
    graph = nx.Graph()
    for n, k in kinds.items():
        graph.add_node(n, kind=k)
    for a, b, link in _ends(topo):
        graph.add_edge(a, b, rate_mbps=link.rate_mbps, delay_us=delay_us.get(link.tier, 0.0))
    if fmt == "networkx":
        return json.dumps(nx.node_link_data(graph, edges="links"), indent=1) + "\n"
    if fmt == "gml":
        return "\n".join(nx.generate_gml(graph)) + "\n"
    if fmt == "hpcc":
        return _hpcc_text(topo, kinds, delay_us)
    if fmt == "mininet":
        return _mininet(topo, kinds, delay_us)
    raise ConfigError("--format", f"{fmt!r}: one of {', '.join((*FORMATS, 'mininet'))}")


def _hpcc_text(topo: Topology, kinds: dict[str, str], delay_us: dict[str, float]) -> str:
    order = [n for n, k in kinds.items() if k == "host"] + [n for n, k in kinds.items()
                                                             if k == "switch"]
    ids = {n: i for i, n in enumerate(order)}
    switches = [str(ids[n]) for n, k in kinds.items() if k == "switch"]
    lines = [f"{len(order)} {len(switches)} {len(topo.links)}", " ".join(switches)]
    for a, b, link in _ends(topo):
        lines.append(f"{ids[a]} {ids[b]} {link.rate_mbps:g}Mbps "
                     f"{delay_us.get(link.tier, 0.0):g}us 0")
    return "\n".join(lines) + "\n"


MININET = '''"""{kind} fabric exported by fabriclab: mn --custom THIS_FILE --topo fabriclab
(a fabric with loops needs STP or a controller: --switch lxbr,stp=1 --controller none, or OVS
with --controller remote at a routing controller). --test settled_pingall pings every pair
once the bridges' spanning tree has settled: a first round resolves the hosts' addresses (its
losses are printed, not counted), the second says whether every pair answered."""

from mininet.topo import Topo


class FabricTopo(Topo):
    def build(self):
{body}


def settled_pingall(net):
    net.waitConnected()
    net.pingAll(timeout=1)
    lost = net.pingAll(timeout=1)
    print("settled_pingall:", "every pair answered" if not lost else f"{{lost}}% lost")


topos = {{"fabriclab": FabricTopo}}
tests = {{"settled_pingall": settled_pingall}}
'''


def _mininet(topo: Topology, kinds: dict[str, str], delay_us: dict[str, float]) -> str:
    body = []
    for n, k in kinds.items():
        node = topo.nodes[n]
        if k == "host":
            body.append(f"        self.addHost({n!r}, ip={node.ip + '/8'!r}, mac={node.mac!r})")
        else:
            body.append(f"        self.addSwitch({n!r}, dpid={f'{node.dpid:016x}'!r})")
    for a, b, link in _ends(topo):
        delay = delay_us.get(link.tier, 0.0)
        extra = f", delay={f'{delay:g}us'!r}" if delay else ""
        body.append(f"        self.addLink({a!r}, {b!r}, port1={link.a.port}, "
                    f"port2={link.b.port}, bw={link.rate_mbps:g}{extra})")
    return MININET.format(kind=topo.kind, body="\n".join(body))
