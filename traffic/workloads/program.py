"""A program of the user's as a workload (pure): ``workload.program`` (or ``fabriclab launch``)
parsed into its ranks, each with its host, argv and the environment a distributed launcher
gives it (torchrun's: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``GROUP_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``).

```yaml
workload:
  program:
    argv: [python3, bench.py, --size, 40MiB]   # {rank} and {host} are replaced in each rank's
    ranks: 16          # hosts, as a collective's ranks: a count, a list, {count, placement}
    per_host: 1        # ranks on each host (LOCAL_RANK 0 .. per_host-1)
    env: {OMP_NUM_THREADS: "1"}
    timeout_s: 600     # a rank still running then fails the run
    cwd: .             # relative to the experiment file's folder
    master_port: 29500
```

Rank r runs on host ``hosts[r // per_host]`` (its ``GROUP_RANK``, torchrun's node rank), as
local rank ``r % per_host``; ``MASTER_ADDR`` is rank 0's host's address. Errors are
:class:`ConfigError` naming the field.

What the program measured, it reports on rank 0's stdout, one line per collective run:

    #fabriclab op=all_reduce bytes=41943040 time_us=6512345.2 algorithm=ring order=reverse

``op``, ``bytes`` (NCCL-tests' size) and ``time_us`` (first rank's start to last rank's end)
are required; ``algorithm`` (the schedule it used, as a collective's), ``order=reverse`` (a
ring that sends to the rank before, as gloo's does), ``hosts`` (the hosts of its ranks in
rank order, comma-separated: a launcher such as ``mpirun`` placed them, not fabriclab) and
``label`` are optional (:func:`reported`). A training loop reports its iterations the same way:

    #fabriclab iteration=3 time_s=0.8412
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from testbed.errors import ConfigError
from testbed.model.topology import Topology
from traffic.workloads.jobs import place_ranks
from traffic.workloads.schedules import ALGORITHMS

DEFAULT_TIMEOUT_S = 600.0
DEFAULT_MASTER_PORT = 29500
#: most ranks one host runs (a host is one network namespace on a few cores)
MAX_PER_HOST = 64
#: the longest argv and environment a program may have (as execve takes them, roughly)
MAX_ARGS = 4096


@dataclass(frozen=True)
class Rank:
    """One process of the program: where it runs, what it runs, and its environment."""

    rank: int
    host: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Program:
    """The program: its argv (with ``{rank}`` and ``{host}`` left to fill), its hosts in rank
    order, ranks per host, and how it runs."""

    argv: tuple[str, ...]
    hosts: tuple[str, ...]
    per_host: int = 1
    env: tuple[tuple[str, str], ...] = ()
    timeout_s: float = DEFAULT_TIMEOUT_S
    cwd: str | None = None
    master_port: int = DEFAULT_MASTER_PORT

    @property
    def world_size(self) -> int:
        return len(self.hosts) * self.per_host

    def ranks(self, addresses: dict[str, str]) -> list[Rank]:
        """Every rank, with its argv filled and its environment (``addresses``: each host's
        IPv4 address)."""
        master = addresses[self.hosts[0]]
        out = []
        for node, host in enumerate(self.hosts):
            for local in range(self.per_host):
                rank = node * self.per_host + local
                env = {"RANK": str(rank), "WORLD_SIZE": str(self.world_size),
                       "LOCAL_RANK": str(local), "LOCAL_WORLD_SIZE": str(self.per_host),
                       "GROUP_RANK": str(node), "NODE_RANK": str(node),
                       "MASTER_ADDR": master, "MASTER_PORT": str(self.master_port),
                       "FABRICLAB_HOST": host, "FABRICLAB_HOST_ADDR": addresses[host],
                       **dict(self.env)}
                argv = tuple(a.replace("{rank}", str(rank)).replace("{host}", host)
                             for a in self.argv)
                out.append(Rank(rank, host, argv, env))
        return out


def parse_program(topo: Topology, raw: dict, base_dir: str = ".",
                  path: str = "workload.program") -> Program:
    """The program of a ``workload.program`` section (its shape checked by the schema).

    Raises:
        ConfigError: naming the field of the first problem.
    """
    argv = raw.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise ConfigError(f"{path}.argv", "a non-empty list of strings (the program and its "
                                          "arguments)")
    if not argv[0].strip():
        raise ConfigError(f"{path}.argv[0]", "an empty program name")
    per_host = raw.get("per_host", 1)
    if not isinstance(per_host, int) or isinstance(per_host, bool) or \
            not 1 <= per_host <= MAX_PER_HOST:
        raise ConfigError(f"{path}.per_host", f"must be between 1 and {MAX_PER_HOST}, got "
                                              f"{per_host!r}")
    if "hosts" in raw and "ranks" in raw:
        raise ConfigError(path, "give ranks or hosts, not both")
    if "hosts" in raw:
        hosts = _place(topo, raw["hosts"], f"{path}.hosts")
    else:
        spec = raw.get("ranks", len(topo.rank_hosts()) * per_host)
        hosts = _place(topo, _hosts_spec(spec, per_host, f"{path}.ranks"), f"{path}.ranks")
    env = raw.get("env") or {}
    if not isinstance(env, dict):
        raise ConfigError(f"{path}.env", "a map of variable names to values")
    for name, value in env.items():
        if not isinstance(name, str) or not name or "=" in name or "\0" in name:
            raise ConfigError(f"{path}.env", f"{name!r} is not a variable name")
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"{path}.env.{name}", "a string or a number")
    if sum(len(a) for a in argv) + sum(len(k) + len(str(v)) for k, v in env.items()) > \
            MAX_ARGS * 64:
        raise ConfigError(path, "argv and env are too long for a process to be given them")
    timeout_s = raw.get("timeout_s", DEFAULT_TIMEOUT_S)
    if not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool) or \
            not 0 < timeout_s <= 7 * 86400:
        raise ConfigError(f"{path}.timeout_s", f"seconds, more than 0 and at most a week, got "
                                               f"{timeout_s!r}")
    port = raw.get("master_port", DEFAULT_MASTER_PORT)
    if not isinstance(port, int) or isinstance(port, bool) or not 1024 <= port <= 65535:
        raise ConfigError(f"{path}.master_port", f"a port from 1024 to 65535, got {port!r}")
    cwd = raw.get("cwd")
    if cwd is not None:
        if not isinstance(cwd, str) or not cwd:
            raise ConfigError(f"{path}.cwd", "a directory")
        cwd = os.path.normpath(os.path.join(base_dir, cwd))
    return Program(tuple(argv), tuple(hosts), per_host,
                   tuple(sorted((k, str(v)) for k, v in env.items())), float(timeout_s), cwd,
                   port)


def _place(topo: Topology, spec: object, path: str) -> tuple[str, ...]:
    """The hosts as a collective's ranks are placed; one host too (a program may run alone,
    where a communicator may not)."""
    if spec == 1 or (isinstance(spec, dict) and spec.get("count") == 1):
        return (topo.rank_hosts()[0],)
    if isinstance(spec, list) and len(spec) == 1:
        return _one(topo, spec[0], f"{path}[0]")
    return place_ranks(topo, spec, path)


def _one(topo: Topology, name: object, path: str) -> tuple[str, ...]:
    hosts = topo.rank_hosts()
    if not isinstance(name, str) or name not in hosts:
        raise ConfigError(path, f"no host {name!r} in this fabric (hosts: {hosts[0]} .. "
                                f"{hosts[-1]})")
    return (name,)


def _hosts_spec(spec: object, per_host: int, path: str) -> object:
    """A rank count (or ``{count, ...}``) as a count of hosts: ``per_host`` ranks each."""
    count = spec.get("count") if isinstance(spec, dict) else spec
    if isinstance(count, int) and not isinstance(count, bool) and per_host > 1:
        if count % per_host:
            raise ConfigError(path, f"{count} ranks do not fill hosts of {per_host} ranks each")
        count //= per_host
        return {**spec, "count": count} if isinstance(spec, dict) else count
    return spec


#: the marker of a line that reports a collective
REPORT = "#fabriclab"
_TOKEN = re.compile(r"([a-z_]+)=(\S+)")


@dataclass(frozen=True)
class Reported:
    """One collective as the program measured it."""

    op: str
    bytes: int
    time_us: float
    algorithm: str | None = None
    reverse: bool = False
    label: str = ""
    hosts: tuple[str, ...] = ()  # its ranks' hosts, when the program says (else the program's)


def reported(text: str, where: str = "rank 0's stdout"
             ) -> tuple[list[Reported], list[str], dict[str, float]]:
    """The collectives a program reported (lines starting ``#fabriclab``), what was wrong
    with the lines that could not be read (``where line N: ...``), and the iterations it
    reported (their number -> seconds)."""
    out, problems, iterations = [], [], {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.startswith(REPORT + " "):
            continue
        fields = dict(_TOKEN.findall(line[len(REPORT):]))
        try:
            if "iteration" in fields:
                seconds = float(fields["time_s"])
                if not seconds > 0 or not fields["iteration"].isdigit():
                    raise ValueError("iteration=N time_s=S, both positive")
                iterations[fields["iteration"]] = seconds
                continue
            op = fields["op"]
            if op not in ALGORITHMS:
                raise ValueError(f"op={op} is not one of {', '.join(ALGORITHMS)}")
            algorithm = fields.get("algorithm")
            if algorithm is not None and algorithm not in ALGORITHMS[op]:
                raise ValueError(f"{op} has no algorithm {algorithm}")
            size, time_us = int(fields["bytes"]), float(fields["time_us"])
            if size <= 0 or not time_us > 0:
                raise ValueError("bytes and time_us must be positive")
            hosts = tuple(h for h in fields.get("hosts", "").split(",") if h)
            out.append(Reported(op, size, time_us, algorithm,
                                fields.get("order") == "reverse", fields.get("label", ""),
                                hosts))
        except KeyError as err:
            problems.append(f"{where} line {number}: no {err.args[0]}=")
        except ValueError as err:
            problems.append(f"{where} line {number}: {err}")
    return out, problems, iterations

