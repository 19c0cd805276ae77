"""torch.distributed with backend "strata", used exactly as a torch user would: every operation
against a reference computed from every rank's deterministic input, then DDP training compared
with the same training over gloo.

argv: [quick]  quick: a subset (for launch modes other than strata run)."""

import os
import sys
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F

import strata  # registers the backend

warnings.filterwarnings("ignore", message=".*all_reduce_coalesced will be deprecated")

quick = "quick" in sys.argv[1:]
dist.init_process_group("strata")
assert dist.get_backend() == "strata"
r, n = dist.get_rank(), dist.get_world_size()
checks = 0


def data(rank, count, dtype=torch.float32, salt=0):
    return (((torch.arange(count) + 3 * rank + salt) % 5) + 1).to(dtype)


def check(name, got, want, exact=True, atol=0.0):
    global checks
    checks += 1
    if got.shape != want.shape:
        raise AssertionError(f"rank {r}: {name}: shape {tuple(got.shape)} != {tuple(want.shape)}")
    g, w = got.double(), want.double()
    rtol = 1e-2 if got.dtype in (torch.float16, torch.bfloat16) else 1e-5
    bad = (g != w) if exact else ~torch.isclose(g, w, rtol=rtol, atol=atol)
    if bool(bad.any()):
        i = int(bad.reshape(-1).nonzero()[0])
        raise AssertionError(f"rank {r}: {name}: at flat index {i} got {got.reshape(-1)[i].item()}, "
                             f"expected {want.reshape(-1)[i].item()}")


def stack(count, dtype=torch.float32, salt=0):
    return torch.stack([data(j, count, dtype, salt) for j in range(n)])


# ---- all_reduce: every op, several dtypes, sync and async --------------------------------------
ops = {dist.ReduceOp.SUM: lambda s: s.double().sum(0), dist.ReduceOp.PRODUCT: lambda s: s.double().prod(0),
       dist.ReduceOp.MIN: lambda s: s.double().min(0).values, dist.ReduceOp.MAX: lambda s: s.double().max(0).values,
       dist.ReduceOp.AVG: lambda s: s.double().mean(0)}
for dtype in (torch.float32, torch.float64, torch.int64, torch.int32, torch.float16, torch.bfloat16, torch.uint8):
    for count in ((7, 20000) if not quick else (7,)):
        s = stack(count, dtype)
        for op, ref in ops.items():
            if op == dist.ReduceOp.AVG and not dtype.is_floating_point:
                continue
            if op == dist.ReduceOp.PRODUCT and dtype in (torch.uint8,):
                continue  # wraps: compared elsewhere (numpy tests)
            t = s[r].clone()
            dist.all_reduce(t, op=op)
            want = ref(s).to(dtype)
            check(f"all_reduce {dtype} {count} {op}", t, want, exact=op not in (dist.ReduceOp.AVG,))
        t = s[r].clone()
        w = dist.all_reduce(t, async_op=True)
        w.wait()
        assert w.is_completed()
        check(f"all_reduce async {dtype}", t, s.double().sum(0).to(dtype))

# ---- async work progresses without a wait(): polled, through its future, or left alone ------------
t = data(r, 1000)
w = dist.all_reduce(t, async_op=True)
deadline = time.monotonic() + 30
while not w.is_completed():
    assert time.monotonic() < deadline, "a polled all_reduce did not complete"
check("all_reduce polled", t, stack(1000).sum(0))
t = data(r, 1000)
fut = dist.all_reduce(t, async_op=True).get_future()
check("all_reduce future", fut.wait()[0], stack(1000).sum(0))
t = data(r, 1000)
w = dist.all_reduce(t, async_op=True)
time.sleep(0.5)  # nobody waits: the process group's thread runs it
assert w.is_completed(), "an async all_reduce left alone did not run"
check("all_reduce left alone", t, stack(1000).sum(0))

# ---- broadcast, reduce --------------------------------------------------------------------------
for root in sorted({0, n - 1}):
    t = data(r, 1000, torch.float64)
    dist.broadcast(t, src=root)
    check(f"broadcast root={root}", t, data(root, 1000, torch.float64))
    b = torch.tensor([r % 2 == 0, True, False])  # bool moves as bytes
    dist.broadcast(b, src=root)
    check("broadcast bool", b, torch.tensor([root % 2 == 0, True, False]))
    t = data(r, 500)
    dist.reduce(t, dst=root, op=dist.ReduceOp.MAX)
    if r == root:
        check(f"reduce root={root}", t, stack(500).max(0).values)

