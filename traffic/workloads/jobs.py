"""Where ranks run (pure): a workload entry's rank hosts (a count, names, or a placement),
and several jobs on one fabric, each job's hosts by a placement policy, the jobs' hosts
disjoint, as a cluster scheduler hands them out.

* ``packed``: the free hosts in rank order (server by server, leaf by leaf): a job fills an
  access switch (or a server) before it takes the next;
* ``spread``: one host from each access switch in turn (on servers of GPUs: one server from
  each leaf in turn), so a job touches as many access switches as it can;
* ``random``: the free hosts shuffled by a seed;
* ``rail_aligned`` (servers of GPUs): whole servers, every GPU where NCCL numbers it (GPU
  ``g`` on rail ``g``), so the job's rings stay on their rails.

Jobs are placed in file order; a job's ``ranks`` may also name hosts or give a count from a
placement of its own.
"""

from __future__ import annotations

import random

from testbed.errors import ConfigError
from testbed.model.topology import Topology

POLICIES = ("packed", "spread", "random", "rail_aligned")
PLACEMENTS = ("contiguous", "strided", "random")  # a single entry's ranks: {count, placement}


def rank_servers(topo: Topology, ranks: tuple[str, ...]) -> tuple[int, ...] | None:
    """Each rank's server (None when the hosts are not servers' GPUs)."""
    if not topo.servers:
        return None
    return tuple(topo.server_of(h).index for h in ranks)


def whole_servers(topo: Topology, ranks: tuple[str, ...], path: str,
                  algorithm: str) -> tuple[int, int]:
    """(servers, GPUs each) of ranks that are whole servers in NCCL's order (every server's
    GPUs in local order, one server after the other), as a hierarchical schedule needs.

    Raises:
        ConfigError: at ``path`` otherwise.
    """
    if not topo.servers:
        raise ConfigError(path, f"the {algorithm} algorithm runs on servers of GPUs "
                                "(fabric.servers)")
    gpus = len(topo.servers[0].gpus)
    blocks = [ranks[i:i + gpus] for i in range(0, len(ranks), gpus)]
    for block in blocks:
        server = topo.server_of(block[0])
        if len(block) != gpus or server is None or tuple(block) != server.gpus:
            raise ConfigError(path, f"the {algorithm} algorithm needs whole servers in rank "
                                    f"order ({gpus} GPUs each, e.g. ranks: {2 * gpus}), got "
                                    f"{', '.join(block)}")
    return len(blocks), gpus


def place_ranks(topo: Topology, spec: object, path: str) -> tuple[str, ...]:
    """Rank hosts from a count, a host list, or ``{count, placement, seed}`` (a count takes the
    hosts in :meth:`Topology.rank_hosts` order: GPUs as NCCL numbers them)."""
    hosts = topo.rank_hosts()
    if isinstance(spec, list):
        for i, name in enumerate(spec):
            if not isinstance(name, str):
                raise ConfigError(f"{path}[{i}]", f"a host name, got {name!r}")
            if name not in topo.nodes or topo.nodes[name].is_switch:
                raise ConfigError(f"{path}[{i}]", f"no host {name!r} in this fabric "
                                                  f"(hosts: {hosts[0]} .. {hosts[-1]})")
            if topo.nic_owner(name) != name:
                raise ConfigError(f"{path}[{i}]", f"{name} is the plane-{topo.plane_of(name)} "
                                                  f"NIC of {topo.nic_owner(name)}: name the GPU")
        if len(set(spec)) != len(spec):
            raise ConfigError(path, "a host appears twice; one rank per host")
        chosen = list(spec)
    else:
        if isinstance(spec, int) and not isinstance(spec, bool):
            spec = {"count": spec}
        if not isinstance(spec, dict) or "count" not in spec:
            raise ConfigError(path, "give a rank count, a list of hosts, or "
                                    "{count, placement, seed}")
        count, placement = spec["count"], spec.get("placement", "contiguous")
        if placement not in PLACEMENTS:
            raise ConfigError(f"{path}.placement", f"unknown placement {placement!r}; expected "
                                                   f"one of {', '.join(PLACEMENTS)}")
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= len(hosts):
            raise ConfigError(f"{path}.count", f"must be between 2 and {len(hosts)} "
                                               f"(the fabric's hosts), got {count!r}")
        if placement == "contiguous":
            chosen = hosts[:count]
        elif placement == "strided":
            stride = len(hosts) // count
            chosen = hosts[::stride][:count]
        else:
            chosen = random.Random(spec.get("seed", 1)).sample(hosts, count)
    if len(chosen) < 2:
        raise ConfigError(path, f"a communicator needs at least 2 ranks, got {len(chosen)}")
    return tuple(chosen)


