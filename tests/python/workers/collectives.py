"""Every collective of strata.Communicator against a numpy reference, for heap arrays
(comm.empty) and external arrays (plain numpy), in place, out of place and async.

Invariant checked: each rank's result equals the reference computed locally from every rank's
(deterministic) input; heap-only collectives stage nothing (zero-copy)."""

import numpy as np

import strata
from common import Checker, data, join

comm = join()
r, n = comm.rank, comm.size
chk = Checker(r)

DTYPES = [np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64, np.float16, np.float32, np.float64]
COUNTS = [1, 1000, 40000]  # 40000 elements cross the one-shot/two-shot threshold (64 KiB)


def new(kind, shape, dt):
    return comm.empty(shape, dt) if kind == "heap" else np.empty(shape, dt)


def filled(kind, src):
    a = new(kind, src.shape, src.dtype)
    a[...] = src
    return a


def reference(op, stack, dt):
    """Reduction of stack (ranks x count) as Strata defines it: integers wrap, float16
    accumulates in float32 and is rounded once."""
    dt = np.dtype(dt)
    acc = np.float32 if dt == np.float16 else dt
    if op == "sum":
        return np.sum(stack.astype(acc), axis=0, dtype=acc).astype(dt)
    if op == "prod":
        return np.prod(stack.astype(acc), axis=0, dtype=acc).astype(dt)
    if op == "min":
        return stack.min(axis=0)
    if op == "max":
        return stack.max(axis=0)
    if op in ("band", "bor", "bxor"):
        f = {"band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}[op]
        return f.reduce(stack, axis=0).astype(dt)
    return (stack.astype(np.float64).sum(axis=0) / stack.shape[0]).astype(dt)  # avg


def ops_for(dt):
    return ["sum", "prod", "min", "max"] + (["avg"] if np.dtype(dt).kind == "f" else ["band", "bor", "bxor"])


def rtol(op, dt):
    if op != "avg":
        return 0.0
    return 2e-3 if np.dtype(dt) == np.float16 else 1e-6


for kind in ("heap", "external"):
    # ---- all_reduce: every dtype and op, three call forms --------------------------------------
    for dt in DTYPES:
        for count in COUNTS:
            stack = np.stack([data(j, count, dt) for j in range(n)])
            for op in ops_for(dt):
                want = reference(op, stack, dt)
                name = f"all_reduce {kind} {np.dtype(dt).name} n={count} {op}"
                a = filled(kind, stack[r])
                chk.equal(name + " in place", comm.all_reduce(a, op), want, rtol(op, dt))
                a = filled(kind, stack[r])
                out = new(kind, (count,), dt)
                res = comm.all_reduce(a, op, out=out)
                assert res is out
                chk.equal(name + " out", out, want, rtol(op, dt))
                chk.equal(name + " input untouched", a, stack[r])
                a = filled(kind, stack[r])
                w = comm.all_reduce(a, op, async_op=True)
                assert isinstance(w, strata.Work)
                chk.equal(name + " async", w.wait(), want, rtol(op, dt))
                assert w.completed() and w.test() and w.status == strata.Code.Ok
    for algo in ("one_shot", "two_shot"):
        stack = np.stack([data(j, 5000, np.float32) for j in range(n)])
        a = filled(kind, stack[r])
        chk.equal(f"all_reduce {kind} {algo}", comm.all_reduce(a, algorithm=algo), reference("sum", stack, np.float32))
    if n > 1:
        chk.raises(f"all_reduce {kind} avg on int32", strata.InvalidArgument,
                   lambda: comm.all_reduce(filled(kind, data(r, 4, np.int32)), "avg"))

    for dt in (np.float32, np.int64, np.float16, np.uint8):
        for count in (1, 1000, 20000):
            stack = np.stack([data(j, count, dt) for j in range(n)])
            tag = f"{kind} {np.dtype(dt).name} n={count}"

            # ---- reduce -------------------------------------------------------------------------
            for root in {0, n - 1}:
                for op in ("sum", "max"):
                    a = filled(kind, stack[r])
                    res = comm.reduce(a, root, op)
                    if r == root:
                        chk.equal(f"reduce {tag} root={root} {op} in place", res, reference(op, stack, dt))
                    else:
                        assert res is None
                    a = filled(kind, stack[r])
                    out = new(kind, (count,), dt)
                    res = comm.reduce(a, root, op, out=out)
                    if r == root:
                        chk.equal(f"reduce {tag} root={root} {op} out", out, reference(op, stack, dt))

            # ---- broadcast ----------------------------------------------------------------------
            for root in {0, n - 1}:
                a = filled(kind, stack[r])
                chk.equal(f"broadcast {tag} root={root}", comm.broadcast(a, root), stack[root])
                out = new(kind, (count,), dt)
                src = filled(kind, stack[r]) if r == root else None
                chk.equal(f"broadcast {tag} root={root} out", comm.broadcast(src, root, out=out), stack[root])
                a = filled(kind, stack[r])
                chk.equal(f"broadcast {tag} root={root} async", comm.broadcast(a, root, async_op=True).wait(),
                          stack[root])

            # ---- all_gather ---------------------------------------------------------------------
            a = filled(kind, stack[r])
            res = comm.all_gather(a)
            assert comm.is_heap(res), "all_gather without out allocates in the heap"
            chk.equal(f"all_gather {tag}", res, stack)
            out = new(kind, (n * count,), dt)
            chk.equal(f"all_gather {tag} out", comm.all_gather(a, out=out), stack.reshape(-1))
            chk.equal(f"all_gather {tag} async", comm.all_gather(a, async_op=True).wait(), stack)

            # ---- all_gather_v -------------------------------------------------------------------
            counts = [(count + j) % 7 + (j % 2) * count for j in range(n)]
            parts = [data(j, counts[j], dt, salt=1) for j in range(n)]
            a = filled(kind, parts[r])
            chk.equal(f"all_gather_v {tag}", comm.all_gather_v(a, counts), np.concatenate(parts))

            # ---- reduce_scatter -----------------------------------------------------------------
            big = np.stack([data(j, n * count, dt, salt=2) for j in range(n)])
            for op in ("sum", "min"):
                want = reference(op, big, dt)[r * count:(r + 1) * count]
                a = filled(kind, big[r])
                chk.equal(f"reduce_scatter {tag} {op}", comm.reduce_scatter(a, op), want)
                out = new(kind, (count,), dt)
                chk.equal(f"reduce_scatter {tag} {op} out", comm.reduce_scatter(a, op, out=out), want)
            a = filled(kind, big[r].reshape(n, count))
            res = comm.reduce_scatter(a)
            assert res.shape == (1, count), res.shape
            chk.equal(f"reduce_scatter {tag} 2-D", res[0], reference("sum", big, dt)[r * count:(r + 1) * count])

            # ---- reduce_scatter_v ---------------------------------------------------------------
            total = sum(counts)
            big = np.stack([data(j, total, dt, salt=3) for j in range(n)])
            off = sum(counts[:r])
            a = filled(kind, big[r])
            chk.equal(f"reduce_scatter_v {tag}", comm.reduce_scatter_v(a, counts),
                      reference("sum", big, dt)[off:off + counts[r]])

            # ---- all_to_all ---------------------------------------------------------------------
            blocks = np.stack([data(j, n * count, dt, salt=4) for j in range(n)])  # rank j's input
            want = np.concatenate([blocks[j][r * count:(r + 1) * count] for j in range(n)])
            a = filled(kind, blocks[r])
            chk.equal(f"all_to_all {tag}", comm.all_to_all(a), want)
            out = new(kind, (n * count,), dt)
            chk.equal(f"all_to_all {tag} out", comm.all_to_all(a, out=out), want)
            a = filled(kind, blocks[r])
            chk.equal(f"all_to_all {tag} in place", comm.all_to_all(a, out=a), want)

            # ---- all_to_all_v -------------------------------------------------------------------
            def sends(j):  # rank j sends sends(j)[k] elements to rank k
                return [(j + k + count) % 4 + (k == j) * 3 for k in range(n)]
            srcs = [data(j, sum(sends(j)), dt, salt=5) for j in range(n)]
            pieces = []
            for j in range(n):
                o = sum(sends(j)[:r])
                pieces.append(srcs[j][o:o + sends(j)[r]])
            want = np.concatenate(pieces)
            a = filled(kind, srcs[r])
            chk.equal(f"all_to_all_v {tag} counts exchanged", comm.all_to_all_v(a, sends(r)), want)
            recv_counts = [sends(j)[r] for j in range(n)]
            out = new(kind, (len(want),), dt)
            chk.equal(f"all_to_all_v {tag} out", comm.all_to_all_v(a, sends(r), recv_counts, out=out), want)

            # ---- gather / scatter ---------------------------------------------------------------
            for root in {0, n - 1}:
                a = filled(kind, stack[r])
                res = comm.gather(a, root)
                if r == root:
                    chk.equal(f"gather {tag} root={root}", res, stack)
                else:
                    assert res is None
                full = np.stack([data(j, count, dt, salt=6) for j in range(n)])
                src = filled(kind, full) if r == root else None
                out = new(kind, (count,), dt)
                chk.equal(f"scatter {tag} root={root}", comm.scatter(src, root, out=out), full[r])
                if r == root:
                    chk.equal(f"scatter {tag} root={root} out=None", comm.scatter(src, root), full[r])
                else:
                    comm.scatter(None, root, out=out)

    # ---- point to point: a ring, posted async so no pair deadlocks --------------------------------
    if n > 1:
        nxt, prv = (r + 1) % n, (r - 1) % n
        for dt in (np.float32, np.int8):
            msg = filled(kind, data(r, 3000, dt, salt=7))
            got = new(kind, (3000,), dt)
            w = comm.send(msg, nxt, tag=5, async_op=True)
            res = comm.recv(got, prv, tag=5)
            w.wait()
            assert res is got
            chk.equal(f"send/recv {kind} {np.dtype(dt).name}", got, data(prv, 3000, dt, salt=7))
            w = comm.recv(got, prv, async_op=True)
            comm.send(msg, nxt, async_op=True).wait()
            chk.equal(f"recv async {kind}", w.wait(), data(prv, 3000, dt, salt=7))

# ---- several operations in flight at once ---------------------------------------------------------
works, want = [], []
for i in range(6):
    stack = np.stack([data(j, 3000 + i, np.float64, salt=i) for j in range(n)])
    works.append(comm.all_reduce(filled("heap" if i % 2 else "external", stack[r]), async_op=True))
    want.append(reference("sum", stack, np.float64))
comm.barrier()
works.append(comm.barrier(async_op=True))
for i, w in enumerate(works[:-1]):
    chk.equal(f"in flight #{i}", w.wait(), want[i])
assert works[-1].wait() is None

# ---- zero-copy: collectives on heap arrays stage nothing ------------------------------------------
a, out = comm.empty((1 << 16,), np.float32), comm.empty((1 << 16,), np.float32)
a[:] = r
before = comm.stats()
comm.all_reduce(a, out=out)
comm.all_gather(a[:1024], out=comm.empty((n, 1024), np.float32))
comm.reduce_scatter(a, out=comm.empty((a.size // n,), np.float32))
after = comm.stats()
assert after["staged_bytes"] == before["staged_bytes"], (before, after)
if n > 1:
    assert after["direct_bytes"] > before["direct_bytes"], (before, after)
chk.count += 1

# ---- a mismatch is reported on every rank, and the communicator stays usable ----------------------
if n > 1:
    e = chk.raises("mismatched counts", strata.InvalidArgument,
                   lambda: comm.all_reduce(np.ones(10 + r, np.float32)))
    assert e.code == strata.Code.InvalidArgument
    x = np.ones(8, np.float32)
    chk.equal("usable after mismatch", comm.all_reduce(x), np.full(8, n, np.float32))

# ---- a call one rank refuses (the binding's own check) fails its peers' calls naming it, at once ----
if n > 1:
    import time  # noqa: E402

    t0 = time.monotonic()
    bad = r == n - 1
    e = chk.raises("refused on one rank", strata.InvalidArgument,
                   lambda: comm.all_reduce(np.ones(16, np.float32),
                                           out=np.ones(8 if bad else 16, np.float32), timeout=60))
    assert ("needs 16" if bad else f"rank {n - 1} refused its call") in str(e), str(e)
    # The binding's own check names the rank that raised it, as the library's do.
    assert e.rank == r and (not bad or f"on rank {r}" in str(e)), (e.rank, str(e))
    assert time.monotonic() - t0 < 30, "told by the refused call, not by the timeout"
    x = np.ones(8, np.float32)
    chk.equal("usable after a refused call", comm.all_reduce(x), np.full(8, n, np.float32))
    # Arguments of the wrong type (pybind11 would have raised TypeError before the call, so the
    # peers' calls met this rank's next one and mixed data): refused the same way.
    for what, call, want in (
            ("async_op='yes'", lambda bad: comm.all_reduce(np.full(4, 10.0 * (r + 1), np.float32),
                                                           async_op="yes" if bad else False),
             "async_op must be True or False"),
            ("root=0.0", lambda bad: comm.broadcast(np.ones(4, np.float32), root=0.0 if bad else 0),
             "root must be an integer"),
            ("counts=[.., 'x']", lambda bad: comm.all_gather_v(
                np.ones(1, np.float32), ["x" if bad else 1] + [1] * (n - 1)), "counts entry must be an integer")):
        t0 = time.monotonic()
        e = chk.raises("a wrong type refused on one rank: " + what, strata.InvalidArgument,
                       lambda: call(r == n - 1))
        assert (want if bad else f"rank {n - 1} refused its call") in str(e), (what, str(e))
        assert time.monotonic() - t0 < 30, "told by the refused call, not by the timeout"
        chk.equal("in step after " + what, comm.all_reduce(np.full(4, r + 1.0, np.float32)),
                  np.full(4, n * (n + 1) / 2, np.float32))

# ---- split: color by parity, key reverses the order -------------------------------------------------
sub = comm.split(r % 2, key=-r)
members = [j for j in range(n) if j % 2 == r % 2]
assert sub.size == len(members), (sub.size, members)
assert sub.rank == sorted(members, reverse=True).index(r), (sub.rank, members)
x = np.full(4, r, np.int64)
chk.equal("split all_reduce", sub.all_reduce(x), np.full(4, sum(members), np.int64))
y = comm.empty((4,), np.int64)  # heap arrays of the parent work in the child (one heap)
y[:] = 1
chk.equal("split heap array", sub.all_reduce(y), np.full(4, len(members), np.int64))
assert comm.split(-1) is None

# ---- "no deadline": float('inf') and timedelta.max wait (they timed out at once, wrapped) ----------
import datetime  # noqa: E402

for forever in (float("inf"), datetime.timedelta.max, 1e10):
    x = np.ones(4, np.float32)
    chk.equal(f"all_reduce timeout={forever!r}", comm.all_reduce(x, timeout=forever), np.full(4, n, np.float32))
comm.barrier()
chk.ok()
