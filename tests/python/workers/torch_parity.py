"""torch.distributed over "strata" against gloo in the same processes: every call and option
gloo supports on CPU in torch 1.13, each computed on a strata group and on a gloo group over
the same ranks and compared (issue 20 item 4). Where gloo refuses a call or an option, the
case says so and checks strata's result against a reference instead.

Each case prints "PASS <name>" or "FAIL <name>: ..." on every rank; test_torch_parity.py has
one test per case. Every wait is bounded: STRATA_TIMEOUT and the gloo groups' timeouts."""

import datetime
import time
import traceback

import torch
import torch.distributed as dist

import strata

LONG = datetime.timedelta(seconds=30)
dist.init_process_group("strata", timeout=datetime.timedelta(seconds=25))
r, n = dist.get_rank(), dist.get_world_size()
assert n >= 3, "the parity cases need 3 ranks or more (sub-groups leave a rank out)"
gloo = dist.new_group(backend="gloo", timeout=LONG)
cases = []


def case(fn):
    cases.append(fn)
    return fn


def same(name, a, b, exact=True):
    """a (strata) equals b (gloo): tensors, sparse tensors, lists, tuples, plain objects."""
    if isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{name}: {a!r} vs {b!r}"
        for i, (x, y) in enumerate(zip(a, b)):
            same(f"{name}[{i}]", x, y, exact)
        return
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"{name}: tensor vs {type(b)}"
        assert a.layout == b.layout, f"{name}: layout {a.layout} vs {b.layout}"
        if a.is_sparse:
            a, b = a.to_dense(), b.to_dense()
        assert a.dtype == b.dtype and a.shape == b.shape, f"{name}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
        ok = torch.equal(a, b) if exact else torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-6)
        assert ok, f"{name}: strata {a} vs gloo {b}"
        return
    assert a == b, f"{name}: strata {a!r} vs gloo {b!r}"


def both(name, fn, exact=True):
    """fn(group) on the default (strata) group and on gloo; equal results."""
    a = fn(None)
    b = fn(gloo)
    same(name, a, b, exact)
    return a


def raises(fn, *words):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the classes differ between backends
        msg = str(e)
        assert all(w in msg for w in words), f"error {msg!r} lacks {words}"
        return msg
    raise AssertionError("did not raise")


def data(rank, count, dtype=torch.float32, salt=0):
    return (((torch.arange(count) + 3 * rank + salt) % 5) + 1).to(dtype)


def bits(rank, count, dtype):
    return ((torch.arange(count) * 37 + 11 * rank + 5) % 120).to(dtype)


# ---- reductions: every ReduceOp gloo has ---------------------------------------------------------------
ARITH = {"SUM": dist.ReduceOp.SUM, "PRODUCT": dist.ReduceOp.PRODUCT, "MIN": dist.ReduceOp.MIN,
         "MAX": dist.ReduceOp.MAX}
BITWISE = {"BAND": dist.ReduceOp.BAND, "BOR": dist.ReduceOp.BOR, "BXOR": dist.ReduceOp.BXOR}
INTS = (torch.int8, torch.uint8, torch.int32, torch.int64)


@case
def all_reduce():
    for dtype in (torch.float32, torch.float64, torch.float16, torch.int32, torch.int64, torch.uint8, torch.int8):
        for opname, op in ARITH.items():
            for count in (5, 3000):
                def f(g, dtype=dtype, op=op, count=count):
                    t = data(r, count, dtype)
                    dist.all_reduce(t, op=op, group=g)
                    return t
                both(f"all_reduce {dtype} {opname} {count}", f)
    # async_op: the work's result and future
    def g_async(g):
        t = data(r, 100)
        w = dist.all_reduce(t, async_op=True, group=g)
        fut = w.get_future()
        w.wait()
        return [t, fut.wait()[0]]
    both("all_reduce async", g_async)


