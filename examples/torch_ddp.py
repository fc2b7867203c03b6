"""A small data-parallel training with PyTorch's ``DistributedDataParallel`` (the gloo backend,
on CPUs) on synthetic data, every rank on a host of a fabriclab fabric.

    fabriclab launch -- /usr/bin/python3 examples/torch_ddp.py --iterations 20
    workload: {program: {argv: [/usr/bin/python3, torch_ddp.py, --iterations, "20"]}}

The model is a stack of linear layers (``--width`` x ``--width`` each, ``--layers`` of them:
8 MB of float32 parameters by default), so an iteration is a little compute and an all-reduce
of the gradients in DDP's buckets (``--bucket-mb``) over the fabric, overlapped with the
backward pass as DDP does. Each iteration's time is the slowest rank's from a barrier to the
end of its optimizer step; rank 0 prints one ``#fabriclab iteration=N time_s=S`` line per
iteration (``results.json`` ``program.iterations``) and a summary.
"""

from __future__ import annotations

import argparse
import sys
import time

try:
    import torch
    import torch.distributed as dist
except ImportError:
    sys.exit("PyTorch is not installed for this Python: apt-get install python3-torch "
             "(Debian's CPU build, gloo included) and run it with /usr/bin/python3")

from torch import nn  # noqa: E402 - after the check above
from torch.nn.parallel import DistributedDataParallel  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32, help="samples per rank")
    parser.add_argument("--bucket-mb", type=float, default=4.0, help="DDP's gradient buckets")
    args = parser.parse_args()
    dist.init_process_group("gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial model on every rank
    torch.set_num_threads(1)
    layers = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    model = DistributedDataParallel(nn.Sequential(*layers), bucket_cap_mb=args.bucket_mb)
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(1 + rank)  # each rank its own samples
    if rank == 0:
        print(f"# DDP on gloo: {n} ranks, {params * 4 / 1e6:.1f} MB of parameters, buckets of "
              f"{args.bucket_mb:g} MB, {args.batch} samples per rank", flush=True)
    times = []
    for it in range(args.iterations):
        x = torch.randn(args.batch, args.width, generator=data)
        y = torch.randn(args.batch, args.width, generator=data)
        dist.barrier()
        began = time.perf_counter()
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()  # the gradients' all-reduces, bucket by bucket
        optimizer.step()
        took = torch.tensor([time.perf_counter() - began], dtype=torch.float64)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        times.append(took.item())
        if rank == 0:
            print(f"#fabriclab iteration={it} time_s={took.item():.6f}", flush=True)
    if rank == 0:
        steady = times[1:] or times
        print(f"# iteration time: mean {sum(steady) / len(steady):.4f} s over the last "
              f"{len(steady)} (the first sets up DDP's buckets), loss {loss.item():.4f}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
