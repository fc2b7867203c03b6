"""The experiment file's ``controller`` section (pure): fabriclab's own routing, a user's os-ken
app (a Python file, relative to the experiment file) or a remote controller (``host:port``),
checked field by field."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from testbed.errors import ConfigError
from testbed.model.spec import (
    ControllerSpec,
    Datapath,
    EcmpSeed,
    EcmpSelection,
    Granularity,
    Load,
    Routing,
    SprayWeights,
    TestbedSpec,
)

_CONTROLLER_TYPES = {"routing": Routing, "ecmp_seed": EcmpSeed, "ecmp_selection": EcmpSelection,
                     "spray_weights": SprayWeights, "poll_interval_s": float,
                     "ready_timeout_s": float, "restart": bool, "tls": bool, "app": str,
                     "remote": str, "settle_s": float, "granularity": Granularity,
                     "flowlet_gap_us": float, "load": Load, "rebalance": tuple}
#: reactive rebalancing's settings as ``rebalance: true`` gives them (percent)
REBALANCE_DEFAULTS = {"quality_delta_pct": 25, "chance_pct": 25}
#: fabriclab's own routing's settings: meaningless with an app or a remote controller
_ROUTING_KEYS = ("routing", "ecmp_seed", "ecmp_selection", "spray_weights", "poll_interval_s",
                 "restart")


def _rebalance(value: object, granularity: str) -> tuple[int, int]:
    """``controller.routing.rebalance``: false, true (the defaults) or ``{quality_delta_pct,
    chance_pct}``, each a whole percentage from 1 to 100 -> (quality delta, chance)."""
    field = "controller.routing.rebalance"
    if value is False:
        return (0, 0)
    if granularity != "flowlet":
        raise ConfigError(field, "moves a flowlet before its gap; granularity packet moves "
                                 "every packet")
    given = {} if value is True else value
    if not isinstance(given, dict):
        raise ConfigError(field, f"{value!r}: true, false or {{quality_delta_pct, chance_pct}}")
    for key in sorted(set(given) - set(REBALANCE_DEFAULTS)):
        raise ConfigError(f"{field}.{key}", "unknown: quality_delta_pct or chance_pct")
    out = []
    for key, default in REBALANCE_DEFAULTS.items():
        pct = given.get(key, default)
        if isinstance(pct, bool) or not isinstance(pct, int) or not 1 <= pct <= 100:
            raise ConfigError(f"{field}.{key}", f"{pct!r} is not a whole percentage, 1-100")
        out.append(pct)
    return out[0], out[1]


def parse_controller(raw: dict, source: str) -> ControllerSpec:
    """The controller section: an app's path made absolute (relative to the experiment file)
    and checked, a remote address checked, settings that do not apply refused by name;
    ``routing`` a mode's name or ``{mode, granularity, flowlet_gap_us, load, rebalance}``."""
    raw = dict(raw)
    routing = raw.get("routing")
    if isinstance(routing, dict):
        raw["routing"] = routing["mode"]
        if routing["mode"] != Routing.LOCAL_ADAPTIVE and len(routing) > 1:
            extra = sorted(set(routing) - {"mode"})[0]
            raise ConfigError(f"controller.routing.{extra}", "a setting of switch-local "
                              f"adaptive routing (mode: local_adaptive), not {routing['mode']}")
        if "granularity" in routing:
            raw["granularity"] = Granularity(routing["granularity"])
        if "flowlet_gap_us" in routing:
            if routing.get("granularity", "flowlet") != "flowlet":
                raise ConfigError("controller.routing.flowlet_gap_us", "flowlets' gap; "
                                  "granularity packet moves every packet")
            raw["flowlet_gap_us"] = float(routing["flowlet_gap_us"])
        if "load" in routing:
            raw["load"] = Load(routing["load"])
        if "rebalance" in routing:
            raw["rebalance"] = _rebalance(routing["rebalance"], routing.get("granularity",
                                                                           "flowlet"))
    typed = {k: _CONTROLLER_TYPES[k](v) for k, v in raw.items()}
    user = [k for k in ("app", "remote") if raw.get(k)]
    if len(user) == 2:
        raise ConfigError("controller.remote", "app and remote exclude each other: the app "
                                               "runs in fabriclab's controller process")
    if user:
        for key in _ROUTING_KEYS:
            if key in raw:
                raise ConfigError(f"controller.{key}", f"fabriclab's routing; with "
                                  f"controller.{user[0]} that controller decides")
    if raw.get("app"):
        base = Path(source).parent if not source.startswith("<") else Path(".")
        path = (base / raw["app"]).resolve()
        if not path.is_file() or path.suffix != ".py":
            raise ConfigError("controller.app", f"no Python file {str(path)!r} (an os-ken app; "
                                                "relative to the experiment file)")
        typed["app"] = str(path)
    if raw.get("remote"):
        host, _, port = raw["remote"].rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError("controller.remote", f"{raw['remote']!r} is not HOST:PORT "
                                                   "(10.0.0.5:6653)")
        if raw.get("tls"):
            raise ConfigError("controller.tls", "the run's own certificates are for its own "
                                                "controller, not a remote one")
    return ControllerSpec(**typed)


def local_adaptive(spec: TestbedSpec) -> TestbedSpec:
    """Switch-local adaptive routing checked against the datapath, its flowlets' gap defaulted
    to the fabric's base RTT (a flow idle that long has nothing in flight to be reordered)."""
    ctl = spec.controller
    if ctl.routing != Routing.LOCAL_ADAPTIVE or not ctl.own:
        return spec
    if spec.emulator.datapath == Datapath.OVS:
        raise ConfigError("controller.routing", "local_adaptive: Open vSwitch's groups choose "
                          "by hash only; the switches' own load-aware choice needs "
                          "emulator.datapath: ebpf (or auto)")
    if ctl.flowlet_gap_us:
        return spec
    cached = {k: v for k, v in spec.__dict__.items() if k in ("topology", "base_rtt_s")}
    spec = dataclasses.replace(spec, controller=dataclasses.replace(
        ctl, flowlet_gap_us=round(spec.base_rtt_s * 1e6, 1)))
    spec.__dict__.update(cached)
    return spec
