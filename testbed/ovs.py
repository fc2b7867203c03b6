"""Open vSwitch adapter: bridges, ports and controller targets through ``ovs-vsctl``.

Every bridge fabriclab creates carries ``external_ids:fabriclab-run=<run id>`` so that cleanup can
find exactly ours, even when the run's state file is lost.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from dataclasses import dataclass

from testbed.errors import TestbedError

RUN_KEY = "fabriclab-run"
VSCTL_TIMEOUT_S = 60


@dataclass(frozen=True)
class BridgeSpec:
    """One switch as Open vSwitch sees it."""

    name: str
    dpid_hex: str
    ports: tuple[tuple[str, int], ...]  # (interface name, OpenFlow port number)


def vsctl(*args: str, timeout_s: int = VSCTL_TIMEOUT_S) -> str:
    """Run ``ovs-vsctl`` and return its stdout; raise TestbedError on failure."""
    cmd = ["ovs-vsctl", f"--timeout={timeout_s}", *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s + 5,
                              check=False)
    except FileNotFoundError as err:
        raise TestbedError("ovs-vsctl not found: install openvswitch-switch "
                           "(scripts/setup.sh does)") from err
    except subprocess.TimeoutExpired as err:
        raise TestbedError("ovs-vsctl timed out", _short(cmd)) from err
    if proc.returncode != 0:
        raise TestbedError("ovs-vsctl failed", _short(cmd), proc.stderr)
    return proc.stdout


def _short(cmd: list[str]) -> str:
    text = shlex.join(cmd)
    return text if len(text) < 400 else text[:400] + " ..."


def check_running() -> None:
    """Raise a TestbedError telling how to start OVS when its daemons do not answer."""
    try:
        vsctl("show", timeout_s=5)
    except TestbedError as err:
        raise TestbedError("Open vSwitch is not running: start it with "
                           "'/usr/share/openvswitch/scripts/ovs-ctl start' "
                           "(scripts/setup.sh does)", stderr=err.stderr) from err


def get_other_config(key: str) -> str | None:
    out = vsctl("--if-exists", "get", "Open_vSwitch", ".", f"other_config:{key}").strip()
    return out.strip('"') or None


def create_bridges(bridges: list[BridgeSpec], run_id: str, datapath_type: str,
                   controller_target: str, mtu: int, protocols: str = "OpenFlow13") -> None:
    """Create all bridges, their ports and controller rows in one OVSDB transaction.

    Every port gets the QoS ``linux-noop``: without it Open vSwitch deletes the root qdisc of
    each port it adds (its empty-QoS default), silently removing the link shaping.
    """
    args: list[str] = ["--", "--id=@noop", "create", "QoS", "type=linux-noop",
                       f"external_ids:{RUN_KEY}={run_id}"]
    for i, br in enumerate(bridges):
        args += ["--", "--id=@c%d" % i, "create", "Controller", f"target=\"{controller_target}\"",
                 "max_backoff=1000", "connection_mode=out-of-band"]
        args += ["--", "add-br", br.name,
                 "--", "set", "Bridge", br.name, f"datapath_type={datapath_type}",
                 "fail_mode=secure", f"protocols={protocols}", f"controller=@c{i}",
                 f"other-config:datapath-id={br.dpid_hex}",
                 "other-config:disable-in-band=true",
                 f"external_ids:{RUN_KEY}={run_id}"]
        for ifname, port in br.ports:
            args += ["--", "add-port", br.name, ifname,
                     "--", "set", "Interface", ifname, f"ofport_request={port}",
                     f"mtu_request={mtu}",
                     "--", "set", "Port", ifname, "qos=@noop"]
    vsctl(*args)


def delete_bridges(names: list[str]) -> None:
    """Delete bridges by name (missing ones are ignored), in one transaction."""
    if not names:
        return
    args: list[str] = []
    for name in names:
        args += ["--", "--if-exists", "del-br", name]
    vsctl(*args)


def _tagged(table: str, column: str) -> dict[str, str]:
    out = vsctl("--format=json", f"--columns={column},external_ids", "list", table)
    result = {}
    for key, ext in json.loads(out).get("data", []):
        ids = dict(ext[1]) if isinstance(ext, list) and ext[0] == "map" else {}
        if RUN_KEY in ids:
            result[key[1] if isinstance(key, list) else key] = ids[RUN_KEY]
    return result


def bridges_by_run() -> dict[str, str]:
    """Map bridge name -> fabriclab run id for every bridge fabriclab created."""
    return _tagged("Bridge", "name")


def delete_qos(run_ids: set[str] | None = None, keep: set[str] = frozenset()) -> int:
    """Destroy fabriclab's QoS rows of the given runs (None: of every run not in ``keep``);
    QoS is a root table, so its rows outlive the bridges that used them."""
    uuids = [u for u, run in _tagged("QoS", "_uuid").items()
             if (run_ids is None or run in run_ids) and run not in keep]
    if uuids:
        vsctl(*[a for u in uuids for a in ("--", "--if-exists", "destroy", "QoS", u)])
    return len(uuids)