# ---- all_gather (list and tensor forms) ---------------------------------------------------------
inp = data(r, 300, torch.int64, salt=1)
outs = [torch.empty(300, dtype=torch.int64) for _ in range(n)]
dist.all_gather(outs, inp)
for j in range(n):
    check(f"all_gather [{j}]", outs[j], data(j, 300, torch.int64, salt=1))
big = torch.empty(n * 300, dtype=torch.int64)
dist.all_gather(list(big.chunk(n)), inp)  # adjacent outputs: gathered in place
check("all_gather chunks", big, stack(300, torch.int64, salt=1).reshape(-1))
big.zero_()
dist.all_gather_into_tensor(big, inp)
check("all_gather_into_tensor", big, stack(300, torch.int64, salt=1).reshape(-1))
dist.all_gather_object(objs := [None] * n, {"rank": r})
assert objs == [{"rank": j} for j in range(n)], objs

# ---- reduce_scatter (list and tensor forms) ------------------------------------------------------
full = stack(n * 128, salt=2)  # rank j's input
want = full.sum(0)[r * 128:(r + 1) * 128]
out = torch.empty(128)
dist.reduce_scatter(out, list(full[r].clone().chunk(n)))
check("reduce_scatter", out, want)
out.zero_()
dist.reduce_scatter_tensor(out, full[r].clone())
check("reduce_scatter_tensor", out, want)

# ---- all_to_all_single (equal and given splits), all_to_all ----------------------------------------
inp = torch.arange(n * 4, dtype=torch.float32) + 100 * r
out = torch.empty(n * 4)
dist.all_to_all_single(out, inp)
check("all_to_all_single", out, torch.cat([torch.arange(r * 4, r * 4 + 4, dtype=torch.float32) + 100 * j
                                            for j in range(n)]))
send_splits = [(r + j) % 3 + 1 for j in range(n)]  # rows rank r sends to rank j
recv_splits = [(j + r) % 3 + 1 for j in range(n)]  # rows rank j sends to rank r
inp = torch.cat([torch.full((send_splits[j], 2), float(10 * r + j)) for j in range(n)])
out = torch.empty(sum(recv_splits), 2)
dist.all_to_all_single(out, inp, output_split_sizes=recv_splits, input_split_sizes=send_splits)
check("all_to_all_single splits", out, torch.cat([torch.full((recv_splits[j], 2), float(10 * j + r))
                                                   for j in range(n)]))
ins = [torch.full((j + 1,), float(r)) for j in range(n)]
outs = [torch.empty(r + 1) for _ in range(n)]
dist.all_to_all(outs, ins)
for j in range(n):
    check(f"all_to_all [{j}]", outs[j], torch.full((r + 1,), float(j)))

# ---- gather, scatter, barrier --------------------------------------------------------------------
root = n - 1
g = [torch.empty(5) for _ in range(n)] if r == root else None
dist.gather(data(r, 5), gather_list=g, dst=root)
if r == root:
    for j in range(n):
        check(f"gather [{j}]", g[j], data(j, 5))
out = torch.empty(6)
dist.scatter(out, scatter_list=[data(j, 6, salt=3) for j in range(n)] if r == 0 else None, src=0)
check("scatter", out, data(r, 6, salt=3))
dist.barrier()

# ---- point to point: blocking ring, and isend/irecv both ways at once ------------------------------
if n > 1:
    nxt, prv = (r + 1) % n, (r - 1) % n
    if r % 2 == 0:
        dist.send(data(r, 64), nxt)
        t = torch.empty(64)
        dist.recv(t, prv)
    else:
        t = torch.empty(64)
        dist.recv(t, prv)
        dist.send(data(r, 64), nxt)
    check("send/recv ring", t, data(prv, 64))
    got = torch.empty(4096)
    reqs = [dist.isend(data(r, 4096, salt=4), nxt), dist.irecv(got, prv)]
    for q in reqs:
        q.wait()
    check("isend/irecv", got, data(prv, 4096, salt=4))
    got = torch.empty(10)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, data(r, 10, salt=5), nxt),
                                   dist.P2POp(dist.irecv, got, prv)])
    for q in reqs:
        q.wait()
    check("batch_isend_irecv", got, data(prv, 10, salt=5))

# ---- coalesced, sub-groups --------------------------------------------------------------------------
ts = [data(r, 5), data(r, 3, salt=1)]
dist.all_reduce_coalesced(ts)
check("all_reduce_coalesced [0]", ts[0], stack(5).sum(0))
check("all_reduce_coalesced [1]", ts[1], stack(3, salt=1).sum(0))
if n > 1 and not quick:
    members = list(range(0, n, 2)) if n > 2 else [0, 1]
    sub = dist.new_group(members, backend="strata")
    if r in members:
        t = torch.full((8,), float(r))
        dist.all_reduce(t, group=sub)
        check("sub-group all_reduce", t, torch.full((8,), float(sum(members))))

