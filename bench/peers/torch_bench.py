#!/usr/bin/python3
"""The torch.distributed (gloo) peer of `strata bench`.

Same collectives, sizes, timing loop, check and output formats as strata bench and
bench/peers/mpi_bench.cpp (their shared code is src/cli/bench_common.hpp; this file mirrors
it, keep them in step). It starts the N ranks itself (one process each, init via env://,
MASTER_ADDR=127.0.0.1 and a free port), one torch thread per rank.

    /usr/bin/python3 bench/peers/torch_bench.py all_reduce -n 2 -b 8 -e 64M -f 4 --json gloo.json

Gloo in torch 1.13 has no reduce_scatter: it is measured as all_reduce + copy of this rank's
block, and labelled so ("emulated": true in the JSON).
"""

import argparse
import json
import math
import os
import socket
import statistics
import sys
import time

COLLS = {
    # name: (reduces, rooted, total_size)
    "all_reduce": (True, False, False),
    "reduce": (True, True, False),
    "broadcast": (False, True, False),
    "all_gather": (False, False, True),
    "reduce_scatter": (True, False, True),
    "all_to_all": (False, False, True),
    "gather": (False, True, True),
    "scatter": (False, True, True),
    "barrier": (False, False, False),
    "sendrecv": (False, False, False),
}
DTYPES = {"int8": 1, "uint8": 1, "int32": 4, "int64": 8, "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
SENTINEL = -3.0


def parse_bytes(s):
    units = {"": 0, "B": 0, "K": 10, "k": 10, "KB": 10, "KiB": 10, "M": 20, "m": 20, "MB": 20, "MiB": 20,
             "G": 30, "g": 30, "GB": 30, "GiB": 30}
    i = 0
    while i < len(s) and s[i].isdigit():
        i += 1
    if i == 0 or s[i:] not in units:
        raise argparse.ArgumentTypeError("not a size: %r (8, 64K, 256M)" % s)
    return int(s[:i]) << units[s[i:]]


def busbw_factor(coll, n):
    if coll == "all_reduce":
        return 2.0 * (n - 1) / n
    if coll in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        return (n - 1) / n
    if coll == "barrier":
        return 0.0
    return 1.0


def sizes(o, n):
    es = DTYPES[o.dtype]
    if o.collective == "barrier":
        return [(0, 0, 0)]
    total = COLLS[o.collective][2]
    out, s = [], float(o.minbytes)
    while s <= o.maxbytes + 0.5:
        b = int(s)
        c = max(1, b // (es * n)) if total else max(1, b // es)
        count = c * n if total else c
        if not out or out[-1][2] != c:
            out.append((count * es, count, c))
        s *= o.stepfactor
    return out


def human(b):
    units, u = ["B", "KiB", "MiB", "GiB"], 0
    while u < 3 and b >= 1024 and b % 1024 == 0:
        b //= 1024
        u += 1
    return "%d %s" % (b, units[u])


# ---- ranks -----------------------------------------------------------------------------------

def pattern(torch, op, rank, idx):
    v = (rank * 7 + idx) % 11
    if op == "prod":
        return (v % 3 == 0).double() + 1.0
    return (v + 1).double()


def reduced(torch, op, n, idx):
    acc = pattern(torch, op, 0, idx)
    for b in range(1, n):
        v = pattern(torch, op, b, idx)
        if op in ("sum", "avg"):
            acc = acc + v
        elif op == "prod":
            acc = acc * v
        elif op == "min":
            acc = torch.minimum(acc, v)
        elif op == "max":
            acc = torch.maximum(acc, v)
    return acc / n if op == "avg" else acc


def expected(torch, o, n, r, c, k):
    """Expected output on rank r at indices k (an int64 tensor); None where undefined."""
    coll, op, root = o.collective, o.op, o.root
    if coll == "all_reduce":
        return reduced(torch, op, n, k)
    if coll == "reduce":
        return reduced(torch, op, n, k) if r == root else None
    if coll == "broadcast":
        return pattern(torch, op, root, k)
    if coll in ("all_gather", "gather"):
        if coll == "gather" and r != root:
            return None
        b = k // c
        v = (b * 7 + k % c) % 11
        return ((v % 3 == 0).double() + 1.0) if op == "prod" else (v + 1).double()
    if coll == "reduce_scatter":
        return reduced(torch, op, n, r * c + k)
    if coll == "all_to_all":
        b = k // c
        v = (b * 7 + r * c + k % c) % 11
        return ((v % 3 == 0).double() + 1.0) if op == "prod" else (v + 1).double()
    if coll == "scatter":
        return pattern(torch, op, root, r * c + k)
    if coll == "sendrecv":
        return pattern(torch, op, (r + n - 1) % n, k)
    return None


def worker(rank, n, port, o, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(n))
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=n)
    dt = getattr(torch, o.dtype)
    ops = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
           "max": dist.ReduceOp.MAX, "avg": getattr(dist.ReduceOp, "AVG", None)}
    rop = ops[o.op]
    coll, root = o.collective, o.root
    pts = sizes(o, n)
    maxcount = max([p[1] for p in pts] + [16])
    inb = torch.zeros(maxcount, dtype=dt)  # allocated once at the largest size, touched
    outb = torch.zeros(maxcount, dtype=dt)
    tmp = torch.zeros(maxcount, dtype=dt)
    aux = torch.zeros(max(o.repeats, 2), dtype=torch.float64)

    def max_all(values):
        aux[: len(values)] = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(aux[: len(values)], op=dist.ReduceOp.MAX)
        return aux[: len(values)].tolist()

    results, failed = [], 0
    for (nbytes, count, c) in pts:
        if rank == 0 and not o.quiet and len(pts) > 1:
            sys.stderr.write("torch_bench: [%d/%d] %s %s\n" % (len(results) + 1, len(pts), coll, human(nbytes)))
        inp = inb[: n * c if coll in ("reduce_scatter", "all_to_all", "scatter") else c]
        out = outb[: count if coll in ("all_gather", "all_to_all", "gather") else c]
        if o.inplace and coll in ("all_reduce", "reduce", "broadcast"):
            inp = out
        out_blocks = list(out.view(n, c).unbind(0)) if coll in ("all_gather", "gather") else None
        in_blocks = list(inb[: n * c].view(n, c).unbind(0)) if coll == "scatter" else None

        if coll == "all_reduce":
            def call():
                if inp is out:
                    dist.all_reduce(out, op=rop)
                else:
                    out.copy_(inp)  # gloo is in place only: out-of-place is copy + in place
                    dist.all_reduce(out, op=rop)
        elif coll == "reduce":
            def call():
                if inp is not out:
                    out.copy_(inp)
                dist.reduce(out, root, op=rop)
        elif coll == "broadcast":
            def call():
                if rank == root and inp is not out:
                    out.copy_(inp)
                dist.broadcast(out, root)
        elif coll == "all_gather":
            def call():
                dist.all_gather(out_blocks, inp)
        elif coll == "reduce_scatter":
            t = tmp[: n * c]

            def call():
                t.copy_(inp)
                dist.all_reduce(t, op=rop)
                out.copy_(t[rank * c:(rank + 1) * c])
        elif coll == "all_to_all":
            def call():
                dist.all_to_all_single(out, inp)
        elif coll == "gather":
            def call():
                dist.gather(inp, out_blocks if rank == root else None, dst=root)
        elif coll == "scatter":
            def call():
                dist.scatter(out, in_blocks if rank == root else None, src=root)
        elif coll == "barrier":
            def call():
                dist.barrier()
        else:  # sendrecv
            def call():
                s = dist.isend(inp, (rank + 1) % n)
                dist.recv(out, (rank + n - 1) % n)
                s.wait()

        wrong = 0
        if not o.no_check and coll != "barrier":
            out.fill_(SENTINEL)
            idx = torch.arange(inp.numel(), dtype=torch.int64)
            if coll not in ("broadcast", "scatter") or rank == root:
                inp.copy_(pattern(torch, o.op, rank, idx).to(dt))
            if coll == "scatter" and rank == root:
                inb[: n * c].copy_(pattern(torch, o.op, rank, torch.arange(n * c)).to(dt))
            call()
            want = expected(torch, o, n, rank, c, torch.arange(out.numel(), dtype=torch.int64))
            if want is not None:
                got = out.double()
                if dt.is_floating_point:
                    tol = {torch.float32: 1e-6, torch.float64: 1e-12}.get(dt, 1e-2)
                    bad = (got - want).abs() > tol * want.abs().clamp(min=1.0)
                else:
                    bad = out != want.to(torch.int64).to(dt)
                wrong = int(bad.sum())
                if wrong:
                    i = int(bad.nonzero()[0])
                    sys.stderr.write("torch_bench: rank %d: %s %d B: %d of %d wrong; first at %d: got %g, expected %g\n"
                                     % (rank, coll, nbytes, wrong, out.numel(), i, got[i], want[i]))

        # The method of bench_common.hpp: warm-up, one timed call sizes the loop, then repeats.
        for _ in range(o.warmup):
            call()
        iters = o.iters
        if not iters:
            dist.barrier()
            t0 = time.perf_counter()
            call()
            one = max_all([time.perf_counter() - t0])[0]
            iters = int(min(max(math.ceil(o.target_ms * 1e-3 / max(one, 1e-9)), 1), o.max_iters))
        secs = []
        for _ in range(o.repeats):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                call()
            secs.append((time.perf_counter() - t0) / iters)
        secs = max_all(secs)
        if not o.no_check:
            wrong = int(max_all([float(wrong)])[0])
        med = statistics.median(secs)
        algbw = nbytes / med / 1e9 if med > 0 else 0.0
        row = dict(size=nbytes, count=count, iters=iters, time_us=med * 1e6, time_min_us=min(secs) * 1e6,
                   time_max_us=max(secs) * 1e6, algbw_gbs=algbw, busbw_gbs=algbw * busbw_factor(coll, n),
                   check="skipped" if (o.no_check or coll == "barrier") else ("FAIL" if wrong else "ok"), wrong=wrong)
        failed += bool(wrong)
        results.append(row)
        if rank == 0:
            queue.put(("row", row))
    if rank == 0:
        queue.put(("done", failed))
    dist.barrier()
    dist.destroy_process_group()


