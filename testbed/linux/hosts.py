"""Mininet adapter: emulated hosts as Mininet ``Host`` nodes (a shell in its own network namespace).

The only module that imports mininet. Links, addresses and queues are set over netlink by
:mod:`testbed.linux.netlink` (one request each instead of a shell round trip per command), and switches
are Open vSwitch bridges created by :mod:`testbed.linux.ovs` in one transaction, so this adapter only
owns the host namespaces and the processes run in them.
"""

from __future__ import annotations

import shlex
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from mininet.node import Host

from testbed.errors import TestbedError
from testbed.model.topology import hostname

# Hosts speak IPv4 only: no router solicitations or MLD reports polluting the fabric.
_HOST_INIT = ("sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1"
              " net.ipv4.tcp_no_metrics_save=1")


class _Host(Host):
    """A Mininet host whose shell also has a UTS namespace of its own (its hostname is its
    name): ``unshare --uts`` between mnexec (network and mount namespaces) and the shell, in
    the same process."""

    def _popen(self, cmd, **params):
        if cmd[:1] == ["mnexec"] and f"mininet:{self.name}" in cmd:  # the host's shell
            cmd = [*cmd[:2], "unshare", "--uts", *cmd[2:]]
        return super()._popen(cmd, **params)


class Hosts:
    """The emulated hosts of one fabric, each a machine of its own as programs see it: its
    network namespace, a mount namespace in which ``/etc/hosts`` is ``hosts_file`` (every
    host by name), and a UTS namespace whose hostname is the host's name.

    Args:
        names: host names from the topology model.
        on_spawn: called with (name, pid) as soon as each host's shell exists, so that the
            caller can register it for cleanup before anything else happens.
        sysctls: extra settings of every host's namespace (``net.ipv4.tcp_ecn``: ``1``;
            values with spaces, ``net.ipv4.tcp_rmem``, are quoted).
        hosts_file: what each host sees as ``/etc/hosts`` (bound over it in the host's own
            mount namespace, made private first so that nothing reaches the machine's); an
            empty ``/etc/resolv.conf`` beside it, so that a name the file does not hold fails
            at once (the fabric reaches no name server: a query would wait out its timeout).
    """

    def __init__(self, names: list[str], on_spawn: Callable[[str, int], None],
                 sysctls: dict[str, str] | None = None,
                 aliases: dict[str, str] | None = None,
                 hosts_file: Path | None = None) -> None:
        self.aliases = dict(aliases or {})  # a multi-plane GPU's other NICs -> the GPU
        self.nodes: dict[str, Host] = {}
        for name in names:
            node = _Host(name)
            self.nodes[name] = node
            on_spawn(name, node.pid)
        init = _HOST_INIT + "".join(f" {shlex.quote(f'{k}={v}')}"
                                    for k, v in sorted((sysctls or {}).items()))
        # its hostname: its name as a hostname may be (h1_1_1: h1-1-1)
        machine = " && echo @NAME@ > /proc/sys/kernel/hostname"
        if hosts_file is not None:
            resolv = hosts_file.with_name("resolv.conf")
            resolv.write_text("# fabriclab: no name server in the fabric; /etc/hosts names "
                              "every host\n")
            machine += " && mount --make-rprivate /" + "".join(
                f" && {{ [ ! -e {target} ] || mount --bind {shlex.quote(str(source))} {target}; }}"
                for source, target in ((hosts_file, "/etc/hosts"),
                                       (resolv, "/etc/resolv.conf")))
        for node in self.nodes.values():
            node.sendCmd(init + machine.replace("@NAME@", shlex.quote(hostname(node.name))))
        for node in self.nodes.values():
            out = node.waitOutput()
            if out.strip():
                raise TestbedError(f"{node.name}: host set-up failed", init, out)

    def pid(self, name: str) -> int:
        return self.node(name).pid

    def node(self, name: str) -> Host:
        """The namespace of host ``name`` (a multi-plane NIC's: its GPU's)."""
        return self.nodes[self.aliases.get(name, name)]

    def popen(self, name: str, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` inside host ``name`` (its network, mount and UTS namespaces; stdout
        and stderr piped, text unless ``text=False``)."""
        kwargs.setdefault("stdout", subprocess.PIPE)
        kwargs.setdefault("stderr", subprocess.PIPE)
        kwargs.setdefault("text", True)
        node = self.node(name)
        return node.popen(["nsenter", "-t", str(node.pid), "-u", "--", *argv], **kwargs)

    def run_parallel(self, commands: dict[str, list[str]],
                     timeout_s: float) -> dict[str, tuple[int, str, str]]:
        """Run one command per host at once; returns host -> (exit code, stdout, stderr)."""
        procs = {name: self.popen(name, argv) for name, argv in commands.items()}
        deadline = time.monotonic() + timeout_s
        results = {}
        try:
            for name, proc in procs.items():
                remaining = max(0.1, deadline - time.monotonic())
                try:
                    out, err = proc.communicate(timeout=remaining)
                except subprocess.TimeoutExpired as exc:
                    raise TestbedError(f"{name}: command timed out after {timeout_s} s",
                                       " ".join(commands[name])) from exc
                results[name] = (proc.returncode, out, err)
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        return results

    def stop(self) -> None:
        """End every host shell (its namespace and interfaces go with it)."""
        for node in self.nodes.values():
            try:
                node.terminate()
            except OSError:
                pass
        for node in self.nodes.values():
            if node.shell is not None:
                try:
                    node.shell.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    node.shell.kill()
                    node.shell.wait()
        self.nodes.clear()
