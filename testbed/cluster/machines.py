"""A Ray cluster as fabriclab's machines, the adapter: one long-lived actor per machine, pinned
to it, does that machine's part: connecting (a Ray version mismatch is one clear
error), finding the machines (Ray nodes alive, their underlay addresses and resources), probing
each (the project loads there, its revision, kernel, cores, the MTU of its underlay interface;
a machine where it does not is named), then on each machine its part of a fabric and the
processes of a run in it.

A machine is a Ray node; its name is the first custom resource the node was started with
(``ray start --resources '{"machine2": 1}'``), else its underlay address.
"""

from __future__ import annotations

import os
import platform
import re
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from testbed.cluster.agent import MachineAgent
from testbed.errors import ConfigError, TestbedError


@dataclass(frozen=True)
class MachineInfo:
    """What a machine's actor found there."""

    name: str
    underlay: str  # the Ray node's address
    underlay_mtu: int  # of the interface that holds it
    fabriclab: str  # the project's version there
    kernel: str
    cores: int
    revision: str = "unknown"  # the project's git revision there


#: how to install what a cluster needs into the project's venv
CLUSTER_EXTRA = ".venv/bin/pip install -e '.[cluster]' (or: pip install 'fabriclab[cluster]')"
#: calls an actor serves at once (every agent of a job waits in one)
AGENT_CONCURRENCY = 256
#: the longest a call to a machine may take beyond its own timeout before it counts as lost
CALL_GRACE_S = 60.0
#: the Ray namespace of fabriclab's named actors (another driver finds a fabric's by name)
NAMESPACE = "fabriclab"
#: join a cluster without Ray's token authentication (``fabriclab --insecure-cluster``): its
#: actors run as root what they are sent, so whoever reaches the cluster is root everywhere
INSECURE_ALLOWED = False


def check_authentication(address: str) -> list[str]:
    """Refuse a cluster joined without Ray's token authentication, unless the user allowed
    it (:data:`INSECURE_ALLOWED`); returns the warning to show then.

    Raises:
        TestbedError: ``RAY_AUTH_MODE`` is not ``token`` and nothing allowed it.
    """
    if os.environ.get("RAY_AUTH_MODE") == "token":
        return []
    if not INSECURE_ALLOWED:
        raise TestbedError(
            f"the Ray cluster at {address} would be joined without authentication "
            "(RAY_AUTH_MODE is not 'token'): whoever reaches it could call the machines' "
            "actors, which run as root and build fabrics. Start every Ray node and fabriclab "
            "with RAY_AUTH_MODE=token and one token (docs/cluster.md), or give "
            "'fabriclab --insecure-cluster' to join it anyway")
    return [f"the Ray cluster at {address} is joined without authentication "
            "(--insecure-cluster): whoever reaches it can call the machines' actors, which "
            "run as root and build fabrics"]


class MachineHandle:
    """One machine's actor as typed calls: each method runs the :class:`MachineAgent` method
    of the same name there and returns what it returned (its errors raised here as they were
    raised there; a machine that died or does not answer is one TestbedError naming it).

    Args:
        cluster: the cluster the actor belongs to.
        name: the machine.
    """

    def __init__(self, cluster: Cluster, name: str) -> None:
        self.cluster = cluster
        self.name = name

    def _call(self, method: Callable, *args, timeout_s: float = CALL_GRACE_S):
        return self.cluster.call(self.name, method.__name__, *args, timeout_s=timeout_s)

    def build(self, spec: dict, part: dict, controller_at: tuple[str, int],
              controller_pki: dict[str, str] | None, timeout_s: float) -> dict:
        """This machine's part, sent as data (:meth:`MachineAgent.build`)."""
        return self._call(MachineAgent.build, spec, part, list(controller_at), controller_pki,
                          timeout_s=timeout_s)

    def run_cell(self, doc: dict, source: str, name: str) -> dict:
        """A whole experiment on this machine, sent as its document (the cluster's actors
        are ``fabriclab.cellagent.CellAgent``s; no timeout: a cell runs as long as it
        runs)."""
        agent = self.cluster.agents[self.name]
        return self.cluster.ray.get(agent.run_cell.remote(doc, source, name))

    def settle(self) -> None:
        self._call(MachineAgent.settle)

    def teardown(self) -> dict:
        return self._call(MachineAgent.teardown)

    def spawn(self, host: str, argv: list[str], role: str) -> int:
        return self._call(MachineAgent.spawn, host, argv, role)

    def communicate(self, pid: int, timeout_s: float):
        return self._call(MachineAgent.communicate, pid, timeout_s,
                          timeout_s=timeout_s + CALL_GRACE_S)

    def poll(self, pid: int) -> int | None:
        return self._call(MachineAgent.poll, pid)

    def stop(self, pid: int, timeout_s: float = 5.0) -> int | None:
        return self._call(MachineAgent.stop, pid, timeout_s, timeout_s=timeout_s + CALL_GRACE_S)

    def run_parallel(self, commands: dict[str, list[str]], timeout_s: float) -> dict:
        return self._call(MachineAgent.run_parallel, commands, timeout_s,
                          timeout_s=timeout_s + CALL_GRACE_S)

    def write_file(self, name: str, text: str) -> None:
        self._call(MachineAgent.write_file, name, text)

    def read_file(self, name: str) -> str:
        return self._call(MachineAgent.read_file, name)

    def state(self) -> dict:
        return self._call(MachineAgent.state)

    def congestion(self) -> dict:
        return self._call(MachineAgent.congestion)

    def link_counters(self, names: set[str]) -> dict:
        return self._call(MachineAgent.link_counters, names)

    def cpu_times(self) -> dict[str, dict]:
        return self._call(MachineAgent.cpu_times)

    def set_links(self, pairs: list[tuple[str, str]], up: bool) -> dict[str, float]:
        return self._call(MachineAgent.set_links, pairs, up)

    def cut_drops(self, pairs: list[tuple[str, str]]) -> int | None:
        return self._call(MachineAgent.cut_drops, pairs)

    def set_rates(self, pairs: list[tuple[str, str]], factor: float) -> dict[str, float]:
        return self._call(MachineAgent.set_rates, pairs, factor)

    def offered_bytes(self, names: set[str]) -> dict[str, int] | None:
        return self._call(MachineAgent.offered_bytes, names)

    def switch_notices(self) -> list[tuple[float, str, int, tuple[int, ...]]]:
        return self._call(MachineAgent.switch_notices)

    def largest_packets(self, names: set[str]) -> dict[str, int]:
        return self._call(MachineAgent.largest_packets, names)

    def start_monitor(self, queue_interval_s: float) -> None:
        self._call(MachineAgent.start_monitor, queue_interval_s)

    def monitor_read(self, what: str) -> dict:
        return self._call(MachineAgent.monitor_read, what)

    def stop_monitor(self) -> None:
        self._call(MachineAgent.stop_monitor)


