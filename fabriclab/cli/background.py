"""Fabrics in the background and getting into them: ``fabriclab up -d`` (the fabric kept up by
a detached process, the command back once it is up, with the run's id), ``fabriclab ls`` (the
running fabrics), ``fabriclab down [ID|--all]`` (SIGTERM to a fabric's process, which tears it
down, waited for), ``fabriclab exec HOST -- CMD`` (a command in a host's network namespace),
``fabriclab ofctl SWITCH CMD`` (``ovs-ofctl`` against one switch) and ``fabriclab capture
LINK|PORT`` (``tcpdump`` on one interface)."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from fabriclab.cli.output import EXIT_OK, EXIT_SYSTEM, emit
from fabriclab.cli.requests import (CaptureRequest, DownRequest, ExecRequest, ListRequest,
                                    OfctlRequest)
from testbed.errors import ConfigError, TestbedError
from testbed.paths import MGMT_SUFFIX, SWITCH_MGMT_DIR
from testbed.plan.capture import capture_point
from testbed.runs.registry import Registry, RunRecord, proc_start_time

FABRIC_FILE = "fabric.json"  # what ``up`` writes into its run directory for ``ls``
DOWN_TIMEOUT_S = 120.0


def detach(state_dir: Path, timeout_s: float) -> int | None:
    """Fork ``fabriclab up`` into the background: in the child (returns None) the command goes
    on, its output in ``STATE_DIR/logs/up-<pid>.log``, and :func:`say_up` tells the parent;
    the parent (returns an exit code) waits for that, prints the run id and returns."""
    logs = state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own session, no terminal
        os.close(read_end)
        os.setsid()
        log = os.open(logs / f"up-{os.getpid()}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                      0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        os.environ["FABRICLAB_UP_FD"] = str(write_end)
        return None
    os.close(write_end)
    log = logs / f"up-{pid}.log"
    ready, _, _ = select.select([read_end], [], [], timeout_s)
    said = os.read(read_end, 256).decode() if ready else ""
    os.close(read_end)
    if said:
        print(said.strip())
        print(f"(its output: {log}; 'fabriclab down {said.strip()}' tears it down)",
              file=sys.stderr)
        return EXIT_OK
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    print(f"the fabric did not come up{' in time' if not ready else ''}; its output "
          f"({log}):\n{tail}", file=sys.stderr)
    if not ready:  # still building: not left behind half-built
        os.kill(pid, signal.SIGTERM)
    return EXIT_SYSTEM


def say_up(run_id: str) -> None:
    """In a detached ``up``: the fabric is up; the waiting parent prints ``run_id``."""
    fd = os.environ.pop("FABRICLAB_UP_FD", None)
    if fd is not None:
        os.write(int(fd), run_id.encode())
        os.close(int(fd))


def running(state_dir: Path) -> list[RunRecord]:
    return [r for r in Registry(state_dir).runs() if r.owner_alive()]


def describe(record: RunRecord, now: float) -> dict:
    """One running fabric as ``ls`` shows it."""
    run_dir = Path(record.run_dir)
    info = _json(run_dir / FABRIC_FILE)
    return {"run": record.run_id, "experiment": info.get("experiment", "-"),
            "age_s": round(now - record.created, 1), "hosts": info.get("hosts"),
            "controller": info.get("controller", "-"),
            "controller_kind": info.get("controller_kind", "-"),
            "telemetry": info.get("telemetry"),
            "pid": record.owner_pid, "run_dir": str(run_dir)}


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def ls(req: ListRequest, ui: Console) -> int:
    rows = [describe(r, time.time()) for r in running(req.state_dir)]
    if req.json:
        emit(rows)
        return EXIT_OK
    if not rows:
        ui.print("no fabric is running")
        return EXIT_OK
    table = Table("run", "experiment", "age", "hosts", "controller", "telemetry")
    for row in rows:
        table.add_row(row["run"], row["experiment"], _age(row["age_s"]), str(row["hosts"] or "-"),
                      f"{row['controller']} ({row['controller_kind']})",
                      row["telemetry"] or "-")
    ui.print(table)
    return EXIT_OK


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def down(req: DownRequest, ui: Console) -> int:
    """SIGTERM to each chosen fabric's process (checked by its start time), then wait for its
    teardown. Without an id or ``--all``, the one running fabric (several: refused)."""
    if req.all:
        records = running(req.state_dir)
    else:
        records = [Registry(req.state_dir).running(req.run)]
    done = []
    for record in records:
        if proc_start_time(record.owner_pid) == record.owner_start:
            os.kill(record.owner_pid, signal.SIGTERM)
    deadline = time.monotonic() + DOWN_TIMEOUT_S
    for record in records:
        while record.owner_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        if record.owner_alive():
            raise TestbedError(f"run {record.run_id} (pid {record.owner_pid}) did not end "
                               f"within {DOWN_TIMEOUT_S:.0f} s of SIGTERM")
        ui.print(f"run {record.run_id} torn down")
        done.append(record.run_id)
    if req.json:
        emit({"down": done})
    elif not records:
        ui.print("no fabric is running")
    return EXIT_OK


def host_pid(record: RunRecord, host: str) -> int:
    """The PID of ``host``'s shell (its network namespace) in a running fabric.

    Raises:
        TestbedError: no such host (naming some that are).
    """
    hosts = {p.role.split(":", 1)[1]: p for p in record.processes if p.role.startswith("host:")}
    proc = hosts.get(host)
    if proc is None or not proc.alive():
        some = ", ".join(sorted(hosts)[:6])
        raise TestbedError(f"no host {host!r} in run {record.run_id} (hosts: {some}, ...)")
    return proc.pid


def exec_in(req: ExecRequest, ui: Console) -> int:
    """Run a command (a shell by default) in a host, as on a machine of its own: its network
    namespace, its mount namespace (``/etc/hosts`` names every host) and its hostname. This
    process becomes it (a terminal stays a terminal), through ``nsenter``."""
    record = Registry(req.state_dir).running(req.run)
    pid = host_pid(record, req.host)
    argv = list(req.command) or [os.environ.get("SHELL", "/bin/bash")]
    sys.stdout.flush()
    os.execvp("nsenter", ["nsenter", "-t", str(pid), "-n", "-m", "-u", "--", *argv])
    return EXIT_OK  # not reached


def ofctl(req: OfctlRequest, ui: Console) -> int:
    """``ovs-ofctl`` (OpenFlow 1.5) against one switch of a running fabric: an eBPF switch's
    management socket (its tables read, never changed), its private vswitchd's, or the
    machine's Open vSwitch bridge."""
    record = Registry(req.state_dir).running(req.run)
    if not req.args:
        raise ConfigError("ofctl", "give an ovs-ofctl command: dump-flows, dump-groups, "
                                   "dump-ports, show, ...")
    ebpf = Path(record.run_dir, SWITCH_MGMT_DIR, f"{req.switch}{MGMT_SUFFIX}")
    if req.switch not in record.bridges and not ebpf.exists():
        switches = record.bridges or sorted(p.name.removesuffix(MGMT_SUFFIX) for p in
                                            Path(record.run_dir, SWITCH_MGMT_DIR).glob("*.mgmt"))
        raise TestbedError(f"no switch {req.switch!r} in run {record.run_id} on this machine: "
                           f"its switches: {', '.join(switches[:8])}, ...")
    mgmt = [ebpf] if ebpf.exists() else sorted(Path(record.run_dir).glob(
        f"ovs*/{req.switch}{MGMT_SUFFIX}"))
    target = f"unix:{mgmt[0]}" if mgmt else req.switch
    command, rest = req.args[0], list(req.args[1:])
    if ebpf.exists() and command == "dump-groups":  # ovs-ofctl refuses the local methods
        return _dump_ebpf_groups(ebpf, rest)
    sys.stdout.flush()
    os.execvp("ovs-ofctl", ["ovs-ofctl", "-O", "OpenFlow15", command, target, *rest])
    return EXIT_OK  # not reached


