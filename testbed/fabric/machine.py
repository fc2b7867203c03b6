"""This machine against what a fabric asks of it, before anything is built: the kernel's
capabilities for every setting, ``emulator.datapath: auto`` resolved, and the fabric's full
load against the machine's forwarding budget on that datapath (the fidelity check)."""

from __future__ import annotations

import platform
from dataclasses import replace

from testbed.errors import ConfigError
from testbed.linux import capabilities, ovs
from testbed.model.spec import Datapath, Fidelity, TestbedSpec
from testbed.plan import datapaths
from testbed.plan.fidelity import FidelityVerdict, assess, saturation_table


def check_requirements(spec: TestbedSpec, caps: capabilities.Capabilities) -> None:
    """Every setting's kernel requirement (a qdisc, a TCP congestion control) here.

    Raises:
        ConfigError: naming the field whose requirement this kernel does not meet.
    """
    for need in spec.requirements():
        if not caps.has(need):
            raise ConfigError(need.field, caps.explain_missing(need))


def resolve_datapath(spec: TestbedSpec, caps: capabilities.Capabilities | None,
                     builds_switches: bool = True) -> tuple[TestbedSpec, str]:
    """``spec`` with its datapath resolved (:func:`testbed.plan.datapaths.choose`; ``caps``
    None: a machine that builds nothing) and why; Open vSwitch checked running where this
    machine builds switches (``builds_switches``; a cluster's coordinator decides for its
    machines and builds none) and they are its bridges."""
    chosen, why = datapaths.choose(
        spec, caps is None or caps.has_qdisc("clsact"),
        caps is not None and caps.ovs_kernel_datapath,
        caps.machine if caps is not None else platform.machine())
    if chosen != spec.emulator.datapath:
        spec = replace(spec, emulator=replace(spec.emulator, datapath=chosen))
    if caps is not None and builds_switches and chosen != Datapath.EBPF:
        ovs.check_running()  # the eBPF switches need no Open vSwitch
    return spec, why


def check_fidelity(spec: TestbedSpec, ovs_datapath: str) -> tuple[FidelityVerdict | None, str]:
    """The fabric's full load against this machine's budget, as measured for its datapath
    (Open vSwitch's kernel datapath has none measured): the verdict (None: not assessed) and
    a warning when it does not fit ("" when it does).

    Raises:
        ConfigError: past the saturation point under ``emulator.fidelity: strict``.
    """
    mode = spec.emulator.fidelity
    ebpf = spec.emulator.datapath == Datapath.EBPF
    if (ovs_datapath != "netdev" and not ebpf) or mode == Fidelity.OFF:
        return None, ""
    verdict = assess(spec.topology, spec.fabric.mtu, saturation_table(spec.emulator.datapath))
    if verdict.overloaded and mode == Fidelity.STRICT:
        raise ConfigError("fabric.host_link.rate_mbps",
                          f"too fast for this machine: {verdict.explain()}. Lower the rates, "
                          "or set emulator.fidelity: warn to measure the emulator anyway")
    if verdict.fits:
        return verdict, ""
    return verdict, (f"fidelity: {verdict.explain()}; measured numbers may describe the "
                     "emulator rather than the fabric")
