"""Experiment files: YAML, checked against the shipped JSON Schema, then semantically.

Defaults apply per level (built-in defaults -> the file's ``fabric`` section -> per-tier link
settings). Every error names its field path: ``fabric.k: must be even, got 5``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path

import jsonschema
import yaml

from testbed.errors import ConfigError
from testbed.topology import Topology, fat_tree, leaf_spine

DEFAULT_RATE_MBPS = 10.0
DEFAULT_QUEUE_KB = 256
DEFAULT_MTU = 9000
DEFAULT_READY_TIMEOUT_S = 60.0

_SHAPE_KEYS = {"fat_tree": ("k",), "leaf_spine": ("leaves", "spines", "hosts_per_leaf")}


def schema() -> dict:
    """The experiment file's JSON Schema (shipped as ``testbed/schema/experiment.schema.json``)."""
    text = resources.files("testbed").joinpath("schema/experiment.schema.json").read_text()
    return json.loads(text)


@dataclass(frozen=True)
class LinkSpec:
    rate_mbps: float = DEFAULT_RATE_MBPS
    delay_us: float = 0.0
    loss_percent: float = 0.0


@dataclass(frozen=True)
class FabricSpec:
    topology: str
    shape: dict
    host_link: LinkSpec = field(default_factory=LinkSpec)
    fabric_link: LinkSpec = field(default_factory=LinkSpec)
    queue_kb: int | None = DEFAULT_QUEUE_KB
    queue_packets: int | None = None
    mtu: int = DEFAULT_MTU


@dataclass(frozen=True)
class ControllerSpec:
    routing: str = "ecmp"
    ecmp_seed: str = "per_switch"
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S


@dataclass(frozen=True)
class EmulatorSpec:
    """How the machine emulates the fabric (not what the fabric is)."""

    vswitchd_instances: int | str = "auto"  # private Open vSwitch instances (userspace datapath)
    fidelity: str = "strict"  # strict: refuse an overloaded fabric; warn; off
    backend: str = "auto"  # host, vm (full-kernel guest), auto: host if its kernel suffices
    ovs_other_config: dict = field(default_factory=dict)  # extra Open_vSwitch other_config


@dataclass(frozen=True)
class Experiment:
    """A validated experiment."""

    name: str
    description: str
    fabric: FabricSpec
    controller: ControllerSpec
    source: str = "<memory>"
    emulator: EmulatorSpec = field(default_factory=EmulatorSpec)
    workload: dict | None = None  # raw section; traffic.workload.parse_workload reads it

    def jobs(self) -> list:
        """The workload's jobs (ConfigError naming the field when one is wrong)."""
        from traffic.workload import (
            parse_workload,  # pure; traffic builds on the testbed model
        )

        base = str(Path(self.source).parent) if self.source != "<memory>" else "."
        return parse_workload(self.topology, self.workload, base) if self.workload else []

    @cached_property
    def topology(self) -> Topology:
        return build_topology(self.fabric)

    def required_qdiscs(self) -> list[tuple[str, str]]:
        """(field path, qdisc kind) for every setting that needs a particular qdisc."""
        needs = [("fabric", "htb"), ("fabric.queue", "pfifo" if self.fabric.queue_packets else "bfifo")]
        for tier in ("host_link", "fabric_link"):
            link: LinkSpec = getattr(self.fabric, tier)
            if link.delay_us:
                needs.append((f"fabric.{tier}.delay_us", "netem"))
            if link.loss_percent:
                needs.append((f"fabric.{tier}.loss_percent", "netem"))
        return needs


def build_topology(spec: FabricSpec) -> Topology:
    """Build the topology model of a fabric spec; model errors come back under ``fabric.``."""
    try:
        if spec.topology == "fat_tree":
            return fat_tree(spec.shape["k"], spec.host_link.rate_mbps, spec.fabric_link.rate_mbps)
        return leaf_spine(spec.shape["leaves"], spec.shape["spines"], spec.shape["hosts_per_leaf"],
                          spec.host_link.rate_mbps, spec.fabric_link.rate_mbps)
    except ConfigError as err:
        raise err.under("fabric") from None