# ---- launcher side ---------------------------------------------------------------------------

def header(o, n):
    reduces, rooted, total = COLLS[o.collective]
    h = "# gloo %s: %d ranks, %s%s, %s" % (o.collective, n, o.dtype, " " + o.op if reduces else "",
                                          "in place" if o.inplace else "out of place")
    if rooted:
        h += ", root %d" % o.root
    if o.collective == "reduce_scatter":
        h += ", emulated (all_reduce + copy of this rank's block)"
    h += "  [%s]\n" % o.label
    h += ("# time: median of %d repeats of (a timed loop of `iters` back-to-back calls / iters), each repeat the "
          "slowest rank's; %d warm-up calls per size\n" % (o.repeats, o.warmup))
    h += ("# size: total buffer = ranks x per-rank block (nccl-tests)\n" if total
          else "# size: the buffer each rank passes (nccl-tests)\n")
    h += "#\n# %12s %12s %9s %6s %5s %7s %11s %11s %11s %11s %6s\n" % (
        "size(B)", "count", "type", "redop", "root", "iters", "time(us)", "min(us)", "algbw(GB/s)", "busbw(GB/s)",
        "check")
    return h


def table_row(o, r):
    reduces, rooted, _ = COLLS[o.collective]
    return "  %12d %12d %9s %6s %5s %7d %11.2f %11.2f %11.3f %11.3f %6s\n" % (
        r["size"], r["count"], o.dtype, o.op if reduces else "-", str(o.root) if rooted else "-", r["iters"],
        r["time_us"], r["time_min_us"], r["algbw_gbs"], r["busbw_gbs"],
        "-" if r["check"] == "skipped" else r["check"])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("collective", choices=sorted(COLLS))
    p.add_argument("-n", "--np", dest="nranks", type=int, required=True)
    p.add_argument("-b", "--minbytes", type=parse_bytes, default=8)
    p.add_argument("-e", "--maxbytes", type=parse_bytes, default=64 << 20)
    p.add_argument("-f", "--stepfactor", type=float, default=2.0)
    p.add_argument("-d", "--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("-o", "--op", choices=["sum", "prod", "min", "max", "avg"], default="sum")
    p.add_argument("-r", "--root", type=int, default=0)
    p.add_argument("--inplace", action="store_true")
    p.add_argument("--iters", type=int, default=0)
    p.add_argument("-w", "--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--target-ms", type=float, default=20.0)
    p.add_argument("--max-iters", type=int, default=10000)
    p.add_argument("--no-check", action="store_true")
    p.add_argument("--json")
    p.add_argument("--csv")
    p.add_argument("--label", default="gloo")
    p.add_argument("-q", "--quiet", action="store_true")
    o = p.parse_args()
    if o.stepfactor <= 1:
        p.error("-f must be > 1")
    if o.collective == "sendrecv" and o.nranks < 2:
        p.error("sendrecv needs -n 2 or more")

    import multiprocessing as mp
    import torch
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, o.nranks, port, o, queue)) for r in range(o.nranks)]
    for pr in procs:
        pr.start()
    sys.stdout.write(header(o, o.nranks))
    sys.stdout.flush()
    rows, failed, done = [], 0, False
    while not done:
        try:
            kind, val = queue.get(timeout=5)
        except Exception:
            if any(pr.exitcode not in (None, 0) for pr in procs):
                for pr in procs:
                    if pr.exitcode is None:
                        pr.terminate()
                sys.stderr.write("torch_bench: a rank failed\n")
                return 1
            continue
        if kind == "row":
            rows.append(val)
            sys.stdout.write(table_row(o, val))
            sys.stdout.flush()
        else:
            failed, done = val, True
    for pr in procs:
        pr.join()
    rc = 1 if failed or any(pr.exitcode != 0 for pr in procs) else 0
    sys.stdout.write("#\n# check: %s\n" % ("FAIL at %d sizes" % failed if failed else "all %d sizes ok" % len(rows)))

    reduces, rooted, total = COLLS[o.collective]
    doc = {
        "format": "strata-bench/1", "system": "gloo", "label": o.label, "collective": o.collective,
        "nranks": o.nranks, "dtype": o.dtype, "op": o.op if reduces else "none", "root": o.root if rooted else -1,
        "inplace": o.inplace, "buffers": "torch", "algorithm": "library",
        "busbw_factor": busbw_factor(o.collective, o.nranks),
        "size_meaning": "total buffer (ranks x per-rank block)" if total else "buffer per rank",
        "timing": {"method": "median over repeats of loop time / iters, slowest rank per repeat",
                   "warmup": o.warmup, "repeats": o.repeats, "iters": o.iters or "auto", "target_ms": o.target_ms,
                   "max_iters": o.max_iters},
        "library": "torch %s gloo" % torch.__version__, "emulated": o.collective == "reduce_scatter",
        "results": rows,
    }
    if o.json:
        with open(o.json, "w") as f:
            json.dump(doc, f, indent=1)
    if o.csv:
        with open(o.csv, "w") as f:
            f.write("system,label,collective,nranks,dtype,op,inplace,buffers,size,count,iters,time_us,time_min_us,"
                    "time_max_us,algbw_gbs,busbw_gbs,check\n")
            for r in rows:
                f.write("gloo,%s,%s,%d,%s,%s,%d,torch,%d,%d,%d,%.4f,%.4f,%.4f,%.5f,%.5f,%s\n" % (
                    o.label, o.collective, o.nranks, o.dtype, doc["op"], int(o.inplace), r["size"], r["count"],
                    r["iters"], r["time_us"], r["time_min_us"], r["time_max_us"], r["algbw_gbs"], r["busbw_gbs"],
                    r["check"]))
    return rc


if __name__ == "__main__":
    sys.exit(main())
