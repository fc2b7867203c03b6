"""Open vSwitch adapter: bridges, ports and controller targets through ``ovs-vsctl``, and
private Open vSwitch instances.

Two ways to host a fabric's bridges:

* the machine's own Open vSwitch (kernel datapath): every bridge fabriclab creates carries
  ``external_ids:fabriclab-run=<run id>`` so that cleanup can find exactly ours, even when the
  run's state file is lost;
* private instances (userspace datapath): an ``ovsdb-server`` + ``ovs-vswitchd`` pair per shard of
  the fabric, with its database, sockets and logs in the run directory. The userspace datapath
  forwards in the vswitchd main thread, which polls every port of the instance on each wake-up,
  so splitting the fabric over several instances both shortens each poll and lets every core
  forward. Their bridges live and die with the processes: teardown is ending two PIDs.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shlex
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from testbed.errors import TestbedError
from testbed.poll import wait_for

RUN_KEY = "fabriclab-run"
VSCTL_TIMEOUT_S = 60
INACTIVITY_PROBE_MS = 30000


@dataclass(frozen=True)
class BridgeSpec:
    """One switch as Open vSwitch sees it."""

    name: str
    dpid_hex: str
    ports: tuple[tuple[str, int], ...]  # (interface name, OpenFlow port number)


def _run(cmd: list[str], timeout_s: float, env: dict[str, str] | None = None) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s + 5,
                              check=False, env=env)
    except FileNotFoundError as err:
        raise TestbedError(f"{cmd[0]} not found: install openvswitch-switch "
                           "(scripts/setup.sh does)") from err
    except subprocess.TimeoutExpired as err:
        raise TestbedError(f"{cmd[0]} timed out", _short(cmd)) from err
    if proc.returncode != 0:
        raise TestbedError(f"{cmd[0]} failed", _short(cmd), proc.stderr)
    return proc.stdout


def vsctl(*args: str, timeout_s: int = VSCTL_TIMEOUT_S, db: str | None = None) -> str:
    """Run ``ovs-vsctl`` (against database socket ``db``, default the machine's) and return its
    stdout; raise TestbedError on failure."""
    dbarg = [f"--db=unix:{db}"] if db else []
    return _run(["ovs-vsctl", f"--timeout={timeout_s}", *dbarg, *args], timeout_s)


def signal_loss(ifname: str, lost: bool, db: str | None = None) -> None:
    """Tell the switch owning interface ``ifname`` that the link behind it lost (or regained)
    its signal, at once: a BFD session enabled on the interface starts down, and a port whose
    BFD does not forward is not live (``may_enable_port``): its fast-failover and select
    buckets are skipped and the controller gets a port status without ``LIVE``, milliseconds
    after this returns. The kernel's own signal (a veth's carrier) comes tens of milliseconds
    later. ``lost=False`` removes the session: the port is live again when its carrier is up.
    ``--no-wait``: the vswitchd applies it on its next loop, nothing to wait for."""
    if not has_ovsdb_client():  # without the library: ovs-vsctl, ten milliseconds
        vsctl("--no-wait", *(("set", "Interface", ifname, "bfd:enable=true") if lost else
                             ("remove", "Interface", ifname, "bfd", "enable")),
              timeout_s=10, db=db)
        return
    change = ["insert", ["map", [["enable", "true"]]]] if lost else \
        ["delete", ["set", ["enable"]]]
    where = [["name", "==", ifname]]
    transact(db or SYSTEM_DB, [{"op": "mutate", "table": "Interface", "where": where,
                                "mutations": [["bfd", *change]]}],
             f"{'signal' if lost else 'clear'} the loss of signal on {ifname}")
    if not lost:
        return
    # until the vswitchd has it (its BFD status says "not forwarding", 1-2 ms here): what the
    # caller does next (a veth's close) holds the kernel's RTNL lock for tens of ms, which
    # would stall a vswitchd still applying it
    deadline = time.monotonic() + SIGNAL_SEEN_S
    select = [{"op": "select", "table": "Interface", "where": where, "columns": ["bfd_status"]}]
    while time.monotonic() < deadline:
        rows = transact(db or SYSTEM_DB, select, f"read the BFD status of {ifname}")[0]["rows"]
        if ["forwarding", "false"] in rows[0]["bfd_status"][1]:
            return
        time.sleep(0.001)


SIGNAL_SEEN_S = 0.2


SYSTEM_RUNDIR = "/var/run/openvswitch"
SYSTEM_DB = f"{SYSTEM_RUNDIR}/db.sock"
_CLIENT_LOCK = threading.Lock()


def has_ovsdb_client() -> bool:
    """Whether the Open vSwitch Python library is here (Debian's python3-openvswitch, which
    openvswitch-switch depends on)."""
    try:
        ovsdb_client()
    except ImportError:
        return False
    return True


def ovsdb_client():
    """The Open vSwitch Python library (Debian's python3-openvswitch), imported once: its
    import takes a tenth of a second (its poller imports eventlet) and deadlocks when two
    threads run it at once, so a fabric imports it at bring-up, not at a failure."""
    with _CLIENT_LOCK:
        import warnings

        with warnings.catch_warnings():  # eventlet warns of itself
            warnings.simplefilter("ignore")
            import ovs.jsonrpc
            import ovs.poller
            import ovs.stream
            import ovs.timeval
        return ovs


TRANSACT_TIMEOUT_S = 10  # an OVSDB transaction takes a millisecond; a stopped server, forever


def _transact_until(ovs, conn, request, deadline_ms: int):
    """The library's ``transact_block`` with a deadline: (error, reply), ETIMEDOUT past it."""
    error = conn.send(request)
    while not error:
        error, reply = conn.recv()
        if error == errno.EAGAIN:
            if ovs.timeval.msec() >= deadline_ms:
                return errno.ETIMEDOUT, None
            conn.run()
            poller = ovs.poller.Poller()
            conn.wait(poller)
            conn.recv_wait(poller)
            poller.timer_wait_until(deadline_ms)
            poller.block()
            error = 0
            continue
        if (not error and reply and reply.type in (reply.T_REPLY, reply.T_ERROR)
                and reply.id == request.id):
            return 0, reply
    return error, None


def transact(db: str, ops: list[dict], what: str) -> list[dict]:
    """One OVSDB transaction on the ``Open_vSwitch`` database at socket ``db``, through the
    Open vSwitch Python library's JSON-RPC (a millisecond, where spawning ``ovs-vsctl``
    takes ten: a failure's signal is on the clock).

    Raises:
        TestbedError: naming ``what``, when the server is unreachable or refuses an operation.
    """
    ovs = ovsdb_client()
    deadline = ovs.timeval.msec() + TRANSACT_TIMEOUT_S * 1000
    error, stream = ovs.stream.Stream.open_block(ovs.stream.Stream.open(f"unix:{db}"),
                                                 TRANSACT_TIMEOUT_S * 1000)
    if error:
        raise TestbedError(f"{what}: cannot reach OVSDB at {db}: {os.strerror(error)}")
    conn = ovs.jsonrpc.Connection(stream)
    try:
        error, reply = _transact_until(ovs, conn, ovs.jsonrpc.Message.create_request(
            "transact", ["Open_vSwitch", *ops]), deadline)
    finally:
        conn.close()
    if error == errno.ETIMEDOUT:
        raise TestbedError(f"{what}: OVSDB at {db} did not answer in {TRANSACT_TIMEOUT_S} s "
                           "(its ovsdb-server stopped or stuck?)")
    if error:
        raise TestbedError(f"{what}: OVSDB at {db}: {os.strerror(error)}")
    results = reply.result or []
    failed = [r for r in results if isinstance(r, dict) and "error" in r]
    if reply.error or failed:
        raise TestbedError(f"{what}: OVSDB refused it", json.dumps(reply.error or failed))
    if any(r.get("count") == 0 for r in results if isinstance(r, dict)):
        raise TestbedError(f"{what}: the Open vSwitch at {db} has no such row (a switch not "
                           "built yet, or built by another instance)", json.dumps(ops)[:500])
    return results


def instance_db(run_dir: str | Path, bridge: str) -> str | None:
    """The database socket of the private instance holding ``bridge`` in a run directory (its
    management socket sits beside it), or None: the machine's Open vSwitch holds it."""
    for mgmt in Path(run_dir).glob(f"ovs*/{bridge}.mgmt"):
        return str(mgmt.parent / "db.sock")
    return None


@dataclass
class Instance:
    """A private ``ovsdb-server`` + ``ovs-vswitchd`` pair, all of its files under ``directory``.

    Args:
        directory: where the database, sockets, pidfiles and logs go (created).
        name: a short label used in errors.
    """

    directory: Path
    name: str
    pids: dict[str, int] = field(default_factory=dict)

    @property
    def db(self) -> str:
        return str(self.directory / "db.sock")

    @property
    def env(self) -> dict[str, str]:
        """Daemon environment: run, database and log directories all inside ours, so that
        per-bridge management sockets do not land in the machine's /var/run/openvswitch."""
        d = str(self.directory)
        return {**os.environ, "OVS_RUNDIR": d, "OVS_DBDIR": d, "OVS_LOGDIR": d,
                "GLIBC_TUNABLES": MALLOC_TUNABLES}

    def ctl(self, daemon: str) -> str:
        return str(self.directory / f"{daemon}.ctl")

    def start_db(self, other_config: dict[str, str]) -> None:
        """Create the database, start ``ovsdb-server`` and initialise the root row."""
        d = self.directory
        d.mkdir(parents=True, exist_ok=True)
        _run(["ovsdb-tool", "create", str(d / "conf.db"), VSWITCH_SCHEMA], 10)
        _run(["ovsdb-server", str(d / "conf.db"), f"--remote=punix:{self.db}",
              f"--pidfile={d / 'ovsdb-server.pid'}", f"--unixctl={self.ctl('ovsdb-server')}",
              f"--log-file={d / 'ovsdb-server.log'}", "--detach", "--no-chdir"], 10, self.env)
        self.pids["ovsdb-server"] = _read_pid(d / "ovsdb-server.pid")
        settings = [f"other_config:{k}={v}" for k, v in sorted(other_config.items())]
        vsctl("--no-wait", "init", "--", "set", "Open_vSwitch", ".", *settings, db=self.db)

    def start_switch(self) -> None:
        """Start ``ovs-vswitchd`` on the database (after :meth:`start_db`)."""
        d = self.directory
        _run(["ovs-vswitchd", f"unix:{self.db}", "--enable-dummy",
              f"--pidfile={d / 'ovs-vswitchd.pid'}",
              f"--unixctl={self.ctl('ovs-vswitchd')}", f"--log-file={d / 'ovs-vswitchd.log'}",
              "--detach", "--no-chdir"], 30, self.env)
        self.pids["ovs-vswitchd"] = _read_pid(d / "ovs-vswitchd.pid")


# glibc's allocator in vswitchd: the Linux netdev provider allocates a batch of MTU-sized packet
# buffers (32 x 9 KiB at MTU 9000) on every receive attempt and frees what it did not fill, so
# the heap top crosses the 128 KiB trim threshold on almost every wake-up: a brk() shrink, then
# page faults that zero the same pages again (2,400 brk calls in 4 s in one switch; page faults,
# malloc and brk were the top of vswitchd's profile). A high trim threshold and some top padding
# keep the pages: vswitchd's CPU under a random permutation fell from 1.65 to 0.95 cores.
MALLOC_TUNABLES = "glibc.malloc.trim_threshold=268435456:glibc.malloc.top_pad=16777216"
VSWITCH_SCHEMA = "/usr/share/openvswitch/vswitch.ovsschema"
# The userspace datapath under its other name. Every netdev datapath owns a tap device named
# "ovs-netdev" (and one per bridge for the bridge's internal port), so two vswitchd processes
# with netdev datapaths collide on it in one network namespace. The same datapath registered as
# "dummy" (ovs-vswitchd --enable-dummy) gives internal ports no kernel device at all; "system"
# ports (our veths) are still opened by the Linux netdev provider, so forwarding is identical.
PRIVATE_DATAPATH_TYPE = "dummy"


def appctl(*args: str, target: str | None = None, timeout_s: float = 30) -> str:
    """Run ``ovs-appctl`` against ``target`` (a control socket; default the machine's vswitchd)."""
    tgt = ["-t", target] if target else []
    return _run(["ovs-appctl", *tgt, f"--timeout={int(timeout_s)}", *args], timeout_s)


def trace_outputs(text: str) -> list[int]:
    """The OpenFlow output ports in an ``ofproto/trace`` report (bucket choices resolved)."""
    return [int(m) for m in re.findall(r"^\s+output:(\d+)\s*$", text, flags=re.MULTILINE)]


def _read_pid(path: Path, timeout_s: float = 5.0) -> int:
    def pid() -> int | None:
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            return None

    return wait_for(pid, timeout_s, f"a pid in {path}", interval_s=0.02)


def _short(cmd: list[str]) -> str:
    text = shlex.join(cmd)
    return text if len(text) < 400 else text[:400] + " ..."


def db_answers(path: str = "/var/run/openvswitch/db.sock") -> bool:
    """Whether the system's ovsdb-server takes connections: when it does not, its database
    holds no fabric's bridge now (an eBPF fabric builds with Open vSwitch stopped, and a
    stopped server may leave its socket file behind)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        try:
            sock.connect(path)
        except OSError:
            return False
    return True


def check_running() -> None:
    """Raise a TestbedError telling how to start OVS when its daemons do not answer."""
    try:
        vsctl("show", timeout_s=5)
    except TestbedError as err:
        raise TestbedError("Open vSwitch is not running: start it with "
                           "'/usr/share/openvswitch/scripts/ovs-ctl start' "
                           "(scripts/setup.sh does)", stderr=err.stderr) from err


def vswitchd_pids(run_dir: str = "/var/run/openvswitch") -> list[int]:
    """PIDs of the running ovs-vswitchd (from its pidfile); empty when it is not running."""
    try:
        pid = int(Path(run_dir, "ovs-vswitchd.pid").read_text().strip())
    except (OSError, ValueError):
        return []
    return [pid] if Path(f"/proc/{pid}").exists() else []


def set_ssl(key: Path, cert: Path, ca: Path, db: str) -> None:
    """An instance's SSL settings (one per database: a private instance's own)."""
    vsctl("set-ssl", str(key), str(cert), str(ca), db=db)


def create_bridges(bridges: list[BridgeSpec], run_id: str, datapath_type: str,
                   controller_target: str, mtu: int, protocols: str = "OpenFlow15",
                   db: str | None = None) -> None:
    """Create all bridges, their ports and controller rows in one OVSDB transaction.

    Every port gets the QoS ``linux-noop``: without it Open vSwitch deletes the root qdisc of
    each port it adds (its empty-QoS default), silently removing the link shaping.
    """
    args: list[str] = ["--", "--id=@noop", "create", "QoS", "type=linux-noop",
                       f"external_ids:{RUN_KEY}={run_id}"]
    for i, br in enumerate(bridges):
        # a controller busy with 80 handshakes on 2 cores answers echoes late: probe gently
        args += ["--", f"--id=@c{i}", "create", "Controller", f"target=\"{controller_target}\"",
                 "max_backoff=1000", "connection_mode=out-of-band",
                 f"inactivity_probe={INACTIVITY_PROBE_MS}"]
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
    vsctl(*args, db=db)


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



def switch_states(bridges: dict[str, Instance | None]) -> dict[str, tuple[bool, int]]:
    """Whether each bridge is connected to its controller, and how many flows it holds: one
    OVSDB transaction per database, one ``dump-aggregate`` per bridge.

    Args:
        bridges: bridge name -> its private instance (None: the machine's Open vSwitch).

    Raises:
        TestbedError: an Open vSwitch does not answer.
    """
    by_db: dict[str, list[str]] = {}
    for name, inst in bridges.items():
        by_db.setdefault(inst.db if inst is not None else SYSTEM_DB, []).append(name)
    connected: dict[str, bool] = {}
    for db, names in by_db.items():
        bridge_rows, controller_rows = transact(db, [
            {"op": "select", "table": "Bridge", "where": [], "columns": ["name", "controller"]},
            {"op": "select", "table": "Controller", "where": [],
             "columns": ["_uuid", "is_connected"]}], "switch states")
        up = {row["_uuid"][1] for row in controller_rows["rows"] if row["is_connected"] is True}
        for row in bridge_rows["rows"]:
            if row["name"] in names:
                ctl = row["controller"]
                uuids = [u[1] for u in ctl[1]] if ctl[0] == "set" else [ctl[1]]
                connected[row["name"]] = bool(uuids) and all(u in up for u in uuids)
    states = {}
    for name, inst in bridges.items():
        target = f"unix:{inst.directory / f'{name}.mgmt'}" if inst is not None else name
        out = _run(["ovs-ofctl", "-O", "OpenFlow15", "dump-aggregate", target], 10)
        found = re.search(r"flow_count=(\d+)", out)
        states[name] = (connected.get(name, False), int(found.group(1)) if found else 0)
    return states