@case
def bitwise_ops():
    for dtype in INTS:
        for opname, op in BITWISE.items():
            for count in (7, 5000):
                def f(g, dtype=dtype, op=op, count=count):
                    t = bits(r, count, dtype)
                    dist.all_reduce(t, op=op, group=g)
                    return t
                both(f"all_reduce {dtype} {opname} {count}", f)
        def red(g, dtype=dtype):
            t = bits(r, 64, dtype)
            dist.reduce(t, dst=1, op=dist.ReduceOp.BXOR, group=g)
            return t if r == 1 else None
        both(f"reduce {dtype} BXOR", red)
    # Both refuse bitwise ops on floating types.
    for g in (None, gloo):
        raises(lambda g=g: dist.all_reduce(torch.ones(4), op=dist.ReduceOp.BAND, group=g), "BAND" if g else "band")


@case
def avg_and_premul_sum():
    # gloo refuses AVG; strata gives the mean.
    raises(lambda: dist.all_reduce(torch.ones(4), op=dist.ReduceOp.AVG, group=gloo), "AVG")
    t = data(r, 9, torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    same("avg", t, torch.stack([data(j, 9, torch.float64) for j in range(n)]).mean(0))
    for g in (None, gloo):  # neither supports PREMUL_SUM on CPU
        raises(lambda g=g: dist.all_reduce(torch.ones(4), op=dist.ReduceOp.PREMUL_SUM, group=g), "PREMUL_SUM")


@case
def all_reduce_coalesced():
    def f(g):
        ts = [data(r, 5), data(r, 300, salt=1), data(r, 1, salt=2)]
        dist.all_reduce_coalesced(ts, op=dist.ReduceOp.MAX, group=g)
        return ts
    both("all_reduce_coalesced", f)


@case
def sparse_all_reduce():
    def f(g):
        # Rank r's entries overlap rank r+1's: the sum adds duplicates.
        idx = torch.tensor([[r, r + 1, 2 * r % 5], [0, 3, 1]])
        val = torch.tensor([1.0 + r, 2.0, 0.5 * r])
        t = torch.sparse_coo_tensor(idx, val, (6, 4))
        dist.all_reduce(t, group=g)
        return t
    got = both("sparse all_reduce", f)
    assert got.is_sparse
    def dense_rows(g):  # values with a dense dimension
        idx = torch.tensor([[r, 0]])
        t = torch.sparse_coo_tensor(idx, torch.arange(6, dtype=torch.float64).reshape(2, 3) + r, (4, 3))
        dist.all_reduce(t, group=g)
        return t
    both("sparse all_reduce, dense dims", dense_rows)
    raises(lambda: dist.all_reduce(torch.ones(3).to_sparse(), op=dist.ReduceOp.MAX), "SUM")


@case
def reduce():
    for root in range(n):
        for opname, op in ARITH.items():
            def f(g, root=root, op=op):
                t = data(r, 40, torch.float64)
                dist.reduce(t, dst=root, op=op, group=g)
                return t if r == root else None
            both(f"reduce root={root} {opname}", f)


@case
def broadcast():
    for root in range(n):
        for dtype in (torch.float32, torch.int64, torch.uint8):
            def f(g, root=root, dtype=dtype):
                t = data(r, 33, dtype)
                dist.broadcast(t, src=root, group=g)
                return t
            both(f"broadcast root={root} {dtype}", f)
        # gloo in 1.13 refuses bool and bfloat16 ("Invalid scalar type"); strata moves bytes.
        for dtype in (torch.bool, torch.bfloat16):
            raises(lambda dtype=dtype: dist.broadcast(torch.ones(3, dtype=dtype), src=root, group=gloo),
                   "Invalid scalar type")
            t = data(r, 33, dtype)
            dist.broadcast(t, src=root)
            same(f"broadcast root={root} {dtype}", t, data(root, 33, dtype))


@case
def all_gather():
    def f(g):
        outs = [torch.empty(17, dtype=torch.int64) for _ in range(n)]
        dist.all_gather(outs, data(r, 17, torch.int64), group=g)
        return outs
    got = both("all_gather", f)
    # all_gather_into_tensor (_allgather_base): gloo in 1.13 has none; against all_gather.
    big = torch.empty(n * 17, dtype=torch.int64)
    dist.all_gather_into_tensor(big, data(r, 17, torch.int64))
    same("all_gather_into_tensor", big, torch.cat(got))


@case
def all_gather_coalesced():
    def f(g):
        ins = [data(r, 4), data(r, 7, salt=1), data(r, 1, salt=2)]  # gloo flattens them: one dtype
        outs = [[torch.empty_like(t) for t in ins] for _ in range(n)]
        dist.all_gather_coalesced(outs, ins, group=g)
        return outs
    both("all_gather_coalesced", f)


@case
def gather_scatter():
    for root in range(n):
        def gat(g, root=root):
            out = [torch.empty(6) for _ in range(n)] if r == root else None
            dist.gather(data(r, 6), gather_list=out, dst=root, group=g)
            return out
        both(f"gather root={root}", gat)

        def sca(g, root=root):
            t = torch.empty(5, dtype=torch.int64)
            ins = [data(j, 5, torch.int64, salt=3) for j in range(n)] if r == root else None
            dist.scatter(t, scatter_list=ins, src=root, group=g)
            return t
        both(f"scatter root={root}", sca)


@case
def reduce_scatter():
    # gloo in torch 1.13 has no reduce_scatter: compared with gloo's all_reduce, sliced.
    raises(lambda: dist.reduce_scatter(torch.empty(4), [torch.ones(4)] * n, group=gloo), "reduce_scatter")
    for opname, op in ARITH.items():
        full = data(r, n * 8, torch.float64, salt=2)
        ref = full.clone()
        dist.all_reduce(ref, op=op, group=gloo)
        want = ref[r * 8:(r + 1) * 8]
        out = torch.empty(8, dtype=torch.float64)
        dist.reduce_scatter(out, list(full.clone().chunk(n)), op=op)
        same(f"reduce_scatter {opname}", out, want)
        out.zero_()
        dist.reduce_scatter_tensor(out, full.clone(), op=op)
        same(f"reduce_scatter_tensor {opname}", out, want)


@case
def all_to_all():
    def even(g):
        out = torch.empty(n * 3)
        dist.all_to_all_single(out, torch.arange(n * 3, dtype=torch.float32) + 100 * r, group=g)
        return out
    both("all_to_all_single", even)

    def uneven(g):
        send = [(r + j) % 3 for j in range(n)]  # rows rank r sends to rank j (0 included)
        recv = [(j + r) % 3 for j in range(n)]
        inp = torch.cat([torch.full((send[j], 2), float(10 * r + j)) for j in range(n)])
        out = torch.empty(sum(recv), 2)
        dist.all_to_all_single(out, inp, output_split_sizes=recv, input_split_sizes=send, group=g)
        return out
    both("all_to_all_single uneven", uneven)

    # The list form: gloo in 1.13 has none; against the values every rank sent.
    raises(lambda: dist.all_to_all([torch.empty(1)] * n, [torch.ones(1)] * n, group=gloo), "alltoall")
    ins = [torch.full((j + 1,), float(r * 10 + j)) for j in range(n)]
    outs = [torch.empty(r + 1) for _ in range(n)]
    dist.all_to_all(outs, ins)
    same("all_to_all", outs, [torch.full((r + 1,), float(j * 10 + r)) for j in range(n)])


@case
def send_recv():
    nxt, prv = (r + 1) % n, (r - 1) % n

    def f(g):
        got = torch.empty(50)
        if r % 2 == 0:
            dist.send(data(r, 50), nxt, group=g, tag=3)
            src = dist.recv(got, prv, group=g, tag=3)
        else:
            src = dist.recv(got, prv, group=g, tag=3)
            dist.send(data(r, 50), nxt, group=g, tag=3)
        return [got, src]
    both("send/recv", f)

    def nonblocking(g):
        got = torch.empty(2000)
        reqs = [dist.isend(data(r, 2000, salt=4), nxt, group=g), dist.irecv(got, prv, group=g)]
        for q in reqs:
            q.wait()
        return got
    both("isend/irecv", nonblocking)


@case
def recv_any_source():
    # Every other rank sends two messages to rank 0, which receives them without naming the
    # source: the sender is reported, and each sender's messages come in its order.
    def f(g):
        if r == 0:
            got = {}
            for _ in range(2 * (n - 1)):
                t = torch.empty(4, dtype=torch.int64)
                src = dist.recv(t, group=g, tag=7)
                assert int(t[0]) == src, f"message from {src} carries {t.tolist()}"
                got.setdefault(src, []).append(int(t[1]))
            return sorted((s, v) for s, v in got.items())
        for k in range(2):
            dist.send(torch.tensor([r, k, 0, 0]), 0, group=g, tag=7)
        return None
    got = both("recv from any source", f)
    if r == 0:
        assert got == [(s, [0, 1]) for s in range(1, n)], got

    # The tag chooses among senders: rank 1 sends tag 5, rank 2 tag 6; rank 0 asks for 6 first.
    t = torch.empty(1)
    if r in (1, 2):
        w = dist.isend(torch.full((1,), float(r)), 0, tag=4 + r)
        w.wait()
    elif r == 0:
        assert dist.recv(t, tag=6) == 2 and float(t) == 2.0
        assert dist.recv(t, tag=5) == 1 and float(t) == 1.0
    # irecv without a source: the work reports it.
    if r == 0:
        w = dist.irecv(t)
        w.wait()
        assert w._source_rank() == n - 1 and float(t) == 42.0
    elif r == n - 1:
        dist.send(torch.full((1,), 42.0), 0)
    # On the C++ API (through Python), too.
    comm = strata.torch_communicator()
    import numpy as np
    if r == 0:
        buf = np.zeros(3, np.int32)
        assert comm.recv_any(buf, tag=9) == 1 and buf.tolist() == [1, 2, 3]
    elif r == 1:
        comm.send(np.array([1, 2, 3], np.int32), 0, tag=9)


@case
def batch_isend_irecv():
    nxt, prv = (r + 1) % n, (r - 1) % n

    def f(g):
        a, b = torch.empty(10), torch.empty(3, dtype=torch.int64)
        ops = [dist.P2POp(dist.isend, data(r, 10, salt=5), nxt, group=g),
               dist.P2POp(dist.irecv, a, prv, group=g),
               dist.P2POp(dist.isend, data(r, 3, torch.int64), prv, group=g),
               dist.P2POp(dist.irecv, b, nxt, group=g)]
        for q in dist.batch_isend_irecv(ops):
            q.wait()
        return [a, b]
    both("batch_isend_irecv", f)


@case
def object_collectives():
    obj = {"rank": r, "payload": list(range(r + 1)), "name": "x" * (r * 50)}

    def f(g):
        out = {}
        gathered = [None] * n
        dist.all_gather_object(gathered, obj, group=g)
        out["all_gather_object"] = gathered
        lst = [obj, r] if r == 1 else [None, None]
        dist.broadcast_object_list(lst, src=1, group=g)
        out["broadcast_object_list"] = lst
        gl = [None] * n if r == 2 else None
        dist.gather_object(obj, gl, dst=2, group=g)
        out["gather_object"] = gl
        got = [None]
        dist.scatter_object_list(got, [{"to": j} for j in range(n)] if r == 0 else None, src=0, group=g)
        out["scatter_object_list"] = got
        return out
    a, b = f(None), f(gloo)
    assert a == b, (a, b)
    assert a["all_gather_object"][n - 1]["rank"] == n - 1 and a["scatter_object_list"] == [{"to": r}]


@case
def barrier():
    for g in (None, gloo):
        dist.barrier(group=g)
        w = dist.barrier(group=g, async_op=True)
        w.wait()


@case
def monitored_barrier():
    # torch 1.13's dist.monitored_barrier refuses every backend but gloo by name; the process
    # group call behind it is strata's (strata.torch_monitored_barrier).
    raises(lambda: dist.monitored_barrier(), "only implemented for GLOO")
    dist.monitored_barrier(group=gloo, timeout=LONG)
    strata.torch_monitored_barrier(timeout=LONG)
    strata.torch_monitored_barrier(timeout=LONG, wait_all_ranks=True)
    # A timeout that is not positive would mean no monitoring at all: refused on every rank.
    err = raises(lambda: strata.torch_monitored_barrier(timeout=-1), "timeout must be positive")
    assert isinstance(err, str)
    try:
        strata.torch_monitored_barrier(timeout=0)
        raise AssertionError("a zero timeout was accepted")
    except strata.InvalidArgument:
        pass
    # Rank n-1 does not come: rank 0 names it after the timeout, on both. Dedicated groups,
    # since their point-to-point streams are left out of step.
    # gloo's other ranks wait for rank 0's release for the group's timeout, not the barrier's.
    sg = dist.new_group(backend="strata", timeout=datetime.timedelta(seconds=3))
    gg = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=3))
    msgs = []
    for name, call in (("strata", lambda t, w: strata.torch_monitored_barrier(sg, t, w)),
                       ("gloo", lambda t, w: dist.monitored_barrier(gg, t, w))):
        if r == n - 1:
            continue
        t0 = time.monotonic()
        try:
            call(datetime.timedelta(seconds=1.5), True)
            raise AssertionError(f"{name}: a monitored barrier without rank {n - 1} passed")
        except RuntimeError as e:
            took = time.monotonic() - t0
            if r == 0:
                assert f"Ranks {n - 1} failed to pass monitoredBarrier" in str(e), f"{name}: {e}"
                msgs.append(str(e))
            assert took < 15, f"{name}: failed after {took:.1f} s"
    dist.barrier(group=gloo)