class Cluster:
    """The machines of a Ray cluster at ``address`` (``host:port`` of its head), an actor on
    each, named (``names``: machine -> actor name, in Ray's namespace :data:`NAMESPACE`) so
    that another process can reach them; :meth:`close` ends the actors and disconnects.

    With ``attach`` (``names`` of a running fabric's actors, from its ``cluster.json``), the
    actors are those of that fabric, found by name: nothing is started, probed or ended.
    ``agent``: the actors' class (a :class:`MachineAgent`; the experiment layer's runs whole
    cells too).

    Raises:
        TestbedError: Ray not installed, the cluster unreachable, a Ray version mismatch, a
            machine whose actor cannot start (the project not installed there), or an
            attached actor gone.
    """

    def __init__(self, address: str, timeout_s: float = 60.0,
                 attach: dict[str, str] | None = None, agent: type = MachineAgent) -> None:
        self.owned = attach is None
        self.agents: dict[str, object] = {}
        self.names: dict[str, str] = {}
        self.machines: dict[str, MachineInfo] = {}
        try:
            import ray
        except ImportError as err:
            raise TestbedError("a cluster needs Ray, fabriclab's 'cluster' extra: "
                               + CLUSTER_EXTRA) from err
        self.ray = ray
        self.warnings: list[str] = check_authentication(address)
        _reach_head(address)
        try:
            with _python_signal_handlers():
                ray.init(address=address, namespace=NAMESPACE, logging_level="ERROR",
                         log_to_driver=False)
        except Exception as err:  # noqa: BLE001 - Ray's own errors, one message each
            text = str(err)
            if "version" in text.lower() and "mismatch" in text.lower():
                theirs = cluster_versions(text)
                raise TestbedError(
                    f"Ray version mismatch with the cluster at {address}: it runs "
                    f"{theirs or 'another version'}, this machine Ray {ray.__version__} "
                    f"(Python {platform.python_version()}): install the cluster's Ray here, "
                    "or start the cluster with this one", "", text[-1500:]) from None
            raise TestbedError(f"cannot join the Ray cluster at {address}", "",
                               text[-1500:]) from None
        if attach is not None:
            self._attach(attach)
            return
        remote = ray.remote(num_cpus=0, max_concurrency=AGENT_CONCURRENCY)(agent)
        token = os.urandom(4).hex()
        for node in ray.nodes():
            if not node.get("Alive"):
                continue
            name = _machine_name(node)
            self.names[name] = f"fabriclab-{token}-{name}"
            self.agents[name] = remote.options(
                name=self.names[name], scheduling_strategy=_on_node(node["NodeID"])).remote(name)
        probes = {name: agent.probe.remote() for name, agent in self.agents.items()}
        failed: list[str] = []
        deadline = time.monotonic() + timeout_s
        for name, ref in probes.items():
            try:
                info = ray.get(ref, timeout=max(0.1, deadline - time.monotonic()))
                self.machines[name] = MachineInfo(**info)
            except ray.exceptions.GetTimeoutError:
                failed.append(f"{name}: did not answer within {timeout_s:.0f} s")
            except Exception as err:  # noqa: BLE001 - an actor that cannot start there
                failed.append(f"{name}: {root_cause(str(err))}")
        if failed:
            self.close()
            where = Path(__file__).resolve().parents[2]
            raise TestbedError(
                f"{len(failed)} of the cluster's {len(probes)} machines cannot run "
                "fabriclab's actor:\n  " + "\n  ".join(failed) + "\n(install the project on "
                f"every machine at the same path as here, {where}, with the same Python and "
                "Ray; nothing was built on any machine)")

    def _attach(self, names: dict[str, str]) -> None:
        gone = []
        for machine, name in sorted(names.items()):
            try:
                self.agents[machine] = self.ray.get_actor(name, namespace=NAMESPACE)
            except ValueError:  # Ray's "Failed to look up actor with name ..."
                gone.append(machine)
        self.names = dict(names)
        if gone:
            self.close()
            raise TestbedError(f"the running fabric's actors on {', '.join(gone)} are gone "
                               "(the 'fabriclab up' that built it has ended, or those machines "
                               "left the cluster)")

    def machine(self, name: str) -> MachineHandle:
        """The typed calls to ``name``'s actor."""
        if name not in self.agents:
            raise TestbedError(f"the cluster has no machine {name} "
                               f"(it has {', '.join(sorted(self.agents)) or 'none'})")
        return MachineHandle(self, name)

    def call(self, machine: str, method: str, *args, timeout_s: float = CALL_GRACE_S):
        """``method(*args)`` of ``machine``'s actor, by name (:class:`MachineHandle` calls
        it; nothing else should). Its errors come back as they were raised
        there; a machine that died or does not answer is one TestbedError naming it."""
        ray = self.ray
        try:
            return ray.get(getattr(self.agents[machine], method).remote(*args),
                           timeout=timeout_s)
        except ray.exceptions.RayTaskError as err:  # raised in the actor: the error itself
            cause = err.as_instanceof_cause()
            if isinstance(cause, (TestbedError, ConfigError)):
                raise cause from None
            raise TestbedError(f"{machine}: {method} failed", "", str(err)[-1500:]) from None
        except ray.exceptions.GetTimeoutError:
            raise TestbedError(f"machine {machine} did not answer {method} within "
                               f"{timeout_s:.0f} s") from None
        except ray.exceptions.RayError as err:  # the actor or its node died
            raise TestbedError(f"machine {machine} is gone ({type(err).__name__}): its part "
                               "of the fabric is lost; what it built is removed by 'fabriclab "
                               "clean' there or its next run", "", str(err)[-800:]) from None

    def close(self) -> None:
        """End the actors (those this object started) and disconnect."""
        if self.owned:
            for agent in self.agents.values():
                self.ray.kill(agent)
        self.agents = {}
        self.ray.shutdown()


