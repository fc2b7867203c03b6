"""Where a flow really goes, hop by hop from source to destination, following the switches' own
tables (ECMP bucket choices included): ``ofproto/trace`` at every Open vSwitch switch; on eBPF
switches, the tables their agent installed, looked up as the datapath does
(:func:`testbed.plan.tss.lookup`, :func:`testbed.plan.groups.apply_group`, with the ports'
liveness)."""

from __future__ import annotations

from testbed.errors import TestbedError
from testbed.linux import ovs
from testbed.plan import groups


def _ebpf_output(fabric, switch: str, in_port: int, packet: dict) -> list[int]:
    """The ports an eBPF switch sends ``packet`` out of, by the tables its agent installed."""
    conn = fabric.switches.agent.conns.get(switch)
    if conn is None:
        raise TestbedError(f"{switch}: not connected to the controller")
    session = conn.session
    port = groups.forward(session.flows.values(), session.groups,
                          lambda n: session.ports[n].live, {**packet, "in_port": in_port})
    return [] if port is None else [port]


def flow_path(fabric, src: str, dst: str, proto: str, sport: int, dport: int) -> list[str]:
    """The switches a flow's packets cross, as the switches' own tables decide it
    (``ofproto/trace`` at every hop: ECMP bucket choices included).

    Args:
        fabric: a running fabric.
        src: source host.
        dst: destination host.
        proto: ``tcp`` or ``udp``.
        sport: source port.
        dport: destination port.

    Returns:
        The node path, hosts included.
    """
    ctl = fabric.spec.controller
    if getattr(getattr(fabric, "switches", None), "agent", None) is None and (
            ctl.ecmp_selection == "dp_hash" or ctl.routing == "spray"):
        raise TestbedError("ofproto/trace cannot follow a dp_hash group past its recirculation "
                           "(the datapath computes the hash): trace with "
                           "controller.routing: ecmp, ecmp_selection: hash")
    topo = fabric.topo
    end = topo.attachment(src)
    path = [src]
    # per-protocol port fields: ofproto/trace refuses tp_src with udp ("prerequisites not met")
    flow = (f"{proto},nw_src={topo.nodes[src].ip},nw_dst={topo.nodes[dst].ip},"
            f"{proto}_src={sport},{proto}_dst={dport}")
    packet = {"eth_type": 0x0800, "ipv4_src": topo.nodes[src].ip,
              "ipv4_dst": topo.nodes[dst].ip, "ip_proto": {"tcp": 6, "udp": 17}[proto],
              f"{proto}_src": sport, f"{proto}_dst": dport}
    for _ in range(len(topo.nodes)):
        switch, in_port = end.node, end.port
        path.append(switch)
        if fabric.switches.agent is not None:
            outputs, report = _ebpf_output(fabric, switch, in_port, packet), ""
        else:
            inst = fabric.switches.switch_instance.get(switch)
            report = ovs.appctl("ofproto/trace", switch, f"in_port={in_port},{flow}",
                                target=inst.ctl("ovs-vswitchd") if inst else None)
            outputs = ovs.trace_outputs(report)
        if len(outputs) != 1:
            raise TestbedError(f"{switch}: trace of {flow} gave outputs {outputs}", report)
        link = topo.link_at(switch, outputs[0])
        end = link.other(switch)
        if end.node == dst:
            return path + [dst]
        if not topo.nodes[end.node].is_switch:
            raise TestbedError(f"{flow} leaves {switch} towards {end.node}, not {dst}")
    raise TestbedError(f"{flow} loops: {' '.join(path[:20])}")