@case
def subgroups():
    members = [0, 2]
    sub = dist.new_group(members, backend="strata")
    gsub = dist.new_group(members, backend="gloo")
    if r in members:
        assert strata.torch_communicator(sub).size == len(members)
        assert dist.get_world_size(sub) == len(members) and dist.get_rank(sub) == members.index(r)

        def f(g):
            t = data(r, 20)
            dist.all_reduce(t, group=g)
            b = data(r, 5, torch.int64)
            dist.broadcast(b, src=2, group=g)  # global rank
            outs = [torch.empty(3) for _ in members]
            dist.all_gather(outs, data(r, 3), group=g)
            got = torch.empty(4)
            peer = members[1 - members.index(r)]
            reqs = [dist.isend(data(r, 4), peer, group=g), dist.irecv(got, peer, group=g)]
            for q in reqs:
                q.wait()
            src = None
            if r == 0:
                src = dist.recv(got, group=g)  # any source: the global rank comes back
            else:
                dist.send(data(r, 4, salt=1), 0, group=g)
            return [t, b, outs, got, src]
        a = f(sub)
        b = f(gsub)
        same("sub-group", a, b)
    else:
        # Non-members are left out: calls on the group are no-ops that leave the tensor alone.
        assert dist.get_rank(sub) == -1
        t = torch.ones(3)
        dist.all_reduce(t, group=sub)
        same("non-member", t, torch.ones(3))
    # The world keeps working after members used the sub-group.
    t = torch.ones(2)
    dist.all_reduce(t)
    same("world after sub-group", t, torch.full((2,), float(n)))


