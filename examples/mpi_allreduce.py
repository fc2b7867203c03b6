"""An MPI all-reduce timed as NCCL-tests times it (mpi4py with Debian's Open MPI), its ranks on
hosts of a fabriclab fabric, started by ``mpirun`` from one host through ``fabriclab-rsh``.

    apt-get install openmpi-bin python3-mpi4py
    workload:
      program:
        argv: [mpirun, -H, "h1-1-1,h1-1-2,...", -np, "16", --mca, coll_tuned_use_dynamic_rules,
               "1", --mca, coll_tuned_allreduce_algorithm, "4",
               /usr/bin/python3, mpi_allreduce.py, --size, 40MiB]
        ranks: 1                   # mpirun itself, on the first host
        env: {OMPI_ALLOW_RUN_AS_ROOT: "1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM: "1"}

fabriclab gives every rank ``OMPI_MCA_plm_rsh_agent``: ``mpirun`` starts its daemons on the
other hosts through ``fabriclab-rsh``, which enters them by name; each host has its own
hostname (its name with ``-`` for ``_``: Open MPI refuses underscores), so Open MPI sees
distinct nodes. ``coll_tuned_allreduce_algorithm 4`` forces Open
MPI's ring (each rank sending to the rank after it, a reduce-scatter then an all-gather).

Each rank learns its host from ``MPI.Get_processor_name()``; rank 0 prints NCCL-tests' line
and a ``#fabriclab`` line naming the hosts in rank order, so ``fabriclab run`` predicts the
same collective on them.
"""

from __future__ import annotations

import argparse
import sys

try:
    import numpy as np
    from mpi4py import MPI
except ImportError:
    sys.exit("mpi4py is not installed for this Python: apt-get install openmpi-bin "
             "python3-mpi4py and run it with /usr/bin/python3")

UNITS = {"": 1, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "KB": 1000, "MB": 10 ** 6,
         "GB": 10 ** 9}


def size_bytes(text: str) -> int:
    digits = text.rstrip("KMGiBkmgib")
    return int(float(digits) * UNITS[text[len(digits):].upper()])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="40MiB", help="NCCL-tests' size, e.g. 40MiB")
    parser.add_argument("--iters", type=int, default=3, help="timed runs after a warm-up")
    parser.add_argument("--algorithm", default="ring", help="what the run forced (for the "
                                                            "#fabriclab line)")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    hosts = comm.gather(MPI.Get_processor_name(), root=0)
    nbytes = size_bytes(args.size)
    data = np.ones(nbytes // 4, dtype=np.float32)
    out = np.empty_like(data)
    comm.Allreduce(data, out, op=MPI.SUM)  # warm-up: connections
    times = []
    for _ in range(args.iters):
        comm.Barrier()
        began = MPI.Wtime()
        comm.Allreduce(data, out, op=MPI.SUM)
        times.append(comm.allreduce(MPI.Wtime() - began, op=MPI.MAX))
    if rank == 0:
        seconds = sum(times) / len(times)
        algbw = nbytes / seconds / 1e9
        library = MPI.Get_library_version().splitlines()[0].split(",")[0]
        print(f"# {library}, {n} ranks on {len(set(hosts))} nodes: {', '.join(hosts)}")
        print(f"  all_reduce {nbytes:>12} {nbytes // 4:>12} {seconds * 1e6:>12.1f} "
              f"{algbw:>9.5f} {algbw * 2 * (n - 1) / n:>9.5f}")
        print(f"#fabriclab op=all_reduce bytes={nbytes} time_us={seconds * 1e6:.1f} "
              f"algorithm={args.algorithm} hosts={','.join(hosts)} label=mpi-all_reduce",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