#: how long the head's port may take to accept a connection before it counts as unreachable
HEAD_CONNECT_S = 5.0


def _reach_head(address: str) -> None:
    """A TCP connection to the head's GCS port, at once: an unreachable head is said in
    seconds (Ray itself retries for about 20 s, then gives a generic error)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=HEAD_CONNECT_S):
            pass
    except (OSError, ValueError) as err:
        why = "no answer within %.0f s" % HEAD_CONNECT_S if isinstance(err, TimeoutError) \
            else (getattr(err, "strerror", None) or str(err))
        raise TestbedError(f"cannot reach the Ray cluster's head at {address}: {why} (is "
                           "'ray start --head' running there, its port open from here?)") \
            from None


def root_cause(text: str) -> str:
    """The last ``SomeError: message`` line of a Ray error's text (colour codes removed),
    else its last line: what went wrong on the machine, without Ray's framing."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in text.splitlines()]
    causes = [line for line in lines
              if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit): ", line)]
    rest = [line for line in lines if line]
    return (causes or rest or ["no detail"])[-1][:300]


def cluster_versions(text: str) -> str:
    """``Ray 2.60.0 (Python 3.11.2)`` from Ray's "Version mismatch: The cluster was started
    with: Ray: ... Python: ..." text, else empty."""
    block = text.split("started with:", 1)[-1] if "started with:" in text else ""
    ray = re.search(r"Ray:\s*(\S+)", block)
    py = re.search(r"Python:\s*(\S+)", block)
    if not ray:
        return ""
    return f"Ray {ray.group(1)}" + (f" (Python {py.group(1)})" if py else "")


@contextmanager
def _python_signal_handlers() -> Iterator[None]:
    """Ray's core worker installs its own SIGTERM handler (it logs and ends the process at
    once): put Python's back, so that SIGTERM unwinds through the fabric's teardown as on one
    machine (``fabriclab up`` ended by SIGTERM tears its cluster fabric down)."""
    main = threading.current_thread() is threading.main_thread()
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)} \
        if main else {}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)


def _machine_name(node: dict) -> str:
    """A node's first custom resource (``machine2``), else its address."""
    custom = sorted(r for r in node.get("Resources", {})
                    if r not in ("CPU", "GPU", "memory", "object_store_memory")
                    and not r.startswith(("node:", "accelerator_type:")))
    return custom[0] if custom else node["NodeManagerAddress"]


def _on_node(node_id: str):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id, soft=False)
