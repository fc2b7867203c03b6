"""Probe what the running kernel can do for a fabric, once per boot.

Qdiscs are probed by asking the kernel to create each kind, without options, on the loopback
device of a throwaway anonymous network namespace: ENOENT means the kind is unknown to this kernel (its
module is missing), anything else means the kind exists. The OVS kernel datapath exists when the
``ovs_datapath`` generic-netlink family does. Results are cached in the state directory keyed by
the boot id, so a reboot (or a new kernel) probes again.
"""

from __future__ import annotations

import errno
import json
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

from pyroute2 import GenericNetlinkSocket, IPRoute
from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTM_NEWQDISC
from pyroute2.netlink.rtnl.tcmsg import tcmsg

from testbed.linux.files import write_json_atomic
from testbed.linux.rawnl import in_netns
from testbed.model.spec import Requirement
from testbed.stops import held

PROBED_QDISCS = ("htb", "tbf", "pfifo", "bfifo", "netem", "red", "fq_codel", "fq", "sfq",
                 "prio", "cake", "clsact", "ingress")
_PARENT = {"clsact": 0xFFFFFFF1, "ingress": 0xFFFFFFF1}


@dataclass
class Capabilities:
    """What this machine offers to a fabric."""

    kernel: str
    ovs_kernel_datapath: bool
    qdiscs: dict[str, bool] = field(default_factory=dict)
    tcp_congestion: list[str] = field(default_factory=list)  # available TCP congestion controls
    machine: str = field(default_factory=platform.machine)  # the CPU architecture (uname -m)

    @property
    def datapath_type(self) -> str:
        """``system`` (kernel datapath) where the kernel has it, else ``netdev`` (userspace)."""
        return "system" if self.ovs_kernel_datapath else "netdev"

    def has_qdisc(self, kind: str) -> bool:
        return self.qdiscs.get(kind, False)

    def has(self, requirement: Requirement) -> bool:
        """Whether this machine offers what a setting needs."""
        if requirement.kind == "tcp_cc":
            return requirement.name in self.tcp_congestion
        return self.has_qdisc(requirement.name)

    def explain_missing(self, requirement: Requirement) -> str:
        """Why a requirement fails here, for the error that names its field."""
        if requirement.kind == "tcp_cc":
            return (f"needs TCP congestion control '{requirement.name}', which this kernel "
                    f"({self.kernel}) does not have (available: "
                    f"{', '.join(self.tcp_congestion)}; the vm backend's guest has dctcp)")
        return (f"needs the '{requirement.name}' qdisc, which this kernel ({self.kernel}) does "
                f"not have (module sch_{requirement.name} missing)")


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def probe_qdiscs() -> dict[str, bool]:
    """Which qdisc kinds the kernel knows, tried in a throwaway namespace (stops held off
    meanwhile: testbed.stops)."""
    with held():
        with in_netns(None):  # anonymous: gone when the socket closes
            ipr = IPRoute()
        with ipr:
            lo = ipr.link_lookup(ifname="lo")[0]
            ipr.link("set", index=lo, state="up")
            return {kind: _qdisc_known(ipr, lo, kind) for kind in PROBED_QDISCS}


def _qdisc_known(ipr: IPRoute, index: int, kind: str) -> bool:
    msg = tcmsg()
    msg["index"] = index
    msg["handle"] = 0xFFFF0000 if kind in _PARENT else 0x50000
    msg["parent"] = _PARENT.get(kind, 0xFFFFFFFF)
    msg["attrs"] = [["TCA_KIND", kind]]
    ipr.status["nlm_generator"] = False  # pyroute2 0.9's sync nlm_request reads this key
    try:
        ipr.nlm_request(msg, msg_type=RTM_NEWQDISC,
                        msg_flags=NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL)
    except NetlinkError as err:
        return err.code != errno.ENOENT
    ipr.tc("del", index=index, handle=msg["handle"], parent=msg["parent"])
    return True


def probe_tcp_congestion() -> list[str]:
    """The TCP congestion controls the kernel offers (built in or loaded)."""
    try:
        return Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split()
    except OSError:
        return []


def probe_ovs_kernel_datapath() -> bool:
    sock = GenericNetlinkSocket()
    try:
        sock.bind("ovs_datapath", None)
        return True
    except NetlinkError:
        return False
    finally:
        sock.close()


def probe(state_dir: Path, refresh: bool = False) -> Capabilities:
    """Return the machine's capabilities, probing the kernel once per boot (the cache in
    ``state_dir`` is keyed by the boot id; an unreadable cache is probed again)."""
    cache = state_dir / "capabilities.json"
    boot = _boot_id()
    kernel = os.uname().release
    cached = None
    if cache.exists() and not refresh:
        try:
            cached = json.loads(cache.read_text())
        except (OSError, ValueError):
            cached = None
    if (isinstance(cached, dict) and cached.get("boot_id") == boot
            and isinstance(cached.get("qdiscs"), dict) and "ovs_kernel_datapath" in cached):
        caps = Capabilities(kernel, cached["ovs_kernel_datapath"], qdiscs=cached["qdiscs"])
    else:
        caps = Capabilities(kernel, probe_ovs_kernel_datapath(), qdiscs=probe_qdiscs())
        state_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(cache, {"boot_id": boot, "kernel": kernel,
                                  "ovs_kernel_datapath": caps.ovs_kernel_datapath,
                                  "qdiscs": caps.qdiscs})
    caps.tcp_congestion = probe_tcp_congestion()  # a file read: cheap, and modules may load
    return caps
