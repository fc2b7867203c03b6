"""A fabric's life, whatever builds it (one machine, a cluster, a machine's part): a build that
fails tears down what it made, a teardown that Ctrl-C cannot interrupt, every host pair probed,
and a spawned process reaped."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from testbed.linux.files import copy_file, make_dirs
from testbed.paths import MGMT_SUFFIX, SWITCH_MGMT_DIR
from testbed.plan.reachability import (
    Reachability,
    evaluate,
    fping_command,
    probe_interval_ms,
)


def up_or_down(fabric) -> None:
    """``fabric.up()``; when it fails, ``fabric.down()`` removes what it built, and the build
    error stays the one raised (a teardown error is added to it as a note)."""
    try:
        fabric.up()
    except BaseException as err:
        kept = keep_logs(fabric)
        if kept is not None:
            err.add_note(f"the run's logs are kept in {kept}")
        try:
            fabric.down()
        except Exception as down_err:  # noqa: BLE001 - noted on the build error
            err.add_note(f"and tearing down after it failed too: {down_err}")
        raise


def keep_logs(fabric) -> Path | None:
    """A failed build's logs (the controller's, the daemons'), copied out of the run directory
    that its teardown removes, to ``STATE_DIR/logs/failed-<run id>``; None: nothing to keep."""
    run = getattr(fabric, "run", None)  # testbed.fabric.services.FabricRun
    record = run.record if run is not None else None
    if record is None or not Path(record.run_dir).is_dir():
        return None
    run_dir = Path(record.run_dir)
    logs = [p for p in run_dir.rglob("*") if p.suffix in (".log", ".stderr") and p.is_file()]
    if not logs:
        return None
    kept = run.registry.state_dir / "logs" / f"failed-{record.run_id}"
    for path in logs:
        target = kept / path.relative_to(run_dir)
        make_dirs(target.parent)
        copy_file(path, target)
    return kept


def keep_tables(fabric, kept: Path) -> None:
    """Every switch's flow table (``ovs-ofctl dump-flows`` through its management socket, or
    the machine's bridge) and its groups, written to ``kept/tables/<switch>.txt`` before the
    teardown removes them; an eBPF switch's groups read as ``fabriclab ofctl`` reads them
    (ovs-ofctl refuses the switch-local selection methods)."""
    record = fabric.run.record
    run_dir = Path(record.run_dir)
    targets = {bridge: bridge for bridge in record.bridges}  # the machine's Open vSwitch
    targets.update({path.name.removesuffix(MGMT_SUFFIX): f"unix:{path}" for path in
                    run_dir.glob(f"ovs*/*{MGMT_SUFFIX}")})  # a private vswitchd's
    ebpf = {path.name.removesuffix(MGMT_SUFFIX): path
            for path in (run_dir / SWITCH_MGMT_DIR).glob(f"*{MGMT_SUFFIX}")}
    targets.update({name: f"unix:{path}" for name, path in ebpf.items()})
    for switch, target in sorted(targets.items()):
        said = [_ofctl("dump-flows", target)]
        said.append(_ebpf_groups(ebpf[switch]) if switch in ebpf else
                    _ofctl("dump-groups", target))
        path = kept / "tables" / f"{switch}.txt"
        make_dirs(path.parent)
        path.write_text("".join(said))


def _ofctl(command: str, target: str) -> str:
    try:
        done = subprocess.run(["ovs-ofctl", "-O", "OpenFlow15", command, target],
                              capture_output=True, text=True, timeout=10, check=False)
        return f"$ ovs-ofctl {command}\n{done.stdout}{done.stderr}"
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"$ ovs-ofctl {command}\n(not read: {err})\n"


def _ebpf_groups(path: Path) -> str:
    from testbed.openflow.groups import BadGroup
    from testbed.switch.groupdump import dump_lines

    try:
        return "$ groups\n" + "".join(f"{line}\n" for line in dump_lines(path))
    except (OSError, BadGroup) as err:
        return f"$ groups\n(not read: {err})\n"


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Ignore SIGINT, SIGTERM and SIGHUP while tearing down, so a second Ctrl-C (or the second
    SIGHUP of a dropped ssh session) cannot leak resources."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        for sig in saved:
            signal.signal(sig, signal.SIG_IGN)
    except ValueError:  # not the main thread: nothing to defer
        saved = {}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def probe_pairs(topo, run_parallel: Callable[[dict, float], dict], count: int,
                timeout_s: float, upcalls: bool = True) -> Reachability:
    """Every ordered host pair of a plane probed ``count`` times, all sources at once, the
    commands run by ``run_parallel`` (:meth:`Fabric.run_parallel`, or a cluster's); paced for
    the userspace datapath's upcalls unless the switches make none (``upcalls=False``: eBPF)."""
    hosts, plane = topo.hosts, topo.plane_of
    expected = {h.name: {o.ip: o.name for o in hosts
                         if o is not h and plane(o.name) == plane(h.name)} for h in hosts}
    interval = probe_interval_ms(len(hosts), len(topo.switches) if upcalls else 1)
    commands = {src: fping_command(sorted(targets), count, interval)
                for src, targets in expected.items()}
    results = run_parallel(commands, timeout_s)
    return evaluate(expected, {name: out + err for name, (_, out, err) in results.items()})


def reap(proc: subprocess.Popen) -> None:
    """Wait for an ended process and close its pipes."""
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