# ---- heap tensors: the strata communicator behind the group, zero-copy through torch -----------------
comm = strata.torch_communicator()
assert comm.rank == r and comm.size == n
h = comm.empty_tensor((1 << 15,), torch.float32)
h.fill_(r + 1)
before = comm.stats()["staged_bytes"]
dist.all_reduce(h)
assert comm.stats()["staged_bytes"] == before, "a heap tensor was staged"
check("all_reduce heap tensor", h, torch.full((1 << 15,), n * (n + 1) / 2))
hb = comm.empty_tensor((100,), torch.bfloat16)
hb.fill_(1.5)
comm.all_reduce(hb)  # strata's own API takes tensors too
check("strata all_reduce bfloat16 tensor", hb, torch.full((100,), 1.5 * n, dtype=torch.bfloat16))
check("strata all_gather tensor", comm.all_gather(data(r, 3)), stack(3))
try:
    comm.all_reduce(torch.ones(4, 4).t())
    raise AssertionError("a non-contiguous tensor was accepted")
except strata.InvalidArgument as e:
    assert "not contiguous" in str(e)

# ---- errors surface through torch with Strata's classes ----------------------------------------------
try:
    dist.all_reduce(torch.ones(3, dtype=torch.int32), op=dist.ReduceOp.AVG)
    raise AssertionError("avg on int32 did not fail")
except strata.InvalidArgument as e:
    assert "avg" in str(e), e
try:
    dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BAND)
    raise AssertionError("BAND on float32 did not fail")
except strata.InvalidArgument as e:
    assert "integer types only" in str(e), e
checks += 2

# ---- a call the backend's own checks refuse on one rank fails the others' calls naming it, at once ---
if n > 1:
    import time

    t0 = time.monotonic()
    outs = [torch.zeros(3) for _ in range(n - 1 if r == n - 1 else n)]
    try:
        dist.all_gather(outs, torch.ones(3))
        raise AssertionError(f"rank {r}: an all_gather refused by rank {n - 1} did not fail")
    except AssertionError:
        raise
    except Exception as e:  # torch's RuntimeError on the refusing rank, strata.InvalidArgument on the others
        want = f"needs one output list of {n} tensors" if r == n - 1 else f"rank {n - 1} refused its call"
        assert want in str(e), e
    assert time.monotonic() - t0 < 30, "told by the refused call, not by the timeout"
    x = torch.ones(4)
    dist.all_reduce(x)
    check("all_reduce after a refused call", x, torch.full((4,), float(n)))
    checks += 1

# ---- DDP: a few steps over strata match the same steps over gloo -------------------------------------
if not quick:
    gloo = dist.new_group(backend="gloo")

    def train(group):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                    torch.nn.ReLU(), torch.nn.Linear(64, 8))
        ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group, bucket_cap_mb=0.01)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        gen = torch.Generator().manual_seed(100 + r)  # different data per rank
        for _ in range(5):
            x, y = torch.randn(16, 32, generator=gen), torch.randint(0, 8, (16,), generator=gen)
            opt.zero_grad()
            F.cross_entropy(ddp(x), y).backward()
            opt.step()
        return [p.detach().clone() for p in model.parameters()]

    a, b = train(None), train(gloo)
    # torch's CPU allocator on the strata heap: DDP's gradient buckets live in registered
    # memory, so its all_reduces stage nothing.
    staged = comm.stats()["staged_bytes"]
    with strata.torch_heap_tensors():
        c = train(None)
        assert comm.is_heap(c[0]), "tensors made under torch_heap_tensors() are in the heap"
        pid = os.fork()  # a forked child (a DataLoader worker) must not allocate from our heap
        if pid == 0:
            os._exit(3 if comm.is_heap(torch.ones(100)) else 0)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0, "the forked child allocated in the heap"
    if n > 1:
        assert comm.stats()["staged_bytes"] == staged, "DDP over heap tensors staged bytes"
    assert not comm.is_heap(torch.empty(100)), "the allocator is back to torch's"
    for i, (pa, pb, pc) in enumerate(zip(a, b, c)):
        # Two ranks sum in the same order as gloo; more ranks may round differently.
        check(f"DDP parameter {i} strata vs gloo", pa, pb, exact=(n <= 2), atol=1e-6)
        check(f"DDP parameter {i} strata heap allocator vs strata", pc, pa)
    # Every rank ends with the same parameters.
    flat = torch.cat([p.reshape(-1) for p in a])
    ref = flat.clone()
    dist.broadcast(ref, src=0)
    check("DDP parameters equal across ranks", flat, ref)

dist.barrier()
dist.destroy_process_group()
print(f"OK {checks} checks", flush=True)
