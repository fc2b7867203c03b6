"""Pure hierarchical schedules for servers of GPUs (NCCL's hierarchical collectives): rank
``r`` is GPU ``r % gpus`` of server ``r // gpus``, as NCCL numbers local ranks, and GPU ``i`` of every
server is on rail ``i`` (its scale-out NIC's rail switch).

* all_reduce ``hierarchical`` (NCCL's on rail-optimized fabrics): an intra-server ring
  reduce-scatter (``g - 1`` steps of ``size / g``; GPU ``i`` ends owning chunk ``i``), then on
  every rail a ring all-reduce of that chunk across the servers (``2 (S - 1)`` steps of
  ``size / (g S)``), then an intra-server ring all-gather. Per GPU: ``2 (g - 1) / g x size``
  inside the server and ``2 (S - 1) / (S g) x size`` over the scale-out network, against
  ``2 (N - 1) / N x size`` for a flat ring over all ``N = S g`` GPUs, whose links between
  servers carry that much each.
* all_gather / reduce_scatter ``hierarchical``: the matching halves.
* all_to_all ``pxn``: the data for GPU ``j`` of another server first moves inside the server
  to the local GPU ``j`` (scale-up), which sends it on rail ``j`` (same-rail scale-out), as
  NCCL's PXN does; the direct all-to-all's cross-rail traffic crosses the spines instead.

Step numbering follows :mod:`traffic.workloads.schedules`: a rank starts step ``s`` once every receive of
its step ``s - 1`` is in; the rails' and servers' rings run in the same steps.
"""

from __future__ import annotations

from traffic.workloads.schedules import Schedule, chunk_sizes


def _check(servers: int, gpus: int) -> None:
    if servers < 1 or gpus < 1 or servers * gpus < 2:
        raise ValueError(f"a hierarchy needs at least 2 GPUs, got {servers} x {gpus}")


def _ring(sched: Schedule, members: list[int], chunks: list[int], first_step: int,
          offset: int) -> int:
    """``len(members) - 1`` ring steps among ``members``: at step s member k sends chunk
    ``(k - s + offset) mod m`` to member k + 1; returns the next free step."""
    m = len(members)
    for s in range(m - 1):
        for k in range(m):
            sched.add(first_step + s, members[k], members[(k + 1) % m],
                      chunks[(k - s + offset) % m])
    return first_step + m - 1


def _servers(servers: int, gpus: int) -> list[list[int]]:
    return [[s * gpus + i for i in range(gpus)] for s in range(servers)]


def _rails(servers: int, gpus: int) -> list[list[int]]:
    return [[s * gpus + i for s in range(servers)] for i in range(gpus)]


def _intra(sched: Schedule, servers: int, gpus: int, local: list[int], step: int,
           offset: int) -> int:
    """One ring phase inside every server at once (offset 0: reduce-scatter, GPU ``i`` ends
    owning chunk ``i + 1 mod g``; 1: all-gather); returns the next free step."""
    if gpus == 1:
        return step
    return max(_ring(sched, members, local, step, offset)
               for members in _servers(servers, gpus))


def _across(sched: Schedule, servers: int, gpus: int, local: list[int], step: int,
            offsets: tuple[int, ...]) -> int:
    """Ring phases across the servers on every rail at once, each rail on the chunk its GPUs
    own (offsets: 0 reduce-scatter, 1 all-gather); returns the next free step."""
    if servers == 1:
        return step
    nxt = step
    for i, rail in enumerate(_rails(servers, gpus)):
        owned, at = chunk_sizes(local[(i + 1) % gpus], servers), step
        for offset in offsets:
            at = _ring(sched, rail, owned, at, offset)
        nxt = max(nxt, at)
    return nxt


def all_reduce(servers: int, gpus: int, size_bytes: int) -> Schedule:
    """Hierarchical all-reduce (see the module docstring)."""
    _check(servers, gpus)
    sched = Schedule("all_reduce", "hierarchical", servers * gpus, size_bytes)
    local = chunk_sizes(size_bytes, gpus)
    step = _intra(sched, servers, gpus, local, 0, 0)
    step = _across(sched, servers, gpus, local, step, (0, 1))
    _intra(sched, servers, gpus, local, step, 1)
    return sched


def reduce_scatter(servers: int, gpus: int, size_bytes: int) -> Schedule:
    """Hierarchical reduce-scatter: inside the servers, then across each rail."""
    _check(servers, gpus)
    sched = Schedule("reduce_scatter", "hierarchical", servers * gpus, size_bytes)
    local = chunk_sizes(size_bytes, gpus)
    _across(sched, servers, gpus, local, _intra(sched, servers, gpus, local, 0, 0), (0,))
    return sched


def all_gather(servers: int, gpus: int, size_bytes: int) -> Schedule:
    """Hierarchical all-gather: across each rail, then inside the servers."""
    _check(servers, gpus)
    sched = Schedule("all_gather", "hierarchical", servers * gpus, size_bytes)
    local = chunk_sizes(size_bytes, gpus)
    _intra(sched, servers, gpus, local, _across(sched, servers, gpus, local, 0, (1,)), 1)
    return sched


def all_to_all_pxn(servers: int, gpus: int, size_bytes: int) -> Schedule:
    """All-to-all with PXN: step 0 moves, inside each server, what GPU ``i`` has for GPU ``j``
    of every other server to the local GPU ``j`` (and delivers its own server's share); step 1
    sends each rail's gathered data to the same rail of every other server."""
    _check(servers, gpus)
    n = servers * gpus
    sched = Schedule("all_to_all", "pxn", n, size_bytes)
    per_peer = chunk_sizes(size_bytes, n)
    for s in range(servers):
        for i in range(gpus):
            src = s * gpus + i
            for j in range(gpus):
                if j == i:
                    continue
                # its own server's GPU j, plus GPU j of every other server, through the local j
                nbytes = sum(per_peer[t * gpus + j] for t in range(servers))
                sched.add(0, src, s * gpus + j, nbytes)
    for s in range(servers):
        for j in range(gpus):
            proxy = s * gpus + j
            for t in range(servers):
                if t != s:  # everything server s has for GPU j of server t, on rail j
                    sched.add(1, proxy, t * gpus + j, per_peer[t * gpus + j] * gpus)
    return sched


def scale_out_bytes(sched: Schedule, gpus: int) -> int:
    """Bytes a schedule moves between servers (over the scale-out network)."""
    return bytes_between(sched, [r // gpus for r in range(sched.communicator_size)])


def bytes_between(sched: Schedule, group: list[int] | tuple[int, ...]) -> int:
    """Bytes a schedule moves between ranks of different groups (``group[r]``: rank ``r``'s)."""
    return sum(t.nbytes for t in sched.transfers if group[t.src] != group[t.dst])


#: (op, algorithm) -> its builder ``(servers, gpus, size_bytes)``
BUILDERS = {("all_reduce", "hierarchical"): all_reduce,
            ("reduce_scatter", "hierarchical"): reduce_scatter,
            ("all_gather", "hierarchical"): all_gather,
            ("all_to_all", "pxn"): all_to_all_pxn}

