"""Zero-copy all_reduce from Python.

    strata run -n 4 /usr/bin/python3 examples/python/allreduce.py [--mib 64]

The array comes from comm.empty(): it lives in Strata's registered heap, which every rank on
the host has mapped, so the all_reduce reads and writes the ranks' own arrays directly
(stats: staged_bytes stays 0). The same call on an ordinary numpy array works too; Strata then
copies it through the heap (staged_bytes grows), which the timing shows.
"""

import argparse
import time

import numpy as np

import strata


def timed(comm, a, iters):
    comm.all_reduce(a)  # warm-up: first touch of pages
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        comm.all_reduce(a)
    return (time.perf_counter() - t0) / iters


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=float, default=64, help="array size in MiB (default 64)")
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()

    comm = strata.init()  # rank, size and store from `strata run`
    r, n = comm.rank, comm.size
    count = int(args.mib * (1 << 20)) // 4

    a = comm.empty((count,), "float32")  # a numpy array in the registered heap
    a[:] = r + 1
    comm.all_reduce(a)  # in place; every rank now holds 1 + 2 + ... + n
    assert np.all(a == n * (n + 1) / 2), a[:4]

    before = comm.stats()
    t_heap = timed(comm, a, args.iters)
    staged_heap = comm.stats()["staged_bytes"] - before["staged_bytes"]

    b = np.ones(count, np.float32)  # an ordinary numpy array: correct too, staged
    before = comm.stats()
    t_ext = timed(comm, b, args.iters)
    staged_ext = comm.stats()["staged_bytes"] - before["staged_bytes"]

    if r == 0:
        busbw = lambda t: count * 4 / t * 2 * (n - 1) / n / 1e9  # noqa: E731
        print(f"{n} ranks, {args.mib:g} MiB float32 all_reduce")
        print(f"  heap array (comm.empty): {t_heap * 1e3:8.2f} ms  busbw {busbw(t_heap):6.2f} GB/s  "
              f"staged {staged_heap} B")
        print(f"  plain numpy array:       {t_ext * 1e3:8.2f} ms  busbw {busbw(t_ext):6.2f} GB/s  "
              f"staged {staged_ext} B")


if __name__ == "__main__":
    main()
