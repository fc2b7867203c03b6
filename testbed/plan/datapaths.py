"""Which datapath forwards at the switches (pure): ``emulator.datapath: auto`` resolved against
what the machine has, with the reason said."""

from __future__ import annotations

from testbed.errors import ConfigError
from testbed.model.spec import Datapath, Routing, TestbedSpec
from testbed.plan.platforms import ebpf_supported, unsupported


def choose(spec: TestbedSpec, has_clsact: bool, ovs_kernel: bool,
           machine: str) -> tuple[Datapath, str]:
    """The datapath of ``spec`` (``auto`` resolved) and why: the fastest the machine has
    (bench/datapath.py, every datapath side by side in the full-kernel guest: Open vSwitch's
    kernel datapath 41 us per TCP packet-hop against the eBPF switches' 66, both 10 to 20
    times cheaper than the userspace Open vSwitch there). Every datapath offers every
    feature, on one machine and over a cluster, but switch-local adaptive routing
    (``controller.routing: local_adaptive``), which the eBPF switches alone have.

    Args:
        spec: the testbed.
        has_clsact: whether this kernel has the clsact qdisc the eBPF switch hangs on.
        ovs_kernel: whether this kernel has Open vSwitch's datapath module.
        machine: the CPU architecture (``uname -m``).

    Raises:
        ConfigError: ``ebpf`` asked for on an architecture it does not run on.
    """
    asked = spec.emulator.datapath
    if asked == Datapath.EBPF and not ebpf_supported(machine):
        raise ConfigError("emulator.datapath", f"ebpf: {unsupported(machine)} (auto or ovs "
                          "run here)")
    local = spec.controller.own and spec.controller.routing == Routing.LOCAL_ADAPTIVE
    if local and asked == Datapath.OVS:
        raise ConfigError("controller.routing", "local_adaptive: Open vSwitch's groups choose "
                          "by hash only; the switches' own load-aware choice needs "
                          "emulator.datapath: ebpf (or auto)")
    if asked != Datapath.AUTO:
        return Datapath(asked), f"emulator.datapath: {asked}"
    if local:
        if not has_clsact or not ebpf_supported(machine):
            raise ConfigError("controller.routing", "local_adaptive needs the eBPF switches, "
                              "and " + ("this kernel has no clsact qdisc" if not has_clsact
                                        else unsupported(machine)))
        return Datapath.EBPF, ("auto: ebpf, the only datapath whose switches choose by their "
                               "ports' load (controller.routing: local_adaptive)")
    if ovs_kernel:
        return Datapath.OVS, ("auto: ovs on the kernel datapath, the fastest here (about 1.5 "
                              "times the packets per CPU second of the eBPF switches, "
                              "bench/datapath.py)")
    if not has_clsact:
        return Datapath.OVS, "auto: ovs, since this kernel has no clsact qdisc for eBPF switches"
    if not ebpf_supported(machine):
        return Datapath.OVS, f"auto: ovs, since {unsupported(machine)}"
    return Datapath.EBPF, ("auto: ebpf, the fastest here (about 30 times the packets per CPU "
                           "second of the userspace Open vSwitch, bench/datapath.py)")


def expected(spec: TestbedSpec, ovs_kernel: bool, machine: str) -> Datapath:
    """The datapath ``auto`` would pick on a machine with clsact (``validate``'s estimate)."""
    return choose(spec, True, ovs_kernel, machine)[0]
