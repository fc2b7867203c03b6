"""Which datapath forwards at the switches (pure): ``emulator.datapath: auto`` resolved against
what the experiment asks and what the machine has, with the reason said."""

from __future__ import annotations

from testbed.model.spec import Datapath, TestbedSpec


def ebpf_refusals(spec: TestbedSpec, cluster: bool = False) -> list[str]:
    """What the experiment asks that the eBPF datapath does not offer yet (empty: nothing)."""
    out = []
    if cluster:
        out.append("a cluster")
    return out


def choose(spec: TestbedSpec, has_clsact: bool, cluster: bool = False,
           ovs_kernel: bool = False) -> tuple[Datapath, str]:
    """The datapath of ``spec`` (``auto`` resolved) and why: the fastest the machine has that
    offers what the experiment asks (bench/datapath.py, every datapath side by side in the
    full-kernel guest: Open vSwitch's kernel datapath 40 us per TCP packet-hop against the eBPF
    switches' 66, both 30 to 80 times the userspace Open vSwitch here).

    Args:
        spec: the testbed.
        has_clsact: whether this kernel has the clsact qdisc the eBPF switch hangs on.
        cluster: whether the fabric is partitioned over a cluster.
        ovs_kernel: whether this kernel has Open vSwitch's datapath module.
    """
    asked = spec.emulator.datapath
    if asked != Datapath.AUTO:
        return Datapath(asked), f"emulator.datapath: {asked}"
    if ovs_kernel:
        return Datapath.OVS, ("auto: ovs on the kernel datapath, the fastest here (about 1.5 "
                              "times the packets per CPU second of the eBPF switches, "
                              "bench/datapath.py)")
    refusals = ebpf_refusals(spec, cluster)
    if refusals:
        return Datapath.OVS, ("auto: ovs, since the eBPF datapath does not offer "
                              + ", ".join(refusals) + " yet")
    if not has_clsact:
        return Datapath.OVS, "auto: ovs, since this kernel has no clsact qdisc for eBPF switches"
    return Datapath.EBPF, ("auto: ebpf, the fastest here (about 30 times the packets per CPU "
                           "second of the userspace Open vSwitch, bench/datapath.py)")


def expected(spec: TestbedSpec, cluster: bool = False, ovs_kernel: bool = False) -> Datapath:
    """The datapath ``auto`` would pick on a machine with clsact (``validate``'s estimate)."""
    return choose(spec, True, cluster, ovs_kernel)[0]