def _dump_ebpf_groups(path: Path, rest: list[str]) -> int:
    """An eBPF switch's groups as ``ovs-ofctl dump-groups`` prints them, the switch-local
    selection methods included (:mod:`testbed.switch.groupdump`); ``rest``: a group id."""
    from testbed.openflow.groups import BadGroup
    from testbed.switch.groupdump import dump_lines

    if len(rest) > 1 or rest and not rest[0].isdigit():
        raise ConfigError("ofctl", f"dump-groups takes at most a group id, not {' '.join(rest)}")
    try:
        lines = dump_lines(path, int(rest[0]) if rest else None)
    except (OSError, BadGroup) as err:
        raise TestbedError(f"the switch's groups could not be read from {path}: {err}") from None
    print("OFPST_GROUP_DESC reply (OF1.5):")
    for line in lines:
        print(line)
    return EXIT_OK


def capture(req: CaptureRequest, ui: Console) -> int:
    """``tcpdump`` on one interface of a running fabric: a switch port in this namespace, or a
    host's NIC inside the host's; this process becomes tcpdump, so Ctrl-C ends it cleanly
    (with ``-w``, the pcap is written packet by packet and complete)."""
    if req.count is not None and req.count < 1:
        raise ConfigError("--count", f"must be at least 1, not {req.count}")
    record = Registry(req.state_dir).running(req.run)
    point = capture_point(record.topology(), list(req.target))
    if shutil.which("tcpdump") is None:
        raise TestbedError("tcpdump is not installed: apt-get install tcpdump (scripts/setup.sh "
                           "installs it)")
    argv = ["tcpdump", "-i", point.ifname, "-n", "-Z", "root", "--immediate-mode"]
    if req.write is not None:
        argv += ["-U", "-w", str(req.write)]
    else:
        argv += ["-l"]
    if req.count is not None:
        argv += ["-c", str(req.count)]
    if req.filter:
        argv += [req.filter]
    if point.host is not None:
        argv = ["nsenter", "-t", str(host_pid(record, point.host)), "-n", "--", *argv]
    elif not Path("/sys/class/net", point.ifname).exists():
        raise TestbedError(f"{point.what} is not on this machine (a cluster's machine holds "
                           "it: capture there)")
    print(f"capturing on {point.what} of run {record.run_id}; Ctrl-C stops", file=sys.stderr)
    sys.stdout.flush()
    os.execvp(argv[0], argv)
    return EXIT_OK  # not reached
