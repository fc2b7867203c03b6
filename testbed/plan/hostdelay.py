"""The hosts' delay relay, planned (pure): which packets each host's relay holds, and for how
long.

A kernel without netem cannot hold a packet on a link. With ``emulator.delay_line: hosts``
every IPv4 packet a host receives is turned, at its NIC's ingress, to a TUN device that one
relay process reads (:mod:`testbed.linux.tunrelay`); the relay gives it back to the host once
its path's one-way delay has passed, the links' delays summed along a shortest path from its
source (:meth:`testbed.model.spec.TestbedSpec.path_timing_s`). Any transport, kernel TCP
included, then meets the fabric's latency; the queues on the way served the packet at the
emulated rates first, as with the agents' delay line (:mod:`testbed.plan.delayline`).
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.model.spec import TestbedSpec

#: the relay's TUN devices: the kernel numbers them (``fldly0``, ``fldly1``, ...)
TUN_PATTERN = "fldly%d"


@dataclass(frozen=True)
class RelayPort:
    """One host's share of the relay.

    Args:
        host: the host (a GPU's NIC on a plane is a host of its own).
        owner: the host whose namespace the NIC is in (a plane's NIC's GPU; else ``host``).
        nic: its interface on the fabric (whose ingress turns packets to the relay).
        delays_s: each other host's IPv4 address -> how long a packet from it is held.
    """

    host: str
    owner: str
    nic: str
    delays_s: dict[str, float]

    def to_json(self) -> dict:
        return {"host": self.host, "owner": self.owner, "nic": self.nic,
                "delays_s": self.delays_s}

    @classmethod
    def from_json(cls, doc: dict) -> RelayPort:
        return cls(str(doc["host"]), str(doc["owner"]), str(doc["nic"]),
                   {str(k): float(v) for k, v in doc["delays_s"].items()})


def relay_ports(spec: TestbedSpec, hosts: list[str]) -> list[RelayPort]:
    """The relay's ports for ``hosts`` (those built here), each holding packets from every
    host of the fabric for the one-way delay of the path between them."""
    topo = spec.topology
    every = [h.name for h in topo.hosts]
    delays, _ = spec.path_timing_s(every)
    row = {h: i for i, h in enumerate(every)}
    ip = {h.name: h.ip for h in topo.hosts}
    out = []
    for host in hosts:
        j = row[host]
        out.append(RelayPort(host, topo.nic_owner(host), topo.host_link(host).a.ifname,
                             {ip[src]: round(delays[i][j], 9) for src, i in row.items()
                              if src != host and delays[i][j] > 0}))
    return out