def load(path: str | Path) -> Experiment:
    """Read, validate and return an experiment file.

    Raises:
        ConfigError: naming the field path of the first problem (all problems are listed).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(str(path), f"cannot read: {err.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(str(path), f"not valid YAML{where}: {getattr(err, 'problem', err)}") from None
    return parse(data, source=str(path))


def parse(data: object, source: str = "<memory>") -> Experiment:
    """Validate already-parsed YAML/JSON data and return the experiment."""
    if not isinstance(data, dict):
        raise ConfigError("", f"{source}: an experiment is a mapping at the top level")
    validator = jsonschema.Draft202012Validator(schema())
    problems = sorted((_describe(e) for e in validator.iter_errors(data)), key=lambda p: p[0])
    if problems:
        first_path, first_msg = problems[0]
        more = "".join(f"\n  {p}: {m}" if p else f"\n  {m}" for p, m in problems[1:])
        raise ConfigError(first_path, first_msg + more)
    fabric = _fabric(data["fabric"])
    ctl = data.get("controller", {})
    controller = ControllerSpec(ctl.get("routing", "ecmp"), ctl.get("ecmp_seed", "per_switch"),
                                float(ctl.get("ready_timeout_s", DEFAULT_READY_TIMEOUT_S)))
    emu = data.get("emulator", {})
    emulator = EmulatorSpec(emu.get("vswitchd_instances", "auto"), emu.get("fidelity", "strict"),
                            emu.get("backend", "auto"),
                            {k: str(v).lower() if isinstance(v, bool) else str(v)
                             for k, v in emu.get("ovs_other_config", {}).items()})
    exp = Experiment(data.get("name", Path(source).stem if source != "<memory>" else "experiment"),
                     data.get("description", ""), fabric, controller, source, emulator,
                     data.get("workload"))
    _ = exp.topology  # semantic checks of the shape happen in the model
    exp.jobs()  # and those of the workload, against it: all before anything is built
    return exp


def _fabric(raw: dict) -> FabricSpec:
    kind = raw["topology"]
    for other, keys in _SHAPE_KEYS.items():
        for key in keys:
            if other != kind and key in raw:
                raise ConfigError(f"fabric.{key}", f"only applies to topology {other}, not {kind}")
    for key in _SHAPE_KEYS[kind]:
        if key not in raw:
            raise ConfigError(f"fabric.{key}", f"required for topology {kind}")
    queue = raw.get("queue", {})
    if "size_kb" in queue and "size_packets" in queue:
        raise ConfigError("fabric.queue", "give size_kb or size_packets, not both")
    return FabricSpec(
        topology=kind,
        shape={key: raw[key] for key in _SHAPE_KEYS[kind]},
        host_link=LinkSpec(**raw.get("host_link", {})),
        fabric_link=LinkSpec(**raw.get("fabric_link", {})),
        queue_kb=None if "size_packets" in queue else queue.get("size_kb", DEFAULT_QUEUE_KB),
        queue_packets=queue.get("size_packets"),
        mtu=raw.get("mtu", DEFAULT_MTU),
    )


def _describe(error: jsonschema.ValidationError) -> tuple[str, str]:
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}"
                   for p in error.absolute_path).lstrip(".")
    kind = error.validator
    if kind == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed))
        key = ".".join(filter(None, [path, extra[0] if extra else ""]))
        return key, f"unknown key (allowed: {', '.join(allowed)})"
    if kind == "required":
        missing = error.message.split("'")[1] if "'" in error.message else "?"
        return ".".join(filter(None, [path, missing])), "required"
    if kind == "type":
        return path, f"must be of type {error.validator_value}, got {error.instance!r}"
    if kind == "enum":
        return path, f"must be one of {', '.join(map(str, error.validator_value))}, got {error.instance!r}"
    if kind == "const":
        return path, f"must be {error.validator_value!r}, got {error.instance!r}"
    if kind in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        op = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=",
              "exclusiveMaximum": "<"}[kind]
        return path, f"must be {op} {error.validator_value}, got {error.instance!r}"
    return path, error.message
