"""The hosts' delay relay of a fabric (``emulator.delay_line: hosts``): the relay process
(:mod:`testbed.linux.tunrelay`) started once the hosts' NICs exist, its TUN devices moved into
the hosts' namespaces with their NICs' ingress turned to them, and its counters read.

:class:`HostDelay` is a part of :class:`testbed.fabric.fabric.Fabric`; the relay is one of
the fabric's processes (ended by PID at teardown; its devices and the filters that point at
them go with it).
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from collections.abc import Callable

from testbed.errors import TestbedError
from testbed.fabric.services import FabricRun
from testbed.linux.netlink import Netlink
from testbed.model.share import LocalShare
from testbed.model.spec import TestbedSpec
from testbed.plan.hostdelay import relay_ports

READY_S = 10.0
#: each relay device's queue toward the relay, packets (the kernel's default, 500, drops a
#: burst of a few hundred frames while the relay is busy)
TXQLEN = 10_000


class HostDelay:
    """The relay of the hosts built here.

    Args:
        spec: the fabric's settings (the links' delays).
        share: what of the fabric is built here.
        run: the fabric's run.
        netlink: the build's netlink socket.
        pid: a host's namespace's process (:meth:`HostsAndLinks.pid`).
    """

    def __init__(self, spec: TestbedSpec, share: LocalShare, run: FabricRun, netlink: Netlink,
                 pid: Callable[[str], int]) -> None:
        self.spec, self.share, self.run, self.netlink, self.pid = spec, share, run, netlink, pid
        self.process: subprocess.Popen | None = None
        self.stats_path = None

    def start(self) -> None:
        """Start the relay and hand each host's incoming IPv4 packets to it."""
        hosts = [h.name for h in self.share.topo.hosts if self.share.here(h.name)]
        ports = relay_ports(self.spec, hosts)
        self.stats_path = self.run.run_dir / "delay-relay.json"
        config = self.run.write_file("delay-relay-config.json", json.dumps(
            {"ports": [p.to_json() for p in ports], "stats": str(self.stats_path)}))
        self.process = self.run.spawn(None, [sys.executable, "-m", "testbed.linux.tunrelay",
                                             str(config)], "delay-relay",
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        tuns = self._ready()
        for port in ports:
            self.netlink.relay_ingress(tuns[port.host], self.pid(port.owner), port.nic,
                                       self.spec.fabric.mtu, TXQLEN)

    def _ready(self) -> dict[str, str]:
        """The relay's devices by host, once it has said them."""
        proc = self.process
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 0.1)
            if ready:
                line = proc.stdout.readline()
                if line:
                    return json.loads(line)["tuns"]
            if proc.poll() is not None:
                err = proc.stderr.read().strip().splitlines()
                raise TestbedError("the hosts' delay relay exited with code "
                                   f"{proc.returncode}: {err[-1] if err else 'no message'}")
        raise TestbedError(f"the hosts' delay relay did not start within {READY_S:g} s")

    def counters(self) -> dict | None:
        """The relay's counters as last written (about every second; None: none yet)."""
        if self.stats_path is None:
            return None
        try:
            return json.loads(self.stats_path.read_text())
        except (OSError, ValueError):
            return None
