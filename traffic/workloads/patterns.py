"""Pure traffic patterns: which host sends to which, as (source, destination) host-name pairs.

Every pattern is a permutation or a partial one (each host sends at most one flow and receives at
most one), which is what capacity and ECMP experiments want: with one flow per host link, any
shortfall is the fabric's (or the emulator's), not the host's.

* ``same_edge``: each host sends to the next host on its own access switch (1 switch hop).
* ``same_pod``: fat-tree host (p, e, i) sends to (p, e+1, i): 3 switch hops, never leaves the pod.
* ``cross_pod``: host (p, e, i) sends to (p+1, e, i) (fat-tree, 5 switch hops) or leaf l's host i
  to leaf l+1's host i (leaf-spine, 3 hops). Under destination-based ``dmodk`` routing these paths
  are link-disjoint, so the pattern is non-blocking.
* ``permutation``: a random derangement with a seed (the classic ECMP stress test).
* ``stride``: host j sends to host j + stride (modulo the host count), in topology order.
* ``incast``: every other host sends to the first one (``fan_in`` senders, default all).
"""

from __future__ import annotations

import random

from testbed.errors import ConfigError
from testbed.model.topology import Node, Topology

PATTERNS = ("same_edge", "same_pod", "cross_pod", "permutation", "stride", "incast")

Pairs = list[tuple[str, str]]


def _coordinates(topo: Topology) -> dict[str, tuple[int, int, int]]:
    """host -> (group, access switch index within the group, host index), all from 0."""
    coords = {}
    for host in topo.hosts:
        if topo.nic_owner(host.name) != host.name:  # a multi-plane GPU's other NIC
            continue
        access: Node = topo.nodes[topo.attachment(host.name).node]
        group = access.group - 1 if topo.kind == "fat_tree" else 0
        coords[host.name] = (group, access.index - 1, host.index - 1)
    return coords


def _shift(topo: Topology, axis: int, field: str) -> Pairs:
    coords = _coordinates(topo)
    by_coord = {c: name for name, c in coords.items()}
    size = 1 + max(c[axis] for c in coords.values())
    if size < 2:
        raise ConfigError(field, f"needs at least 2 {('groups', 'switches', 'hosts')[axis]} "
                                 f"along this axis; this fabric has {size}")
    pairs = []
    for name, c in coords.items():
        target = list(c)
        target[axis] = (c[axis] + 1) % size
        dst = by_coord.get(tuple(target))
        if dst is not None and dst != name:
            pairs.append((name, dst))
    return pairs


def pattern_pairs(topo: Topology, pattern: str, seed: int = 1, stride: int = 1,
                  field: str = "pattern", fan_in: int | None = None) -> Pairs:
    """The (source, destination) pairs of a named pattern on ``topo``.

    Args:
        topo: the fabric.
        pattern: one of :data:`PATTERNS`.
        seed: random seed of ``permutation``.
        stride: offset of ``stride``.
        fan_in: senders of ``incast`` (default: every other host).
        field: the config field path named in errors.

    Returns:
        Pairs in topology order of the source.

    Raises:
        ConfigError: for an unknown pattern or one the fabric cannot carry.
    """
    hosts = [h.name for h in topo.hosts if topo.nic_owner(h.name) == h.name]  # by attachment
    if len(hosts) < 2:
        raise ConfigError(field, "needs at least 2 hosts")
    if pattern == "same_edge":
        return _shift(topo, 2, field)
    if pattern == "same_pod":
        if topo.kind != "fat_tree":
            raise ConfigError(field, "same_pod needs a fat_tree (a leaf-spine has no pods)")
        return _shift(topo, 1, field)
    if pattern == "cross_pod":
        return _shift(topo, 0 if topo.kind == "fat_tree" else 1, field)
    if pattern == "permutation":
        return random_derangement(hosts, seed)
    if pattern == "stride":
        if stride % len(hosts) == 0:
            raise ConfigError(field, f"stride {stride} maps every host onto itself "
                                     f"({len(hosts)} hosts)")
        return [(h, hosts[(i + stride) % len(hosts)]) for i, h in enumerate(hosts)]
    if pattern == "incast":
        senders = len(hosts) - 1 if fan_in is None else fan_in
        if not 1 <= senders < len(hosts):
            raise ConfigError(field, f"incast fan_in must be between 1 and {len(hosts) - 1}, "
                                     f"got {senders}")
        return [(h, hosts[0]) for h in hosts[1:senders + 1]]
    raise ConfigError(field, f"unknown pattern {pattern!r}; expected one of {', '.join(PATTERNS)}")


def random_derangement(hosts: list[str], seed: int) -> Pairs:
    """A uniformly random permutation of ``hosts`` without fixed points."""
    rng = random.Random(seed)
    while True:
        targets = hosts[:]
        rng.shuffle(targets)
        if all(a != b for a, b in zip(hosts, targets)):
            return list(zip(hosts, targets))
