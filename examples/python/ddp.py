"""DistributedDataParallel training over torch.distributed, backend "strata" or "gloo".

    strata run -n 2 /usr/bin/python3 examples/python/ddp.py --backend strata
    strata run -n 2 /usr/bin/python3 examples/python/ddp.py --backend gloo
    torchrun --nproc_per_node=2 examples/python/ddp.py --backend strata

`import strata` registers the backend; nothing else changes in the training script. With
--heap, torch allocates CPU tensors in Strata's registered heap (strata.torch_heap_tensors()),
so DDP's gradient buckets are reduced with no copy at all. The same seed gives the same final
parameters with either backend (the checksum printed at the end).
"""

import argparse
import contextlib
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

import strata  # registers the "strata" backend


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=["strata", "gloo"], default="strata")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--heap", action="store_true", help="allocate tensors in the strata heap (strata backend)")
    args = ap.parse_args()
    torch.set_num_threads(1)

    dist.init_process_group(args.backend)  # rank/size from strata run or torchrun
    rank, world = dist.get_rank(), dist.get_world_size()
    heap = strata.torch_heap_tensors() if args.heap and args.backend == "strata" else contextlib.nullcontext()
    with heap:
        torch.manual_seed(0)  # the same initial model everywhere (DDP also broadcasts it)
        model = torch.nn.Sequential(torch.nn.Linear(64, args.hidden), torch.nn.ReLU(),
                                    torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
                                    torch.nn.Linear(args.hidden, 10))
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        data = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard
        t0 = time.perf_counter()
        for step in range(args.steps):
            x = torch.randn(64, 64, generator=data)
            y = torch.randint(0, 10, (64,), generator=data)
            loss = F.cross_entropy(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if rank == 0 and (step % 5 == 0 or step == args.steps - 1):
                print(f"step {step:3d}  loss {loss.item():.4f}", flush=True)
        elapsed = time.perf_counter() - t0
    checksum = sum(p.double().sum().item() for p in model.parameters())
    if rank == 0:
        print(f"{args.backend}{' (heap)' if args.heap else ''}: {world} ranks, {args.steps} steps in {elapsed:.2f} s "
              f"({elapsed / args.steps * 1e3:.1f} ms/step), parameter checksum {checksum:.10f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
