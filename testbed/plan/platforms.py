"""The CPU architectures fabriclab's eBPF programs are built and driven on (pure).

The programs themselves are architecture-neutral BPF; what differs per architecture is where
Debian keeps the kernel's own headers that they include (``asm/types.h`` under the multiarch
triplet) and the ``bpf()`` system call, which libbpf makes on each. Open vSwitch runs
wherever Debian ships it.
"""

from __future__ import annotations

#: ``uname -m`` -> Debian's multiarch triplet, for every architecture whose eBPF switches,
#: marker and link cuts are supported
EBPF_ARCHITECTURES = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu"}


def ebpf_supported(machine: str) -> bool:
    """Whether the eBPF datapath (switches, ECN marker, link cuts) runs on ``machine``."""
    return machine in EBPF_ARCHITECTURES


def multiarch(machine: str) -> str:
    """Debian's multiarch triplet of ``machine`` (``uname -m``).

    Raises:
        ValueError: an architecture the eBPF programs are not built for.
    """
    try:
        return EBPF_ARCHITECTURES[machine]
    except KeyError:
        raise ValueError(unsupported(machine)) from None


def unsupported(machine: str) -> str:
    """Why the eBPF datapath does not run on ``machine``."""
    return (f"the eBPF datapath runs on {' and '.join(sorted(EBPF_ARCHITECTURES))}; this "
            f"machine is {machine}")