@case
def timeouts():
    # init_process_group(timeout=...) reaches the communicator.
    assert abs(strata.torch_communicator().timeout - 25.0) < 1e-6, strata.torch_communicator().timeout
    # A group's timeout: rank n-1 stays away from an all_reduce; the others fail after about
    # that timeout with an error, not a hang, on strata and on gloo.
    short = datetime.timedelta(seconds=2)
    sg = dist.new_group(backend="strata", timeout=short)
    gg = dist.new_group(backend="gloo", timeout=short)
    for name, g in (("strata", sg), ("gloo", gg)):
        if r == n - 1:
            continue
        t0 = time.monotonic()
        try:
            dist.all_reduce(torch.ones(4), group=g)
            raise AssertionError(f"{name}: all_reduce without rank {n - 1} completed")
        except RuntimeError as e:
            took = time.monotonic() - t0
            assert 1.5 <= took < 12, f"{name}: failed after {took:.1f} s ({e})"
            if name == "strata":
                assert isinstance(e, strata.Timeout) or "timed out" in str(e).lower(), e
    dist.barrier(group=gloo)


for fn in cases:
    try:
        fn()
        print(f"PASS {fn.__name__}", flush=True)
    except Exception as e:  # noqa: BLE001 - reported per case
        print(f"FAIL {fn.__name__}: {type(e).__name__}: {e}", flush=True)
        traceback.print_exc()
dist.barrier(group=gloo)
print(f"DONE {len(cases)} cases", flush=True)
