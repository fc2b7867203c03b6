"""What a run could leave on a machine, read from the machine itself (not from any record):
namespaces, veths and Linux bridges, Open vSwitch bridges and QoS rows, BPF pins, containers,
and processes of the kinds fabriclab starts. The integration tests compare it before and after
each test; ``bench/chaos.py`` after each fault."""

from __future__ import annotations

import re
import shutil
import subprocess

#: the command lines of processes fabriclab starts (a private vswitchd or ovsdb-server runs from
#: a run directory: ``/work/<date>-...`` under a state folder, or pytest's)
PROCESSES = ("mininet:|controllers.launcher|iperf3|fping|traffic.agents.agent"
             "|traffic.agents.udpflow|prometheus --config|raylet|gcs_server"
             "|ovs(db-server|-vswitchd) .*(/work/[0-9]{8}-|/pytest-of-)")


def _lines(cmd: list[str]) -> set[str]:
    if shutil.which(cmd[0]) is None:
        return set()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=15).stdout
    except subprocess.TimeoutExpired:
        return {f"({cmd[0]} did not answer)"}
    return {line.strip() for line in out.splitlines() if line.strip()}


def _links(kind: str) -> set[str]:
    return {line.split(": ")[1].split("@")[0] for line in
            _lines(["ip", "-o", "link", "show", "type", kind]) if ": " in line}


def _processes() -> set[str]:
    pattern = re.compile(PROCESSES)
    return {line for line in _lines(["ps", "-ww", "-eo", "pid,args"]) if pattern.search(line)}


def machine_state() -> dict[str, set[str]]:
    """Every kind of thing a run makes, as the machine has it now."""
    return {
        "netns": _lines(["ip", "netns", "list"]),
        "veth": _links("veth"),
        "linux bridges": _links("bridge"),
        "vxlan": _links("vxlan"),
        "bridges": _lines(["ovs-vsctl", "--timeout=10", "list-br"]),
        "qos": _lines(["ovs-vsctl", "--timeout=10", "--bare", "--columns=_uuid", "list", "QoS"]),
        "procs": _processes(),
        "sysctl": _lines(["sysctl", "net.core.wmem_default"]),
        "bpf pins": _lines(["ls", "/sys/fs/bpf/fabriclab"]),
        "containers": _lines(["docker", "ps", "-q", "--filter", "label=org.fabriclab.owner"])
        if _docker_running() else set(),
    }


def _docker_running() -> bool:
    return shutil.which("docker") is not None and subprocess.run(
        ["docker", "info"], capture_output=True, check=False, timeout=15).returncode == 0


def leaked(before: dict[str, set[str]], after: dict[str, set[str]]) -> dict[str, list[str]]:
    """What ``after`` has that ``before`` had not, by kind."""
    return {k: sorted(after[k] - before.get(k, set())) for k in after
            if after[k] - before.get(k, set())}
