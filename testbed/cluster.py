"""A Ray cluster as fabriclab's machines, the adapter: one long-lived actor per machine, pinned
to it, does that machine's part (issue 16). So far: connecting (a Ray version mismatch is one
clear error), finding the machines (Ray nodes alive, their underlay addresses and resources),
probing each (the project installed there, its kernel, the MTU of its underlay interface),
and making or removing a machine's ends of the cut links (:func:`testbed.partition.cut_links`).

A machine is a Ray node; its name is the first custom resource the node was started with
(``ray start --resources '{"machine2": 1}'``), else its underlay address.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass

from testbed.errors import TestbedError
from testbed.partition import CutLink


@dataclass(frozen=True)
class MachineInfo:
    """What a machine's actor found there."""

    name: str
    underlay: str  # the Ray node's address
    underlay_mtu: int  # of the interface that holds it
    fabriclab: str  # the project's version there
    kernel: str
    cores: int


class MachineAgent:
    """The actor on one machine (``ray.remote`` applied by :class:`Cluster`)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.tunnels: list[str] = []  # VXLAN devices made here

    def probe(self) -> dict:
        import ray

        from testbed.environment import software_versions
        from testbed.netlink import Netlink

        ip = ray.util.get_node_ip_address()
        nl = Netlink()
        try:
            mtu = nl.mtu_of_address(ip)
        finally:
            nl.close()
        return {"name": self.name, "underlay": ip, "underlay_mtu": mtu,
                "fabriclab": software_versions()["fabriclab"], "kernel": platform.release(),
                "cores": os.cpu_count()}

    def make_tunnels(self, ends: list[tuple[str, int, str, str]], mtu: int) -> list[str]:
        """Create VXLAN devices ``(name, vni, local, remote)``, up; all or none."""
        from testbed.netlink import Netlink

        nl = Netlink()
        made: list[str] = []
        try:
            for name, vni, local, remote in ends:
                nl.create_vxlan(name, vni, local, remote, mtu)
                made.append(name)
                nl.set_state(name, True)
        except Exception:
            for name in made:
                nl.delete(name)
            raise
        finally:
            nl.close()
        self.tunnels += made
        return made

    def remove_tunnels(self) -> int:
        from testbed.netlink import Netlink

        nl = Netlink()
        try:
            removed = sum(1 for name in self.tunnels if nl.delete(name))
        finally:
            nl.close()
        self.tunnels = []
        return removed


class Cluster:
    """The machines of a Ray cluster at ``address`` (``host:port`` of its head), an actor on
    each; :meth:`close` ends the actors and disconnects.

    Raises:
        TestbedError: Ray not installed, the cluster unreachable, a Ray version mismatch, or a
            machine whose actor cannot start (the project not installed there).
    """

    def __init__(self, address: str, timeout_s: float = 60.0) -> None:
        try:
            import ray
        except ImportError as err:
            raise TestbedError("a cluster needs Ray: pip install 'ray>=2.50,<3' "
                               "(scripts/setup.sh does)") from err
        self.ray = ray
        try:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        except Exception as err:  # noqa: BLE001 - Ray's own errors, one message each
            text = str(err)
            if "version" in text.lower() and "mismatch" in text.lower():
                raise TestbedError(f"Ray version mismatch with the cluster at {address}: "
                                   f"this machine runs Ray {ray.__version__}",
                                   "", text[-1500:]) from None
            raise TestbedError(f"cannot join the Ray cluster at {address}", "",
                               text[-1500:]) from None
        self.agents: dict[str, object] = {}
        remote = ray.remote(num_cpus=0)(MachineAgent)
        for node in ray.nodes():
            if not node.get("Alive"):
                continue
            name = _machine_name(node)
            self.agents[name] = remote.options(
                scheduling_strategy=_on_node(node["NodeID"])).remote(name)
        try:
            self.machines = {info["name"]: MachineInfo(**info) for info in ray.get(
                [a.probe.remote() for a in self.agents.values()], timeout=timeout_s)}
        except Exception as err:  # noqa: BLE001 - an actor that cannot start or answer
            self.close()
            raise TestbedError("a machine of the cluster did not answer (is fabriclab "
                               "installed there, in the same place?)", "",
                               str(err)[-1500:]) from None

    def make_tunnels(self, tunnels: list[CutLink], fabric_mtu: int) -> dict[str, list[str]]:
        """Every machine's ends of ``tunnels``; on any failure those made are removed."""
        calls = {}
        for name, agent in self.agents.items():
            ends = []
            for t in tunnels:
                if name in (t.a_machine, t.b_machine):
                    ifname, local, remote = t.end(name)
                    ends.append((ifname, t.vni, local, remote))
            if ends:
                calls[name] = agent.make_tunnels.remote(ends, fabric_mtu)
        try:
            return dict(zip(calls, self.ray.get(list(calls.values()))))
        except Exception as err:  # noqa: BLE001
            self.remove_tunnels()
            raise TestbedError("making the cut links' VXLAN ends failed", "",
                               str(err)[-1500:]) from None

    def remove_tunnels(self) -> int:
        return sum(self.ray.get([a.remove_tunnels.remote() for a in self.agents.values()]))

    def close(self) -> None:
        for agent in self.agents.values():
            self.ray.kill(agent)
        self.agents = {}
        self.ray.shutdown()


def _machine_name(node: dict) -> str:
    """A node's first custom resource (``machine2``), else its address."""
    custom = sorted(r for r in node.get("Resources", {})
                    if r not in ("CPU", "GPU", "memory", "object_store_memory")
                    and not r.startswith(("node:", "accelerator_type:")))
    return custom[0] if custom else node["NodeManagerAddress"]


def _on_node(node_id: str):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id, soft=False)
