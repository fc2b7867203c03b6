"""A fabric partitioned over the machines of a Ray cluster, the coordinator's side.

:class:`ClusterFabric` offers what a run uses of :class:`testbed.fabric.fabric.Fabric` (the runner,
the run monitor, the exporters, the results), so ``fabriclab up --check`` and ``fabriclab run``
work unchanged on a cluster. Its build:

1. the machines of the cluster (:class:`testbed.cluster.machines.Cluster`: an actor pinned to each,
   probed), each weighed by its budget (:func:`testbed.plan.fidelity.machine_budget_mbit_hops`);
2. the plan (:func:`testbed.model.partition.partition`), each machine's share of the full load
   against its budget (strict fidelity refuses a machine past its saturation point), the cut
   links as VXLAN tunnels (:func:`testbed.model.partition.cut_links`: the underlay MTU checked);
3. the controller here, on the coordinator's underlay address (the same
   :class:`~testbed.fabric.controller.Controller` part a :class:`Fabric` has, in a run of its
   own: its run record tracks the controller);
4. every machine's part, at once, by its actor (:meth:`testbed.cluster.agent.MachineAgent.build`:
   the same Fabric code, its switches connecting to the controller here);
5. the controller has programmed every switch and probed every link (the cut ones too),
   then the machines put back the sysctls raised for the build.

Teardown takes every part down (a machine whose actor died is named; its leftovers are
removed by ``fabriclab clean`` there or by the next build there), then the controller.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from testbed.cluster.machines import CALL_GRACE_S, Cluster, MachineHandle
from testbed.cluster.remote import (CLUSTER_FILE, ClusterMonitor, RemoteProcess,
                                    local_address_towards, on_each, set_links_on_machines)
from testbed.linux import capabilities
from testbed.linux.environment import software_versions
from testbed.errors import ConfigError, TestbedError
from testbed.fabric.controller import Controller
from testbed.fabric.machine import resolve_datapath
from testbed.fabric.services import FabricRun
from testbed.linux.cpu import machine_cpu_s
from testbed.fabric.lifecycle import probe_pairs, signals_deferred, up_or_down
from testbed.plan.failplan import cut_off_reason
from testbed.linux.files import write_json_atomic
from testbed.plan.fidelity import machine_budget_mbit_hops, saturation_table
from testbed.model.plain import to_plain
from testbed.model.partition import (FIRST_VNI, Machine, MachinePart, Partition, PartSpec,
                                     check_cluster_spec, cut_links, links_by_machine,
                                     machine_of, machine_part, part_to_plain, partition)
from testbed.plan.reachability import Reachability
from testbed.runs.registry import DEFAULT_STATE_DIR, Registry
from testbed.model.spec import Fidelity, TestbedSpec

T = TypeVar("T")


class ClusterFabric:
    """``spec``'s fabric over the Ray cluster at ``address`` (see the module docstring); a
    context manager like :class:`testbed.fabric.fabric.Fabric`.

    Args:
        spec: what to build.
        address: the Ray cluster's head (``host:port``).
        state_dir: the coordinator's run records (the controller's).
        log: progress lines.
        machines: how many machines the cluster must have (``cluster.machines``); None: any.
    """

    marker = None  # each machine's markers are its own (congestion() reads them there)
    pfc_agent = None  # PFC is refused on a cluster

    def __init__(self, spec: TestbedSpec, address: str, state_dir: Path = DEFAULT_STATE_DIR,
                 log: Callable[[str], None] = lambda _msg: None,
                 machines: int | None = None) -> None:
        check_cluster_spec(spec)
        self.spec = spec
        self.topo = spec.topology
        self.address = address
        self.state_dir = state_dir
        self.log = log
        self.expected_machines = machines
        self.cluster = None
        self.plan: Partition | None = None
        self.parts: dict[str, MachinePart] = {}
        self.built: dict[str, dict] = {}  # machine -> what its build returned
        self.where: dict[str, str] = {}  # node -> machine
        self.run: FabricRun | None = None  # the coordinator's own: the controller's record
        self.controller: Controller | None = None
        self.timings: dict[str, float] = {}
        self.warnings: list[str] = []
        self.red_marking = False
        self.datapath_choice = ""

    # -- lifecycle ----------------------------------------------------------------------------
    def __enter__(self) -> ClusterFabric:
        up_or_down(self)
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self) -> None:
        start = time.monotonic()
        self.cluster = Cluster(self.address)
        infos = self.cluster.machines
        if self.expected_machines is not None and len(infos) != self.expected_machines:
            raise ConfigError("cluster.machines", f"the cluster at {self.address} has "
                              f"{len(infos)} machines ({', '.join(sorted(infos))}), the "
                              f"experiment expects {self.expected_machines}")
        here = software_versions()["git_revision"]
        self.warnings += self.cluster.warnings
        self.warnings += [f"{name} runs fabriclab {info.revision}, this machine {here}: "
                          "a part built by other code may differ"
                          for name, info in sorted(infos.items()) if info.revision != here]
        self._choose_datapath()
        mtu, table = self.spec.fabric.mtu, saturation_table(self.spec.emulator.datapath)
        machines = [Machine(name, machine_budget_mbit_hops(mtu, info.cores, table))
                    for name, info in sorted(infos.items())]
        self.plan = plan = partition(self.topo, machines)
        self._check_loads(plan)
        tunnels = cut_links(plan, {n: i.underlay for n, i in infos.items()}, mtu,
                            {n: i.underlay_mtu for n, i in infos.items()})
        self.parts = {m.name: machine_part(self.topo, plan, tunnels, m.name)
                      for m in machines}
        self.where = dict(plan.place)
        for line in plan.describe():
            self.log(f"plan: {line}")
        self.timings["plan"] = time.monotonic() - start
        listen = local_address_towards(self.address)
        self.run = FabricRun(Registry(self.state_dir), self.log)
        self.run.open(orphans=False)  # this machine's leftovers of other runs stay theirs
        self.controller = Controller(self.spec, self.topo, self.run, listen)
        t0 = time.monotonic()
        self.controller.start()
        self.run.start_thread(self.controller.watch, "controller watch")
        self.timings["controller"] = time.monotonic() - t0
        # how another process (fabriclab fail) reaches the machines of this fabric: written
        # before they build, so that no command mistakes it for a single machine's
        write_json_atomic(self.run.run_dir / CLUSTER_FILE, {
            "address": self.address, "actors": self.cluster.names, "place": self.where})
        t0 = time.monotonic()
        target = self.controller.address
        self.built = {}
        errors = []
        # sent as data: the settings and each share by name, and the switches' certificates
        spec = to_plain(PartSpec.of(self.spec))
        pki = self.controller.pki.switch_side() if self.controller.pki is not None else None
        if pki is None and self.controller.channel == "tcp":
            self.warnings.append(
                f"OpenFlow runs over plain TCP on the underlay ({listen}:"
                f"{self.controller.of_port}): set controller.tls: true (with the eBPF or the "
                "userspace datapath on every machine) so that only this run's switches and "
                "controller talk")
        with ThreadPoolExecutor(max_workers=len(self.parts)) as pool:
            timeout_s = self.spec.controller.ready_timeout_s + CALL_GRACE_S * 2
            futures = {name: pool.submit(self.machine(name).build, spec, part_to_plain(part),
                                         target, pki, timeout_s)
                       for name, part in self.parts.items()}
            for name, future in futures.items():
                try:
                    self.built[name] = future.result()
                except (TestbedError, ConfigError) as err:
                    errors.append(f"{name}: {err}")
        if errors:
            raise TestbedError("building the fabric's parts failed:\n  " + "\n  ".join(errors))
        self.timings["machines"] = time.monotonic() - t0
        for name, info in self.built.items():
            self.warnings += [f"{name}: {w}" for w in info["warnings"]]
        self.red_marking = any(info["red_marking"] for info in self.built.values())
        t0 = time.monotonic()
        self.controller.wait_programmed()
        self.timings["programmed"] = time.monotonic() - t0
        if self.spec.controller.own:  # every link probed: the machines' sockets exist
            self.controller.wait_probed()
        self.on_all(lambda m: m.settle())
        self.timings["up_total"] = time.monotonic() - start

    def _choose_datapath(self) -> None:
        """``emulator.datapath: auto`` resolved once, here, for every machine (this machine's
        kernel stands for the cluster's): the machines build on the datapath named."""
        asked = self.spec.emulator.datapath
        self.spec, self.datapath_choice = resolve_datapath(
            self.spec, capabilities.probe(self.state_dir), builds_switches=False)
        if self.spec.emulator.datapath != asked:
            self.log(f"datapath {self.datapath_choice}")

    def _check_loads(self, plan: Partition) -> None:
        """Each machine's share of the full load against its budget (the fidelity model per
        machine): past its saturation point (twice the budget) refused under strict."""
        mode = self.spec.emulator.fidelity
        if mode == Fidelity.OFF:
            return
        for i, m in enumerate(plan.machines):
            share = plan.load[m.name] / m.budget_mbit_hops
            text = (f"{m.name} would carry {plan.load[m.name]:,.0f} Mbit-hop/s at full load, "
                    f"{share:.0%} of its budget ({m.budget_mbit_hops:,.0f})")
            if share > 2.0 and mode == Fidelity.STRICT:
                raise ConfigError(f"cluster.machines[{i}]", f"{text}: past its saturation "
                                  "point. Add machines, lower the rates, or set "
                                  "emulator.fidelity: warn")
            if share > 1.0:
                self.warnings.append(f"fidelity: {text}")

    def down(self) -> None:
        """Every machine's part, then the controller; the cluster connection closes."""
        errors = []
        with signals_deferred():
            if self.cluster is not None and self.built:
                with ThreadPoolExecutor(max_workers=len(self.built)) as pool:
                    futures = {n: pool.submit(self.machine(n).teardown) for n in self.built}
                for name, future in futures.items():
                    try:
                        self.timings[f"down_{name}"] = future.result().get("down_total", 0.0)
                    except (TestbedError, ConfigError) as err:
                        errors.append(f"{name}: {err} (run 'fabriclab clean' there)")
                self.built = {}
            if self.run is not None and self.run.record is not None:
                try:
                    self.run.close(self.run.stop_threads())
                except TestbedError as err:
                    errors.append(f"coordinator: {err}")
            if self.controller is not None:
                self.controller.close()
            if self.cluster is not None:
                self.cluster.close()
                self.cluster = None
        if errors:
            raise TestbedError("cluster teardown incomplete:\n  " + "\n  ".join(errors))

    # -- calls to the machines -----------------------------------------------------------------
    def machine(self, name: str) -> MachineHandle:
        """The typed calls to ``name``'s actor (:class:`testbed.cluster.machines.MachineHandle`)."""
        return self.cluster.machine(name)

    def on_all(self, call: Callable[[MachineHandle], T]) -> dict[str, T]:
        """``call(machine)`` on every machine that builds a part, at once."""
        return on_each(self.cluster, list(self.built or self.parts), call)

    def machine_of(self, node: str) -> str:
        return machine_of(self.topo, self.where, node)

    # -- what a run uses -------------------------------------------------------------------
    fidelity = None  # the plan checks each machine's share (_check_loads)

    @property
    def datapath_type(self) -> str | None:
        kinds = sorted({str(b["datapath"]) for b in self.built.values()})
        return "/".join(kinds) + f" on {len(self.built)} machines" if kinds else None

    @property
    def vswitchd_count(self) -> int:
        return sum(b["vswitchds"] for b in self.built.values())

    @property
    def controller_address(self) -> str:
        host, port = self.controller.address
        return f"{host}:{port}"

    @property
    def of_port(self) -> int:
        return self.controller.of_port

    @property
    def run_dir(self) -> Path:
        return self.run.run_dir

    @property
    def record(self):
        return self.run.record if self.run is not None else None

    @property
    def status_path(self) -> Path:
        return self.controller.status_path

    @property
    def service_errors(self) -> list[str]:
        return self.run.errors

    @property
    def controller_events(self) -> list[dict]:
        return self.controller.events if self.controller is not None else []

    def controller_status(self) -> dict:
        return self.controller.status()

    def track_process(self, pid: int, role: str) -> None:
        self.run.track_process(pid, role)

    def track_file(self, path: Path) -> None:
        self.run.track_file(path)

    def start_thread(self, target, role: str):
        return self.run.start_thread(target, role)

    def stop_thread(self, thread) -> None:
        self.run.stop_thread(thread)

    def restart_controller(self, spec: TestbedSpec) -> None:
        check_cluster_spec(spec)
        # the datapath stays the one built (``auto`` was resolved when the fabric came up)
        self.spec = replace(spec, emulator=replace(spec.emulator,
                                                   datapath=self.spec.emulator.datapath))
        self.controller.replace(self.spec)

    def vswitchd_pids(self) -> dict[str, int]:
        return {}  # on the machines; their monitors sample them

    def cpu_times(self) -> dict[str, dict]:
        """Every machine's CPU (:meth:`Fabric.cpu_times`), the coordinator's too (its
        controller)."""
        times = {"coordinator": {"cpu": machine_cpu_s(), "cores": os.cpu_count() or 1,
                                 "vswitchd": {}, "vswitchd_switches": {}}}
        for per_machine in self.on_all(lambda m: m.cpu_times()).values():
            times.update(per_machine)
        return times

    def switch_ports(self) -> set[str]:
        return {e.ifname for link in self.topo.links for e in (link.a, link.b)
                if self.topo.nodes[e.node].is_switch}

    def spawn(self, host: str | None, argv: list[str], role: str,
              **_popen_kwargs) -> RemoteProcess:
        """Start ``argv`` in ``host`` on its machine, in that machine's run directory (the
        files of :meth:`write_file` are there)."""
        if host is None:
            raise TestbedError(f"{role}: on a cluster, processes run in hosts only")
        machine = self.machine_of(host)
        pid = self.machine(machine).spawn(host, argv, role)
        return RemoteProcess(self.machine(machine), machine, pid, argv)

    def stop(self, proc: RemoteProcess, timeout_s: float = 5.0) -> int | None:
        code = self.machine(proc.machine).stop(proc.pid, timeout_s)
        if proc.returncode is None:
            proc.returncode = code
        return proc.returncode

    def write_file(self, name: str, text: str) -> Path:
        """``name`` in every machine's run directory (and the coordinator's)."""
        self.on_all(lambda m: m.write_file(name, text))
        return self.run.write_file(name, text)

    def read_file(self, name: str, host: str | None = None) -> str:
        if host is None:
            return self.run.read_file(name)
        try:
            return self.machine(self.machine_of(host)).read_file(name)
        except TestbedError as err:
            raise OSError(str(err)) from None

    def run_parallel(self, commands: dict[str, list[str]],
                     timeout_s: float) -> dict[str, tuple[int, str, str]]:
        by_machine: dict[str, dict] = {}
        for host, argv in commands.items():
            by_machine.setdefault(self.machine_of(host), {})[host] = argv
        out: dict[str, tuple[int, str, str]] = {}
        done = on_each(self.cluster, list(by_machine),
                        lambda m: m.run_parallel(by_machine[m.name], timeout_s))
        for got in done.values():
            out.update({h: tuple(r) for h, r in got.items()})
        return out

    def reachability(self, count: int = 2, timeout_s: float = 120.0) -> Reachability:
        return probe_pairs(self.topo, self.run_parallel, count, timeout_s)

    def cut_off(self, hosts: list[str]) -> str | None:
        ports, dead = {}, set()
        for name, state in self.on_all(lambda m: m.state()).items():
            ports.update(state["ports"])
            dead.update(state["dead"])
            if state["errors"]:
                return f"{name}: a fabric service failed: {state['errors'][0]}"
        return cut_off_reason(self.topo, ports, dead, hosts)

    def dead_switches(self) -> set[str]:
        return {name for state in self.on_all(lambda m: m.state()).values()
                for name in state["dead"]}

    def congestion(self, netlink=None) -> dict[str, dict]:
        return {port: data for counters in self.on_all(lambda m: m.congestion()).values()
                for port, data in counters.items()}

    def link_counters(self, names: set[str], netlink=None) -> dict:
        return {port: data for counters in self.on_all(lambda m: m.link_counters(names)).values()
                for port, data in counters.items()}

    def set_links(self, pairs: list[tuple[str, str]], up: bool,
                  netlink=None) -> dict[str, float]:
        """Fail or repair links, every machine its ends at once (a cut link's two ends on
        two machines); each step's time is the latest machine's."""
        return set_links_on_machines(self.cluster, links_by_machine(self.topo, self.where, pairs), up)

    def set_rates(self, pairs: list[tuple[str, str]], factor: float,
                  netlink=None) -> dict[str, float]:
        """Degrade links, every machine its ends; the time is the latest machine's."""
        steps = [self.machine(m).set_rates(p, factor)
                 for m, p in links_by_machine(self.topo, self.where, pairs).items()]
        return {"rated_s": max((s["rated_s"] for s in steps), default=0.0)}

    def offered_bytes(self, names: set[str]) -> dict[str, int] | None:
        found = [c for c in self.on_all(lambda m: m.offered_bytes(names)).values()
                 if c is not None]
        return {k: v for c in found for k, v in c.items()} if found else None

    def switch_notices(self) -> list[tuple[float, str, int, tuple[int, ...]]]:
        return [n for found in self.on_all(lambda m: m.switch_notices()).values()
                for n in found or ()]

    def largest_packets(self, names: set[str]) -> dict[str, int]:
        return {k: v for c in self.on_all(lambda m: m.largest_packets(names)).values()
                for k, v in (c or {}).items()}

    def cut_drops(self, pairs: list[tuple[str, str]], netlink=None) -> int | None:
        counts = [self.machine(m).cut_drops(p)
                  for m, p in links_by_machine(self.topo, self.where, pairs).items()]
        known = [c for c in counts if c is not None]
        return sum(known) if known else None

    def start_monitor(self, queue_interval_s: float) -> tuple[ClusterMonitor, Callable]:
        self.on_all(lambda m: m.start_monitor(queue_interval_s))
        return ClusterMonitor(self.on_all), lambda: self.on_all(lambda m: m.stop_monitor())

    def delay_relay_counters(self) -> dict | None:
        return None  # each machine's relay keeps its own counters

    def placement(self) -> dict:
        """The partition and the machines (``results.json``'s ``cluster``)."""
        plan = self.plan
        infos = self.cluster.machines if self.cluster is not None else {}
        return {"address": self.address,
                "machines": {m.name: {
                    "underlay": infos[m.name].underlay if m.name in infos else None,
                    "cores": infos[m.name].cores if m.name in infos else None,
                    "revision": infos[m.name].revision if m.name in infos else None,
                    "nodes": len([n for n in plan.nodes(m.name)
                                  if n in self.topo.nodes]),
                    "switches": list(self.parts[m.name].switches),
                    "hosts": list(self.parts[m.name].hosts),
                    "load_mbit_hops": round(plan.load[m.name], 1),
                    "budget_mbit_hops": round(m.budget_mbit_hops, 1),
                    "build_s": round(self.built.get(m.name, {}).get("timings", {})
                                     .get("up_total", 0.0), 3)}
                    for m in plan.machines},
                "cut_links": [{"link": l.name, "vni": FIRST_VNI + i}
                              for i, l in enumerate(plan.cut)],
                "plan": plan.describe()}


