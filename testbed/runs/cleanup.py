"""Remove what a run created, from its record: the normal teardown path and ``fabriclab clean``.

Only resources listed in a run record (or OVS bridges tagged with a fabriclab run id) are
touched; nothing is found or killed by a broad name.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from testbed.linux import bpf, netns, ovs, procfs
from testbed.errors import TestbedError
from testbed.linux.netlink import Netlink
from testbed.runs.registry import (Registry, Role, RunRecord, TrackedProcess, known_state_dirs,
                                   proc_start_time, stop_processes)


@dataclass
class CleanReport:
    """What a clean removed, and what it could not."""

    runs: list[str] = field(default_factory=list)
    bridges: int = 0
    links: int = 0
    foreign_links: int = 0  # recorded names now held by links not of the run (left alone)
    processes: int = 0
    skipped: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def clean_record(record: RunRecord, registry: Registry, report: CleanReport | None = None,
                 keep_run_dir: bool = True) -> CleanReport:
    """Remove every resource of one run, in dependency order, then its record.

    Each step runs even when an earlier one failed; failures are collected in the report and the
    record is kept so that a later clean can retry.
    """
    report = report or CleanReport()
    errors_before = len(report.errors)
    try:
        if record.bridges:  # bridges and QoS rows of the machine's Open vSwitch
            tagged = ovs.bridges_by_run()  # a bridge of that name tagged by another run stays
            mine = [b for b in record.bridges if tagged.get(b) == record.run_id]
            ovs.delete_bridges(mine)
            ovs.delete_qos({record.run_id})
            report.bridges += len(mine)
    except TestbedError as err:
        report.errors.append(f"{record.run_id}: bridges: {err}")
    for name in record.netns_names:  # first: a name keeps its namespace (and veths) alive
        try:
            if _netns_name_is_ours(record, name, report):
                netns.unname(name)
        except TestbedError as err:
            report.errors.append(f"{record.run_id}: {err}")
    tracked = {p.pid for p in record.processes}
    processes = record.processes + [p for p in _daemons_by_pidfile(record)
                                    if p.pid not in tracked]
    hosts = [p for p in processes if p.kind.is_host]
    # switch daemons before their databases; agents before the shells they live in
    others = sorted((p for p in processes if not p.kind.is_host),
                    key=lambda p: (p.role.endswith("ovsdb-server"), p.role))
    # in stages, each stage signalled at once: switch daemons and agents, databases, shells
    stages = [[p for p in others if not p.role.endswith("ovsdb-server")],
              [p for p in others if p.role.endswith("ovsdb-server")], hosts]
    for stage in stages:
        try:
            report.processes += stop_processes(stage)
        except OSError as err:
            report.errors.append(f"{record.run_id}: stopping {[p.pid for p in stage]}: {err}")
    try:
        if record.links:  # (the Open vSwitch bridges went through its database above)
            with Netlink() as nl:
                groups = nl.groups(set(record.links))
                # only links that carry the run's group are its own: an interface someone else
                # made under a recorded name since (or before a failed create) stays
                ours = {n for n, g in groups.items()
                        if not record.link_group or g == record.link_group}
                report.foreign_links += len(groups) - len(ours)
                left = ours
                if record.link_group and ours:  # most of them at once
                    nl.delete_group(record.link_group)
                    left = nl.existing(ours)
                report.links += len(ours - left)
                for name in sorted(left):
                    if nl.delete(name):
                        report.links += 1
    except TestbedError as err:
        report.errors.append(f"{record.run_id}: links: {err}")
    for pin_dir in record.bpf_pins:  # after the links: programs stay attached until then
        bpf.unpin(pin_dir)
    for name, value in record.sysctls.items():  # a build that stopped while they were raised
        try:
            procfs.write_sysctl(name, value)
        except OSError as err:
            report.errors.append(f"{record.run_id}: restoring {name}={value}: {err}")
    for path in record.files:
        try:
            Path(path).unlink(missing_ok=True)
        except OSError as err:
            report.errors.append(f"{record.run_id}: removing {path}: {err}")
    if len(report.errors) == errors_before:
        registry.remove(record)
        report.runs.append(record.run_id)
        if not keep_run_dir:
            shutil.rmtree(record.run_dir, ignore_errors=True)
    return report


def _netns_name_is_ours(record: RunRecord, name: str, report: CleanReport) -> bool:
    """Whether ``/run/netns/NAME`` is the run's to remove: it stands for the run's host of
    that name (the namespace recorded once named, or, a run stopped before recording it, its
    host shell's, still running), or for no namespace at all (the file its mount left). A
    name that stands for another namespace, or for one nothing of the run vouches for, stays
    (a name is only a name: another fabric may hold it now)."""
    now = netns.inode(name)
    if now is None:
        return False
    if now == 0:  # a file that stands for no namespace (its mount gone): the run's leftover
        return True
    want = record.netns_inodes.get(name)
    if want is None:
        shells = [p for p in record.processes if p.role == str(Role.host(name)) and p.alive()]
        want = netns.process_inode(shells[0].pid) if shells else None
    if want != now:
        report.skipped.append(f"{record.run_id}: network namespace name {name} (it stands for "
                              "a namespace not of this run; left alone)")
        return False
    return True


def clean(registry: Registry, include_live: bool = False, orphans: bool = True) -> CleanReport:
    """Clean every recorded run whose owner is gone (or all, with ``include_live``), then
    (``orphans``) any fabriclab-tagged OVS bridge that no live run owns, in any state directory
    of the machine or its cluster machines' (a cluster machine's registry, which knows only its
    own runs, leaves those to the main one). A record that cannot
    be read is an error of the report (its resources stay until someone looks), never skipped
    in silence."""
    report = CleanReport()
    live_ids = set()
    records, unreadable = registry.scan()
    report.errors += unreadable
    for record in records:
        if not record.here():  # a namespace machine's part: its interfaces are in there
            if record.owner_alive():
                live_ids.add(record.run_id)
            report.skipped.append(f"{record.run_id} (made in network namespace "
                                  f"{record.netns}: clean it there)")
            continue
        if record.owner_alive() and not include_live:
            live_ids.add(record.run_id)
            report.skipped.append(f"{record.run_id} (pid {record.owner_pid} still running)")
            continue
        clean_record(record, registry, report)
    if not orphans or not ovs.db_answers():
        return report
    try:
        live_ids |= live_run_ids(registry.state_dir)  # every state directory's, machines'
        orphans = [b for b, run in ovs.bridges_by_run().items() if run not in live_ids]
        ovs.delete_bridges(orphans)
        ovs.delete_qos(keep=live_ids)
        report.bridges += len(orphans)
    except TestbedError as err:
        report.errors.append(f"orphan bridges: {err}")
    return report


def live_run_ids(state_dir: Path) -> set[str]:
    """The ids of every live run this machine recorded: in ``state_dir``, in every state
    directory a run was recorded in, and in each one's cluster machines' (``machines/*``)."""
    roots = dict.fromkeys([Path(state_dir).resolve(), *known_state_dirs()])
    dirs = [d for root in roots for d in (root, *sorted((root / "machines").glob("*")))]
    live = set()
    for state in dirs:
        records, _ = Registry(state).scan()
        live |= {r.run_id for r in records if r.owner_alive()}
    return live


def _daemons_by_pidfile(record: RunRecord) -> list[TrackedProcess]:
    """The run's private Open vSwitch daemons found by their own PID files (``run_dir/ovs*/``),
    each still running with that folder on its command line: a run killed between a daemon's
    start and its registration left it untracked."""
    found = []
    for pidfile in sorted(Path(record.run_dir).glob("ovs*/*.pid")):
        try:
            pid = int(pidfile.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
        start = proc_start_time(pid)
        if start is not None and str(pidfile.parent) in cmdline:
            found.append(TrackedProcess(pid, start, str(Role.ovs(pidfile.parent.name,
                                                                         pidfile.stem))))
    return found
