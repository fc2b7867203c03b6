"""``emulator.datapath: auto`` (testbed/plan/datapaths.py) and each datapath's measured budget
in the fidelity model (testbed/plan/fidelity.py)."""

from __future__ import annotations

import pytest
import yaml

from fabriclab.model import experiment as xp
from testbed.errors import ConfigError
from testbed.model.spec import Datapath
from testbed.plan import datapaths
from testbed.plan.platforms import multiarch
from testbed.plan.fidelity import assess, saturation_table

BASE = ("version: 1\nfabric: {topology: fat_tree, k: 4, host_link: {rate_mbps: 100}, "
        "fabric_link: {rate_mbps: 100}, mtu: 9000")


def _exp(fabric_extra: str = "", datapath: str = "auto") -> xp.Experiment:
    return xp.parse(yaml.safe_load(BASE + fabric_extra + "}\n"
                                   f"emulator: {{datapath: {datapath}}}\n"))


def _choose(exp, clsact=True, ovs_kernel=False, machine="x86_64"):
    return datapaths.choose(exp, clsact, ovs_kernel, machine)


def test_auto_takes_the_fastest_datapath_the_machine_has_and_says_why():
    chosen, why = _choose(_exp())
    assert chosen == Datapath.EBPF and why.startswith("auto: ebpf")
    pfc = _exp(", traffic_classes: {dscp_to_priority: {26: 3}}, pfc: {priorities: [3]}")
    assert _choose(pfc)[0] == Datapath.EBPF
    chosen, why = _choose(_exp(), clsact=False)
    assert chosen == Datapath.OVS and "clsact" in why
    # where Open vSwitch's kernel datapath exists it is the fastest
    chosen, why = _choose(_exp(), ovs_kernel=True)
    assert chosen == Datapath.OVS and "kernel datapath" in why
    # a datapath asked by name is kept, whatever the machine
    assert _choose(_exp(datapath="ovs"))[0] == Datapath.OVS
    assert _choose(_exp(datapath="ebpf"), clsact=False)[0] == Datapath.EBPF


def test_the_cpu_architecture_decides_whether_the_ebpf_datapath_runs():
    assert _choose(_exp(), machine="aarch64")[0] == Datapath.EBPF
    chosen, why = _choose(_exp(), machine="riscv64")
    assert chosen == Datapath.OVS and "riscv64" in why and "x86_64" in why
    with pytest.raises(ConfigError) as err:
        _choose(_exp(datapath="ebpf"), machine="ppc64le")
    assert err.value.path == "emulator.datapath" and "ppc64le" in str(err.value)
    assert _choose(_exp(datapath="ovs"), machine="ppc64le")[0] == Datapath.OVS
    assert multiarch("aarch64") == "aarch64-linux-gnu"
    with pytest.raises(ValueError, match="s390x"):
        multiarch("s390x")


def test_the_fidelity_budget_is_the_datapaths_own():
    exp = _exp()  # 16 hosts at 100 Mbit/s: far over the userspace budget, well inside eBPF's
    ovs = assess(exp.topology, 9000, saturation_table("ovs"))
    ebpf = assess(exp.topology, 9000, saturation_table("ebpf"))
    assert ovs.overloaded and not ebpf.overloaded and ebpf.fits
    assert ebpf.saturation_mbit_hops >= 10 * ovs.saturation_mbit_hops