def place(topo: Topology, count: int, policy: str, taken: set[str], seed: int,
          path: str) -> tuple[str, ...]:
    """``count`` free hosts for one job by ``policy``.

    Raises:
        ConfigError: at ``path`` for an unknown policy, too few free hosts, or a
            ``rail_aligned`` job on a fabric without servers or of part of a server.
    """
    if policy not in POLICIES:
        raise ConfigError(f"{path}.placement", f"unknown placement {policy!r}; expected one "
                                               f"of {', '.join(POLICIES)}")
    free = [h for h in topo.rank_hosts() if h not in taken]
    if count > len(free):
        raise ConfigError(f"{path}.count", f"{count} ranks, but {len(free)} hosts are free "
                                           f"after the jobs before it")
    if policy == "packed":
        return tuple(free[:count])
    if policy == "random":
        return tuple(random.Random(seed).sample(free, count))
    units = _units(topo, free, policy, path, count)
    if policy == "rail_aligned":
        chosen = [h for unit in units[:count // len(units[0])] for h in unit]
        return tuple(chosen)
    chosen, turn = [], 0
    while len(chosen) < count:  # spread: one from each access switch in turn
        unit = units[turn % len(units)]
        if unit:
            chosen.append(unit.pop(0))
        turn += 1
    return tuple(chosen)


def _units(topo: Topology, free: list[str], policy: str, path: str,
           count: int) -> list[list[str]]:
    """What a policy deals out: whole free servers (rail_aligned), or per access switch its
    free hosts (spread; on servers of GPUs its free servers' GPUs, a server at a time)."""
    if policy == "rail_aligned":
        if not topo.servers:
            raise ConfigError(f"{path}.placement", "rail_aligned places whole servers of GPUs "
                                                   "(fabric.servers)")
        free_set = set(free)
        servers = [list(s.gpus) for s in topo.servers if set(s.gpus) <= free_set]
        gpus = len(topo.servers[0].gpus)
        if count % gpus or count // gpus > len(servers):
            raise ConfigError(f"{path}.count", f"rail_aligned takes whole servers: {count} "
                                               f"ranks are not a multiple of {gpus} GPUs, or "
                                               f"more than the {len(servers)} free servers")
        return servers
    by_switch: dict[str, list[str]] = {}
    for host in free:
        by_switch.setdefault(topo.attachment(topo.nics(host)[0]).node, []).append(host)
    return list(by_switch.values())


BASELINES = ("alone", "none")


def job_hosts(topo: Topology, spec: object, need: int, taken: set[str],
              path: str) -> tuple[str, ...]:
    """A named job's hosts from its ``ranks`` (default: ``need`` hosts, packed), disjoint
    from the jobs' before it."""
    if isinstance(spec, list):
        for i, host in enumerate(spec):
            if host in taken:
                raise ConfigError(f"{path}[{i}]", f"{host} belongs to a job before this one")
        return tuple(spec)  # checked as rank hosts by the entry's own placement
    if spec is None:
        spec = need
    if isinstance(spec, int) and not isinstance(spec, bool):
        spec = {"count": spec}
    if not isinstance(spec, dict) or not isinstance(spec.get("count"), int):
        raise ConfigError(path, "give a rank count, host names, or {count, placement, seed}")
    return place(topo, spec["count"], spec.get("placement", "packed"), taken,
                 spec.get("seed", 1), path)


def log_schedules(entries: list[tuple[dict, str]], ranks: int, build_one) -> list[tuple]:
    """An NCCL log's collectives as (entry, schedule over the job's ``ranks``): a
    collective of fewer ranks on the first of them, a send/recv from rank 0 to 1."""
    from traffic.workloads.schedules import merge

    out = []
    for entry, where in entries:
        n = entry["ranks"]
        if n > ranks:
            raise ConfigError(where, f"a collective of {n} ranks in a job of {ranks}")
        sched = build_one(entry, n, where)
        if n < ranks:
            sched = merge([(sched, list(range(n)))], ranks)
        out.append((entry, sched))
    return out
