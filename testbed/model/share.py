"""What of a fabric is built on this machine (pure): the whole fabric, or a cluster machine's
part (:class:`testbed.model.partition.MachinePart`), and the names that follow from it: its
nodes, switches, links with an end here, and the root-namespace interfaces of its switch
ports."""

from __future__ import annotations

from collections.abc import Iterator

from testbed.model.partition import MachinePart
from testbed.model.topology import Link, Node, Topology


class LocalShare:
    """This machine's share of ``topo``: all of it (``part`` None) or ``part``."""

    def __init__(self, topo: Topology, part: MachinePart | None = None) -> None:
        self.topo = topo
        self.part = part

    @property
    def builds(self) -> bool:
        """Whether anything is built here (a cluster's coordinator builds no node)."""
        return self.part is None or bool(self.part.nodes)

    @property
    def tunnels(self) -> tuple:
        """The cut links' ends here (VXLAN devices; none on one machine)."""
        return self.part.tunnels if self.part is not None else ()

    def here(self, node: str) -> bool:
        """Whether ``node`` is built on this machine."""
        return self.part is None or node in self.part.nodes

    def switches(self) -> Iterator[Node]:
        """The OpenFlow switches built here."""
        return (sw for sw in self.topo.switches if self.here(sw.name))

    def links(self) -> list[Link]:
        """The links built here as veths (both ends here)."""
        return list(self.topo.links) if self.part is None else list(self.part.links)

    def local_links(self) -> list[Link]:
        """The fabric links with an end here: on a cluster, its part's and the cut ones."""
        if self.part is None:
            return list(self.topo.links)
        return [*self.part.links, *(cut.link for cut, _ in self.part.tunnels)]

    def root_ends(self, link: Link) -> list[str]:
        """A link's switch-port interfaces here (in the root namespace)."""
        return [e.ifname for e in (link.a, link.b)
                if self.topo.nodes[e.node].is_switch and self.here(e.node)]

    def port_names(self) -> set[str]:
        """Every switch port's interface here."""
        return {n for link in self.local_links() for n in self.root_ends(link)}

    def bridges(self) -> list[str]:
        """The servers' scale-up switches (Linux bridges) here."""
        return [s.switch for s in self.topo.servers if s.switch and self.here(s.switch)]

    def switch_ports(self) -> set[str]:
        """The root-namespace interface of every switch port here (a server's scale-up
        switch's too)."""
        bridges = set(self.bridges())
        return self.port_names() | {e.ifname for l in self.topo.scale_up for e in (l.a, l.b)
                                    if e.node in bridges}
