"""The experiment file: YAML, checked against the shipped JSON Schema, then semantically, and
parsed once into a typed :class:`Experiment` (the testbed it builds and the workload it runs).

This is the layer above :mod:`testbed` and :mod:`traffic`: it knows both, neither knows it.
Defaults are those of the typed specs (:mod:`testbed.model.spec`, :mod:`traffic.workloads.workload`,
:class:`traffic.workloads.training.TrainingSpec`); they apply per level (built-in defaults -> the file's
``fabric`` section -> per-tier link settings). Every error names its field path:
``fabric.k: must be even, got 5``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import re
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

from testbed.model.congestion import EcnMode, EcnSpec, PfcSpec, TrafficClasses, frame_bytes
from testbed.errors import ConfigError
from testbed.plan.failplan import FailureEvent, plan_failures
from testbed.plan.trim import TrimSpec
from testbed.model.custom import clos_only, link_settings
from testbed.model.servers import ScaleUp, ServerSpec
from testbed.model.spec import (
    DEFAULT_QUEUE_KB,
    OPTIONAL_SHAPE_KEYS,
    SHAPE_KEYS,
    Backend,
    ClusterSpec,
    Datapath,
    EcnMarker,
    EmulatorSpec,
    FabricSpec,
    ImpairSpec,
    Fidelity,
    LinkSpec,
    Requirement,
    TestbedSpec,
)
from fabriclab.model import seeds, sweep, topofiles
from fabriclab.model.controller import local_adaptive, parse_controller
from fabriclab.model import timescale, yamlfile
from fabriclab.model.scale import DEFAULT_REAL_RTT_US, RealScale
from fabriclab.model.schema import check, check_entry, schema
from traffic.workloads import budget
from traffic.workloads import workload as workload_files
from traffic.workloads.workload import Workload, parse_workload, read_regular

MEMORY = "<memory>"


@dataclass(frozen=True, kw_only=True)
class Experiment(TestbedSpec):
    """A validated experiment: the testbed to build, and what runs on it."""

    name: str
    description: str = ""
    source: str = MEMORY
    workload: Workload | None = None
    variant: str | None = None  # the variant this is (None: the base experiment)
    variants: tuple[Experiment, ...] = ()  # the base's variants, each a whole experiment
    failures: tuple[FailureEvent, ...] = ()  # link and switch failures during the workload
    cells: tuple[Cell, ...] = ()  # the sweep's cells (fabriclab.model.sweep), each a whole experiment
    # the file's data this experiment was parsed from, variants' and axes' fields set (the
    # run directory's experiment.json: the experiment as run)
    raw: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)
    real_scale: RealScale | None = None  # scale: the real fabric this one stands for
    time_scale: timescale.TimeScale | None = None  # emulator.time_scale: the file is real units
    cluster: ClusterSpec | None = None  # cluster: partitioned over a Ray cluster's machines

    @property
    def seed(self) -> int:
        """The run seed (:mod:`fabriclab.model.seeds`)."""
        return seeds.run_seed(self.raw)

    def plans_failures(self) -> bool:
        return bool(self.failures)

    def requirements(self) -> list[Requirement]:
        """The testbed's requirements and the workload's (TCP congestion controls)."""
        needs = super().requirements()
        if self.workload is not None:
            needs += [Requirement(f"workload job {job.index}.congestion_control", "tcp_cc",
                                  job.congestion_control)
                      for job in self.workload.jobs if job.congestion_control]
        return needs

    def fabric_summary(self) -> dict:
        """What fabric ran (the results document's ``fabric``)."""
        servers = self.fabric.servers
        extra = {} if servers is None else {
            "servers": servers.count, "gpus_per_server": servers.gpus_per_server,
            "scale_up": str(servers.scale_up), "scale_up_rate_mbps": servers.scale_up_rate_mbps}
        shape = self.fabric.shape if self.topology.kind != "custom" else {
            k: len(v) for k, v in self.fabric.shape.items()}  # its counts: the file has it all
        return {"topology": self.topology.kind, **shape, **extra,
                "variant": self.variant,
                "host_rate_mbps": self.fabric.host_link.rate_mbps,
                "fabric_rate_mbps": self.fabric.fabric_link.rate_mbps,
                "mtu": self.fabric.mtu, "routing": str(self.controller.routing),
                **self.bdp()}

    def bdp(self) -> dict:
        """The fabric's bandwidth-delay product: the host link's rate times the longest path's
        unloaded round trip, in bytes and in full frames (what a window or a rate controller
        acts on per round trip)."""
        rtt = self.base_rtt_s
        nbytes = self.fabric.host_link.rate_mbps * 1e6 / 8 * rtt
        return {"base_rtt_ms": round(rtt * 1e3, 3), "bdp_bytes": round(nbytes),
                "bdp_packets": round(nbytes / frame_bytes(self.fabric.mtu), 1)}


@dataclass(frozen=True)
class Cell:
    """One run of a sweep: its plan (name, variant, values, repetition) and its experiment."""

    plan: sweep.CellPlan
    experiment: Experiment

    @property
    def name(self) -> str:
        return self.plan.name


def load(path: str | Path, cluster: str | None = None, seed: int | None = None) -> Experiment:
    """Read, validate and return an experiment file (``cluster``: the Ray cluster's address
    to run it on, as the file's ``cluster.address`` would say; ``seed``: the run seed, as
    the file's ``seed`` would say).

    Raises:
        ConfigError: naming the field path of the first problem (all problems are listed).
    """
    data = yamlfile.read(Path(path))
    if cluster is not None and isinstance(data, dict):
        data["cluster"] = {**(data.get("cluster") or {}), "address": cluster}
    if seed is not None and isinstance(data, dict):
        data["seed"] = seed
    return parse(data, source=str(path))


def _finite(data: object, path: str = "") -> None:
    """Refuse a number that is not finite (``.nan``, ``.inf``): no field takes one."""
    if isinstance(data, float) and not math.isfinite(data):
        raise ConfigError(path, f"{data} is not a finite number")
    if isinstance(data, dict):
        for key, value in data.items():
            _finite(value, f"{path}.{key}" if path else str(key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            _finite(value, f"{path}[{i}]")


def parse(data: object, source: str = MEMORY) -> Experiment:
    """Validate already-parsed YAML/JSON data and return the experiment (workload included:
    trace and NCCL log files are read here, once, relative to ``source``'s folder), with its
    variants and sweep cells, each validated as a whole experiment, all of them within one
    planning budget (:mod:`traffic.workloads.budget`)."""
    with budget.planning():
        return _parse_all(data, source)


def _parse_all(data: object, source: str) -> Experiment:
    if not isinstance(data, dict):
        raise ConfigError("", f"{source}: an experiment is a mapping at the top level")
    _finite(data)
    check(data, schema())
    custom = _custom_fabric(data, source)
    if custom is not data:  # its imported nodes and links checked as if written out
        data = custom
        check(data, schema())
    base = {k: v for k, v in data.items() if k not in ("variants", "sweep")}
    experiment = _parse_one(base, source, None)  # the base's own errors come first
    variants, raws = [], {None: base}
    for i, variant in enumerate(data.get("variants", [])):
        raw = copy.deepcopy(base)
        for path, value in variant["set"].items():
            _set_path(raw, path, value, f"variants[{i}].set.{path}")
        try:
            check(raw, schema())
            variants.append(_parse_one(raw, source, variant["name"]))
        except ConfigError as err:
            raise ConfigError(err.path, f"{err.message} (in variant {variant['name']!r}, "
                                        f"variants[{i}])") from None
        raws[variant["name"]] = raw
    names = [v.variant for v in variants]
    if len(set(names)) != len(names):
        raise ConfigError("variants", f"variant names repeat: {', '.join(names)}")
    cells = []
    if "sweep" in data:
        for plan in sweep.plan_cells(data["sweep"], names or [None]):
            if plan.repetition > 1:  # the same experiment as its first repetition
                cells.append(Cell(plan, cells[-1].experiment))
                continue
            raw = copy.deepcopy(raws[plan.variant])
            where = f"sweep cell {plan.name!r}"
            for path, value in plan.values.items():
                _set_path(raw, path, value, f"sweep.axes.{path}")
            try:
                check(raw, schema())
                cells.append(Cell(plan, _parse_one(raw, source, plan.variant)))
            except ConfigError as err:
                raise ConfigError(err.path, f"{err.message} (in {where})") from None
    return dataclasses.replace(experiment, variants=tuple(variants), cells=tuple(cells))


_SEGMENT = re.compile(r"([^.\[\]]+)((?:\[\d+\])*)")


def _set_path(data: dict, path: str, value: object, where: str) -> None:
    """Set ``fabric.host_link.ecn`` or ``workload.collectives[1].size`` in nested data
    (mappings are created on the way; ``None`` removes the field)."""
    steps: list[str | int] = []
    for part in path.split("."):
        match = _SEGMENT.fullmatch(part)
        if match is None:
            raise ConfigError(where, f"cannot read the field path {path!r}")
        steps.append(match[1])
        steps += [int(i) for i in re.findall(r"\[(\d+)\]", match[2])]
    node = data
    for step, nxt in zip(steps, steps[1:]):
        try:
            if isinstance(step, int):
                node = node[step]
            else:
                node = node.setdefault(step, [] if isinstance(nxt, int) else {})
        except (IndexError, TypeError, AttributeError):
            raise ConfigError(where, f"{path!r} does not lead anywhere in the base "
                                     "experiment") from None
    last = steps[-1]
    try:
        if value is None:
            node.pop(last)
        else:
            node[last] = value
    except (IndexError, KeyError, TypeError, AttributeError):  # (a number or a string there)
        raise ConfigError(where, f"{path!r} does not lead anywhere in the base "
                                 "experiment") from None


def _parse_one(data: dict, source: str, variant: str | None) -> Experiment:
    """One experiment (the base, or a variant), already checked against the schema: its real
    units read (:mod:`fabriclab.model.timescale`), scaled by ``emulator.time_scale``."""
    data = seeds.apply(data)  # the run seed where a feature's own is left out
    units, real = timescale.real_units(data), None
    if timescale.bdp_fields(units):  # the fabric's BDP first: the same at any N
        bare = timescale.without_bdp(units)
        real = _parse_emulated(bare, source, variant, bare, None)
        units = timescale.resolve_bdp(units, real.bdp()["bdp_bytes"])
    given = (data.get("emulator") or {}).get("time_scale")
    if given is None:
        return _parse_emulated(units, source, variant, data)
    if data.get("scale"):
        raise ConfigError("scale", "emulator.time_scale makes the file the real fabric itself; "
                                   "scale only relabels an emulated one: give one of them")
    raw, bounds = copy.deepcopy(data), ()
    if given == "auto":  # from the real fabric (its buffers need not be known)
        real = real or _parse_emulated(units, source, variant, data, None)
        n, bounds = timescale.auto(real, real.workload, os.cpu_count() or 1,
                                   find_spec("traffic.native._engine") is not None)
        raw["emulator"]["time_scale"] = n  # as run: a cluster's machines agree on it
    else:
        n = float(given)
    exp = _parse_emulated(timescale.scaled(units, n), source, variant, raw, n)
    rate = exp.fabric.host_link.rate_mbps * n / 1e3
    ts = timescale.TimeScale(n, given == "auto", bounds, rate, exp.base_rtt_s / n,
                             exp.fabric.mtu)
    return dataclasses.replace(exp, time_scale=ts, real_scale=RealScale(
        rate, exp.fabric.host_link.rate_mbps, exp.base_rtt_s, exp.base_rtt_s / n * 1e6,
        time_scaled=True))


def _parse_emulated(data: dict, source: str, variant: str | None, raw: dict,
                    n: float | None = 1.0) -> Experiment:
    """One experiment in emulated units (``raw``: the file's data it came from, ``n``: the
    time scale that made it; None: the real fabric, parsed to choose N, its times unchecked)."""
    emulator = {k: v for k, v in data.get("emulator", {}).items()
                if k not in ("time_scale", "delay_line")}
    spec = TestbedSpec(
        fabric=_fabric(data["fabric"]),
        controller=parse_controller(data.get("controller", {}), source),
        emulator=EmulatorSpec(**_typed(emulator, _EMULATOR_TYPES)))
    if emulator.get("fault_notices") is True and spec.emulator.datapath == Datapath.OVS:
        raise ConfigError("emulator.fault_notices", "the switches' fault notices are the eBPF "
                          "switches'; Open vSwitch has none (emulator.datapath: ebpf or auto)")
    if n is not None:
        timescale.check_emulated(spec, data, n)
    for tier in ("host", "fabric"):
        spec.port_ecn(tier)  # thresholds in order, priorities in range
        spec.port_trim(tier)  # sizes, DSCP and threshold within the queue
    workload = None
    if data.get("workload"):  # checked against the model: all before anything is built
        base = str(Path(source).parent) if source != MEMORY else "."
        workload = parse_workload(spec.topology, data["workload"], base, check_entry=check_entry,
                                  real_rate_gbps=(data.get("scale") or {}).get("real_rate_gbps"))
        seed = seeds.run_seed(data)  # the source ports of the jobs' connections
        workload = dataclasses.replace(workload, jobs=tuple(
            dataclasses.replace(job, seed=seed) for job in workload.jobs))
    else:
        _ = spec.topology  # semantic checks of the shape happen in the model
    hpcc = workload is not None and any(j.transport == "rocev2" and
                                        j.transport_options.congestion_control == "hpcc"
                                        for j in workload.jobs)
    line = timescale.delay_line(spec, workload, data.get("emulator", {}))
    if hpcc or line != spec.fabric.delay_line:
        cached = {k: v for k, v in spec.__dict__.items() if k in ("topology", "base_rtt_s")}
        spec = dataclasses.replace(spec, fabric=dataclasses.replace(
            spec.fabric, int_telemetry=spec.fabric.int_telemetry or hpcc, delay_line=line))
        spec.__dict__.update(cached)  # the same shape: not built again
    _ = spec.pfc  # thresholds in order, headroom enough (the delay line known)
    clos_only(str(spec.controller.routing), spec.fabric.topology)
    spec = local_adaptive(spec)
    failures = plan_failures(spec.topology, data.get("failures", []))
    if failures and workload is None:
        raise ConfigError("failures", "failures happen during a workload; this experiment "
                                      "has none")
    exp = Experiment(
        name=data.get("name", Path(source).stem if source != MEMORY else "experiment"),
        description=data.get("description", ""), source=source, fabric=spec.fabric,
        controller=spec.controller, emulator=spec.emulator, workload=workload, variant=variant,
        failures=failures, raw=copy.deepcopy(raw), real_scale=_real_scale(spec, data),
        cluster=ClusterSpec(**data["cluster"]) if data.get("cluster") else None)
    # the same fabric: what the checks built (cached properties) is not built again (a k=32
    # fat tree took 0.7 s a time)
    exp.__dict__.update({name: spec.__dict__[name] for name in ("topology", "base_rtt_s")
                         if name in spec.__dict__})
    return exp


def _real_scale(spec: TestbedSpec, data: dict) -> RealScale | None:
    scale = data.get("scale")
    if not scale:
        return None
    return RealScale(float(scale["real_rate_gbps"]), spec.fabric.host_link.rate_mbps,
                     spec.base_rtt_s, float(scale.get("real_rtt_us", DEFAULT_REAL_RTT_US)))


def _other_config(raw: dict) -> dict[str, str]:
    """OVSDB other_config values are strings; YAML booleans become ``true``/``false``."""
    return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in raw.items()}


# schema-checked sections -> typed spec fields (absent keys keep the spec's defaults)
_EMULATOR_TYPES = {"vswitchd_instances": lambda v: v, "fidelity": Fidelity, "backend": Backend,
                   "ovs_other_config": _other_config, "queue_sample_ms": float,
                   "ecn_marker": EcnMarker, "datapath": Datapath, "fault_notices": bool}


def _typed(raw: dict, types: dict) -> dict:
    return {key: types[key](value) for key, value in raw.items()}


#: the most hosts a fabric may have, checked from the shape before the model is built: a k=32
#: fat-tree, past what one machine or a small cluster emulates (k=16 is the largest built here)
MAX_HOSTS = 8192
MAX_LINKS = 32_768


def _custom_fabric(data: dict, source: str) -> dict:
    """A custom fabric's nodes and links read from the file ``fabric.import`` names (the
    experiment as run holds them, not the import), and its links' delays and queue carried
    to their tiers (:func:`testbed.model.custom.link_settings`)."""
    fab = data.get("fabric")
    if not isinstance(fab, dict) or fab.get("topology") != "custom":
        return data
    fab = dict(fab)
    imported = fab.pop("import", None)
    if imported is not None:
        if "nodes" in fab or "links" in fab:
            raise ConfigError("fabric.import", "give nodes and links, or import them; not both")
        base = Path(source).parent if source != MEMORY else Path(".")
        raw = read_regular(str(base / imported["file"]), "fabric.import.file",
                           workload_files.MAX_INPUT_BYTES, imported["file"])
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ConfigError("fabric.import.file", f"not UTF-8 text (byte {err.start})") from None
        fab["nodes"], fab["links"] = topofiles.read(imported["format"], text)
    for key in ("nodes", "links"):
        if key not in fab:
            raise ConfigError(f"fabric.{key}", "required for topology custom (or fabric.import)")
    try:
        fab = link_settings(fab)
    except ConfigError as err:
        raise err.under("fabric") from None
    return {**data, "fabric": fab}


def _host_count(kind: str, raw: dict) -> tuple[int, str]:
    """How many hosts the shape makes, and the field that sets it (arithmetic, no model)."""
    servers = raw.get("servers")
    if servers:
        return servers["count"] * servers["gpus_per_server"], "fabric.servers.count"
    if kind == "fat_tree":
        return raw["k"] ** 3 // 4, "fabric.k"
    if kind == "custom":
        return sum(1 for n in raw["nodes"] if n.get("kind") == "host"), "fabric.nodes"
    return raw["leaves"] * raw["hosts_per_leaf"], "fabric.leaves"


def _link_count(kind: str, raw: dict, hosts: int) -> tuple[int, str]:
    """How many links the shape makes at most, and the field that multiplies them (arithmetic,
    no model)."""
    scale_up = hosts if raw.get("servers") else 0  # one per GPU at most
    if kind == "fat_tree":
        return 3 * raw["k"] ** 3 // 4 + scale_up, "fabric.k"
    if kind == "ring":
        return raw["leaves"] + hosts, "fabric.leaves"
    if kind == "custom":
        return len(raw["links"]), "fabric.links"
    if kind == "rail_optimized":
        servers = raw["servers"]
        groups = -(-servers["count"] // raw.get("servers_per_leaf", servers["count"]))
        leaves = servers["gpus_per_server"] * groups
        return (raw.get("planes", 1) * (leaves * raw["spines"] + hosts) + scale_up,
                "fabric.spines")
    return raw["leaves"] * raw["spines"] + hosts + scale_up, "fabric.spines"


def _fabric(raw: dict) -> FabricSpec:
    kind = raw["topology"]
    for other, keys in SHAPE_KEYS.items():
        for key in keys:
            if key not in SHAPE_KEYS[kind] and key in raw:
                raise ConfigError(f"fabric.{key}", f"only applies to topology {other}, not {kind}")
    for other, keys in OPTIONAL_SHAPE_KEYS.items():
        for key in keys:
            if key in raw and other != kind:
                raise ConfigError(f"fabric.{key}", f"only applies to topology {other}, not {kind}")
    for key in SHAPE_KEYS[kind]:
        if key not in raw:
            raise ConfigError(f"fabric.{key}", f"required for topology {kind}")
    if kind == "rail_optimized" and "servers" not in raw:
        raise ConfigError("fabric.servers", "required for topology rail_optimized (its hosts "
                                            "are the servers' GPUs)")
    if kind == "ring" and "servers" in raw:
        raise ConfigError("fabric.servers", "servers go on a leaf_spine, fat_tree, custom or "
                                            "rail_optimized fabric, not a ring")
    hosts, where = _host_count(kind, raw)
    if hosts > MAX_HOSTS:
        raise ConfigError(where, f"{hosts:,} hosts: more than the {MAX_HOSTS:,} a fabric may "
                                 "have (a k=32 fat-tree's)")
    links, where = _link_count(kind, raw, hosts)
    if links > MAX_LINKS:
        raise ConfigError(where, f"{links:,} links: more than the {MAX_LINKS:,} a fabric may "
                                 "have (a k=32 fat-tree has 24,576)")
    queue = raw.get("queue", {})
    if "size_kb" in queue and "size_packets" in queue:
        raise ConfigError("fabric.queue", "give size_kb or size_packets, not both")
    optional, host = {k: raw[k] for k in ("mtu",) if k in raw}, raw.get("hosts", {})
    classes = raw.get("traffic_classes", {})
    return FabricSpec(
        topology=kind,
        shape={key: raw[key] for key in (*SHAPE_KEYS[kind], *OPTIONAL_SHAPE_KEYS.get(kind, ()))
               if key in raw},
        host_link=_link(raw.get("host_link", {}), "fabric.host_link"),
        fabric_link=_link(raw.get("fabric_link", {}), "fabric.fabric_link"),
        queue_kb=None if "size_packets" in queue else queue.get("size_kb", DEFAULT_QUEUE_KB),
        queue_packets=queue.get("size_packets"),
        traffic_classes=TrafficClasses(
            {int(d): p for d, p in classes.get("dscp_to_priority", {}).items()},
            tuple(classes.get("strict", ()))).check(),
        host_ecn=host.get("ecn", False), host_rmem_max_kb=host.get("tcp_rmem_max_kb"),
        host_offload_segments=host.get("offload_segments"),
        acks_first=queue.get("acks_first", False),
        pfc=_pfc(raw.get("pfc", {}), classes.get("lossless", {})),
        servers=_servers(raw["servers"]) if "servers" in raw else None,
        **optional,
    )


def _servers(raw: dict) -> ServerSpec:
    up = raw["scale_up"]
    return ServerSpec(raw["count"], raw["gpus_per_server"], ScaleUp(up.get("kind", "switch")),
                      float(up["rate_mbps"]))


def _pfc(raw: dict, lossless: dict) -> PfcSpec:
    if lossless and not raw.get("priorities"):
        raise ConfigError("fabric.traffic_classes.lossless", "no lossless priorities: name "
                                                             "them in fabric.pfc.priorities")
    return PfcSpec(**{**raw, "priorities": tuple(raw.get("priorities", ())), **lossless})


def _link(raw: dict, path: str) -> LinkSpec:
    ecn = raw.get("ecn", ())
    entries = [ecn] if isinstance(ecn, dict) else list(ecn)
    trim, impair = raw.get("trim"), raw.get("impair")
    return LinkSpec(**{k: v for k, v in raw.items() if k not in ("ecn", "trim", "impair")},
                    impair=None if impair is None else ImpairSpec(**impair).check(
                        f"{path}.impair"), ecn=tuple(
        EcnSpec(**{**e, "mode": EcnMode(e["mode"]),
                   "priorities": tuple(e["priorities"]) if "priorities" in e else None})
        for e in entries), trim=None if trim is None else TrimSpec(
            **{**trim, "priorities": tuple(trim["priorities"]) if "priorities" in trim
               else None}))
