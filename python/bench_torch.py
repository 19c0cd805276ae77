"""torch.distributed all_reduce and DDP step time, backend "strata" against "gloo", in one run.

    strata run -n 2 /usr/bin/python3 python/bench_torch.py [--min 4K] [--max 64M] [--json out.json]

The default group is "strata"; a gloo group over the same ranks is made with new_group, and
every measurement alternates the two so that both see the same machine. all_reduce is timed on
ordinary torch tensors (what a torch program has) and on tensors from the strata heap
(comm.empty_tensor: zero-copy). Figures follow nccl-tests: time per call, algbw = bytes / time,
busbw = algbw * 2(n-1)/n. DDP: a 4-layer MLP (about 4.2 M parameters, 17 MB of gradients),
forward + backward + SGD step (batches of 4 and 32 per rank), median step time, over gloo, over strata, and over strata with
torch's CPU allocator on the strata heap (strata.torch_heap_tensors(): gradient buckets in
registered memory, so the all_reduce inside DDP is zero-copy too). One compute thread per rank
(--threads), as torchrun sets by default.
"""

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

# This file sits next to the package's sources (python/strata, without the compiled
# extension); import the built package from PYTHONPATH instead.
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import strata  # noqa: E402


def parse_size(s):
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1], 1)
    return int(float(s[:-1] if s[-1] in "KMG" else s) * mult)


def human(b):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= div:
            return f"{b / div:g} {unit}"
    return f"{b} B"


def timed(fn, iters, group):
    """Seconds per call: the slowest rank's average over `iters` calls (after warm-up)."""
    for _ in range(max(2, iters // 10)):
        fn()
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    dt = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
    dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=group)
    return dt.item()


def bench_all_reduce(sizes, gloo, comm, n, reps):
    rows = []
    for size in sizes:
        count = size // 4
        iters = max(5, min(300, (256 << 20) // size))
        plain_s = torch.ones(count)
        plain_g = torch.ones(count)
        heap = comm.empty_tensor((count,), torch.float32)
        heap.fill_(1)
        best = {"strata": float("inf"), "strata_heap": float("inf"), "gloo": float("inf")}
        for _ in range(reps):  # alternate, keep the best of each
            best["gloo"] = min(best["gloo"], timed(lambda: dist.all_reduce(plain_g, group=gloo), iters, gloo))
            best["strata"] = min(best["strata"], timed(lambda: dist.all_reduce(plain_s), iters, None))
            best["strata_heap"] = min(best["strata_heap"], timed(lambda: dist.all_reduce(heap), iters, None))
        row = {"bytes": size, "iters": iters}
        for k, t in best.items():
            row[k + "_us"] = t * 1e6
            row[k + "_busbw_GBps"] = size / t * 2 * (n - 1) / n / 1e9
        row["speedup_plain"] = best["gloo"] / best["strata"]
        row["speedup_heap"] = best["gloo"] / best["strata_heap"]
        rows.append(row)
    return rows


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                               torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                               torch.nn.Linear(1024, 1024))


def bench_ddp(group, steps, rank, batch, heap=False):
    with strata.torch_heap_tensors() if heap else contextlib.nullcontext():
        model = make_model()
        ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        gen = torch.Generator().manual_seed(rank)
        x, y = torch.randn(batch, 1024, generator=gen), torch.randn(batch, 1024, generator=gen)
        times = []
        for i in range(steps + 3):
            dist.barrier(group=group)
            t0 = time.perf_counter()
            opt.zero_grad()
            F.mse_loss(ddp(x), y).backward()
            opt.step()
            dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=group)
            if i >= 3:
                times.append(dt.item())
    return statistics.median(times), sum(p.numel() for p in model.parameters())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--min", default="4K", help="smallest all_reduce size in bytes (default 4K)")
    ap.add_argument("--max", default="64M", help="largest all_reduce size in bytes (default 64M)")
    ap.add_argument("--reps", type=int, default=5,
                    help="alternating repetitions per measurement; the best is kept (default 5)")
    ap.add_argument("--ddp-steps", type=int, default=20, help="DDP steps timed per backend (default 20)")
    ap.add_argument("--batches", default="4,32",
                    help="DDP batch sizes per rank, comma-separated (default 4,32: communication-bound and "
                         "compute-bound)")
    ap.add_argument("--threads", type=int, default=1, help="torch compute threads per rank (default 1)")
    ap.add_argument("--json", help="also write the figures to this file (rank 0)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    dist.init_process_group("strata")
    rank, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    comm = strata.torch_communicator()

    sizes = []
    s = parse_size(args.min)
    while s <= parse_size(args.max):
        sizes.append(s)
        s *= 4
    rows = bench_all_reduce(sizes, gloo, comm, n, args.reps)

    ddp = {}  # batch -> backend -> seconds per step
    for batch in [int(b) for b in args.batches.split(",")]:
        ddp[batch] = {}
        for _ in range(max(2, args.reps // 2)):  # alternate, keep the best
            for name, group, heap in (("gloo", gloo, False), ("strata", None, False), ("strata_heap", None, True)):
                t, params = bench_ddp(group, args.ddp_steps, rank, batch, heap)
                ddp[batch][name] = min(ddp[batch].get(name, float("inf")), t)

    if rank == 0:
        print(f"torch {torch.__version__}, {n} ranks, float32 sum; time per all_reduce (us) and busbw (GB/s)")
        print("| size | gloo | strata (torch tensor) | strata (heap tensor) | gloo busbw | strata busbw "
              "| strata heap busbw | speedup torch tensor | speedup heap tensor |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {human(r['bytes'])} | {r['gloo_us']:.1f} | {r['strata_us']:.1f} | {r['strata_heap_us']:.1f} "
                  f"| {r['gloo_busbw_GBps']:.2f} | {r['strata_busbw_GBps']:.2f} | {r['strata_heap_busbw_GBps']:.2f} "
                  f"| {r['speedup_plain']:.1f}x | {r['speedup_heap']:.1f}x |")
        print(f"\nDDP step time (ms; MLP of {params / 1e6:.1f} M parameters, median of {args.ddp_steps} steps, "
              f"{args.threads} thread(s) per rank):")
        print("| batch per rank | gloo | strata | strata, heap allocator | speedup | speedup, heap allocator |")
        print("|---:|---:|---:|---:|---:|---:|")
        for batch, t in ddp.items():
            print(f"| {batch} | {t['gloo'] * 1e3:.2f} | {t['strata'] * 1e3:.2f} | {t['strata_heap'] * 1e3:.2f} "
                  f"| {t['gloo'] / t['strata']:.2f}x | {t['gloo'] / t['strata_heap']:.2f}x |")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": n, "torch": torch.__version__, "all_reduce": rows,
                           "ddp_step_s_by_batch": ddp, "ddp_params": params}, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
