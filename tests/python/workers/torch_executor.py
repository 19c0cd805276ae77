"""How a torch program may drive the strata group's works beyond issue-and-wait (a future
callback that starts a collective and waits for it inside, as torch's PowerSGD hook does;
works left un-waited when the group is destroyed or the program ends; Work.wait(timeout)),
and the layouts of all_gather outputs that gloo takes."""

import datetime
import sys
import time

import torch
import torch.distributed as dist

import strata  # registers the backend

mode = sys.argv[1]
dist.init_process_group("strata", timeout=datetime.timedelta(seconds=20))
r, n = dist.get_rank(), dist.get_world_size()
total = n * (n + 1) // 2

if mode == "callback":
    # Inside a callback of one work's future: a blocking collective, and an async one whose
    # future is waited for. Both deadlocked: the callback ran on the group's only executor
    # thread, and the new work queued behind it.
    a = torch.ones(3) * (r + 1)

    def blocking(fut):
        b = torch.ones(3) * 10
        dist.all_reduce(b)
        return fut.value()[0] + b

    def through_future(fut):
        b = torch.ones(3) * 100
        dist.all_reduce(b, async_op=True).get_future().wait()
        return fut.value()[0] + b

    got = dist.all_reduce(a, async_op=True).get_future().then(blocking).wait()
    assert got.tolist() == [total + 10.0 * n] * 3, got
    a = torch.ones(3) * (r + 1)
    got = dist.all_reduce(a, async_op=True).get_future().then(through_future).wait()
    assert got.tolist() == [total + 100.0 * n] * 3, got
    # Work queued before the callback ran, waited for inside it.
    a, c = torch.ones(3) * (r + 1), torch.ones(3)
    w1 = dist.all_reduce(a, async_op=True)
    w2 = dist.all_reduce(c, async_op=True)
    got = w1.get_future().then(lambda f: w2.get_future().wait()[0] + f.value()[0]).wait()
    assert got.tolist() == [total + n] * 3, got
    # The same with the later work's future taken before (nothing asks for it in the callback).
    a, c = torch.ones(3) * (r + 1), torch.ones(3)
    w1 = dist.all_reduce(a, async_op=True)
    f2 = dist.all_reduce(c, async_op=True).get_future()
    got = w1.get_future().then(lambda f: f2.wait()[0] + f.value()[0]).wait()
    assert got.tolist() == [total + n] * 3, got
elif mode == "destroy":
    # Fire and forget, then destroy: the works run, their tensors are dropped without the GIL
    # held by the destroying thread (it deadlocked).
    for k in range(5):
        dist.all_reduce(torch.ones(100000) * (r + k), async_op=True)
    dist.destroy_process_group()
elif mode == "exit":
    # Works left un-waited and the group left to the interpreter's exit.
    for k in range(5):
        dist.all_reduce(torch.ones(100000) * (r + k), async_op=True)
elif mode == "wait_timeout":
    # Rank 1 comes 3 s late: rank 0's wait with a 1 s timeout raises after about 1 s (it
    # returned after 3 s, ignoring the timeout), and the work still completes later.
    t = torch.ones(2)
    if r == 1:
        time.sleep(3)
    w = dist.all_reduce(t, async_op=True)
    if r == 0:
        t0 = time.monotonic()
        try:
            w.wait(timeout=datetime.timedelta(seconds=1))
            raise AssertionError("wait(timeout=1s) returned while rank 1 was away")
        except RuntimeError as e:
            assert "timed out" in str(e), e
        assert time.monotonic() - t0 < 2.5, time.monotonic() - t0
    w.wait()
    assert t.tolist() == [float(n)] * 2, t
    dist.barrier()
elif mode == "layouts":
    # all_gather into non-contiguous outputs, and from an input that is a view of another
    # rank's output slot (both refused before; gloo takes them).
    base = torch.zeros(3, 2 * n)
    outs = [base[:, 2 * j:2 * j + 2] for j in range(n)]  # column blocks: strided
    dist.all_gather(outs, torch.full((3, 2), float(r + 1)))
    for j in range(n):
        assert torch.equal(outs[j], torch.full((3, 2), float(j + 1))), (j, outs[j])
    flat = torch.zeros(3 * n)
    slots = list(flat.split(3))
    other = (r + 1) % n
    slots[other].fill_(float(r + 1))
    dist.all_gather(slots, slots[other])
    assert flat.tolist() == [float(j + 1) for j in range(n) for _ in range(3)], flat
    # A mismatch is told in the caller's elements and type (it was told in bytes).
    t = torch.arange(4.0 + 2 * r)
    try:
        dist.broadcast(t, 0)
        raise AssertionError("broadcast of different sizes passed")
    except RuntimeError as e:
        assert "broadcast(count=4, dtype=float32" in str(e) and "count=6" in str(e), e
print(f"[{r}] OK", flush=True)
