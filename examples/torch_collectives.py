"""Collectives of PyTorch's ``torch.distributed`` (the gloo backend, on CPUs) timed as
NCCL-tests times them, on every rank of a fabriclab fabric.

    fabriclab launch -- python3 examples/torch_collectives.py --size 40MiB
    workload: {program: {argv: [python3, torch_collectives.py, --size, 40MiB]}}

Each rank joins the process group from torchrun's environment (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``: fabriclab gives them). For each operation the ranks meet at
a barrier, run it, and the time from the barrier to the last rank's end is the collective's
(the slowest rank's time, shared by an all-reduce of it); the mean over ``--iters`` runs
after one warm-up is reported. Rank 0 prints the table NCCL-tests prints (size, count, time
in us, algbw and busbw in GB/s) and one ``#fabriclab`` line per operation, which
``fabriclab run`` reads into ``results.json`` beside ``fabriclab predict``'s time.

The operations, as gloo runs them (its sources, ``gloo/allreduce.cc`` and
``ProcessGroupGloo``):
- ``all_reduce``: gloo's default algorithm is its ring (a reduce-scatter then an all-gather,
  each rank sending to the rank before it, one connection per pair): ``algorithm=ring
  order=reverse``;
- ``all_to_all``: ``all_to_all_single``, every rank sending to every other at once (the
  ``direct`` schedule);
- ``all_gather``: gloo's ring all-gather (each rank sending to the rank after it);
- ``reduce_scatter``: gloo has none on CPUs; skipped with a note.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

try:
    import torch
    import torch.distributed as dist
except ImportError:
    sys.exit("PyTorch is not installed for this Python: apt-get install python3-torch "
             "(Debian's CPU build, gloo included) and run it with /usr/bin/python3")

UNITS = {"": 1, "K": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MIB": 1 << 20, "G": 1 << 30,
         "GIB": 1 << 30, "KB": 1000, "MB": 10 ** 6, "GB": 10 ** 9}
#: NCCL-tests' busbw / algbw
BUS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
       "all_gather": lambda n: (n - 1) / n}
#: how each operation runs in gloo, as fabriclab's schedules name it
SCHEDULE = {"all_reduce": "algorithm=ring order=reverse", "all_to_all": "algorithm=direct",
            "all_gather": "algorithm=ring"}


def size_bytes(text: str) -> int:
    digits = text.rstrip("KMGiBkmgib")
    return int(float(digits) * UNITS[text[len(digits):].upper()])


def run_once(op: str, data: torch.Tensor, out: torch.Tensor | list) -> None:
    if op == "all_reduce":
        dist.all_reduce(data)
    elif op == "all_to_all":
        dist.all_to_all_single(out, data)
    elif op == "all_gather":
        dist.all_gather(out, data)


def buffers(op: str, nbytes: int, n: int) -> tuple[torch.Tensor, torch.Tensor | list]:
    """The input and output of ``op`` for NCCL-tests' size ``nbytes`` (float32): all-gather's
    size is every rank's part together, as NCCL-tests counts it."""
    count = max(n, nbytes // 4 // n * n)
    if op == "all_gather":
        part = torch.ones(count // n)
        return part, [torch.empty_like(part) for _ in range(n)]
    data = torch.ones(count)
    return data, torch.empty_like(data)


def measure(op: str, nbytes: int, iters: int) -> float:
    """The mean over ``iters`` of the slowest rank's time from a barrier to its end, s."""
    n = dist.get_world_size()
    data, out = buffers(op, nbytes, n)
    run_once(op, data, out)  # warm-up: connections and buffers
    times = []
    for _ in range(iters):
        dist.barrier()
        began = time.perf_counter()
        run_once(op, data, out)
        took = torch.tensor([time.perf_counter() - began], dtype=torch.float64)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        times.append(took.item())
    return sum(times) / len(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default="all_reduce,all_to_all,all_gather,reduce_scatter",
                        help="comma-separated operations")
    parser.add_argument("--size", default="40MiB", help="NCCL-tests' size, e.g. 40MiB")
    parser.add_argument("--iters", type=int, default=3, help="timed runs per operation")
    args = parser.parse_args()
    dist.init_process_group("gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, n = dist.get_rank(), dist.get_world_size()
    nbytes = size_bytes(args.size)
    if rank == 0:
        print(f"# torch {torch.__version__}, gloo, {n} ranks on {os.uname().nodename} .., "
              f"{args.iters} iterations after a warm-up")
        print(f"# {'op':>14} {'size':>12} {'count':>12} {'time':>12} {'algbw':>9} "
              f"{'busbw':>9}\n# {'':>14} {'(B)':>12} {'(elements)':>12} {'(us)':>12} "
              f"{'(GB/s)':>9} {'(GB/s)':>9}", flush=True)
    for op in args.ops.split(","):
        if op not in BUS:
            if rank == 0:
                print(f"# {op}: gloo has none on CPUs; skipped", flush=True)
            continue
        seconds = measure(op, nbytes, args.iters)
        if rank == 0:
            algbw = nbytes / seconds / 1e9
            print(f"  {op:>14} {nbytes:>12} {nbytes // 4:>12} {seconds * 1e6:>12.1f} "
                  f"{algbw:>9.5f} {algbw * BUS[op](n):>9.5f}")
            print(f"#fabriclab op={op} bytes={nbytes} time_us={seconds * 1e6:.1f} "
                  f"{SCHEDULE[op]} label=torch-{op}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
