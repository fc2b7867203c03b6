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


def choose(spec: TestbedSpec, has_clsact: bool, cluster: bool = False) -> tuple[Datapath, str]:
    """The datapath of ``spec`` (``auto`` resolved) and why.

    Args:
        spec: the testbed.
        has_clsact: whether this kernel has the clsact qdisc the eBPF switch hangs on.
        cluster: whether the fabric is partitioned over a cluster.
    """
    asked = spec.emulator.datapath
    if asked != Datapath.AUTO:
        return Datapath(asked), f"emulator.datapath: {asked}"
    refusals = ebpf_refusals(spec, cluster)
    if refusals:
        return Datapath.OVS, ("auto: ovs, since the eBPF datapath does not offer "
                              + ", ".join(refusals) + " yet")
    if not has_clsact:
        return Datapath.OVS, "auto: ovs, since this kernel has no clsact qdisc for eBPF switches"
    return Datapath.EBPF, ("auto: ebpf, the fastest here (about 30 times the packets per CPU "
                           "second of the userspace Open vSwitch, bench/datapath.py)")


def expected(spec: TestbedSpec, cluster: bool = False) -> Datapath:
    """The datapath ``auto`` would pick on a machine with clsact (``validate``'s estimate)."""
    return choose(spec, True, cluster)[0]
