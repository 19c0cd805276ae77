"""strata.moe from Python: dispatch views, combine against a numpy reference, every schedule,
numpy float32 and torch bfloat16, and argument errors.

Invariants: every (t, k) with an expert lands once in its expert's rows (in (source, token)
order for the compact layouts), combine equals sum_k w * expert(x) computed here, schedules agree."""

import numpy as np

import strata
import strata.moe
from common import join

comm = join()
r, n = comm.rank, comm.size
E, H, M, K = 4 * n, 16, 8, 2


def inputs(rank, T):
    g = np.random.default_rng(100 + rank)
    x = g.standard_normal((T, H)).astype(np.float32)
    idx = np.stack([g.permutation(E)[:K] for _ in range(T)]).astype(np.int64)
    idx[::3, 1] = -1
    w = g.uniform(0.1, 1.0, (T, K)).astype(np.float32)
    return x, idx, w


def scale(e):
    return np.float32(1.0 + 0.25 * e)


T = M
xs = [inputs(s, T) for s in range(n)]
x, idx, w = xs[r]
want = np.zeros((T, H), np.float32)
for t in range(T):
    for k in range(K):
        if idx[t, k] >= 0:
            want[t] += w[t, k] * (x[t] * scale(idx[t, k]))

buf = strata.moe.Buffer(comm, num_experts=E, hidden=H, max_tokens=M, topk=K, dtype="float32")
outs = []
for sched in strata.moe.SCHEDULES:
    d = buf.dispatch(x, idx, w, sched)
    assert d.schedule == sched and d.masked == (sched == "decode")
    L = d.local_experts
    for l in range(L):
        e = r * L + l
        for s in range(n):
            rows = [t for t in range(T) if e in xs[s][1][t]]
            assert d.count(l, s) == len(rows), (sched, l, s, d.count(l, s), len(rows))
            got = d.window[d.offset(l, s):d.offset(l, s) + len(rows)]
            assert np.array_equal(got, xs[s][0][rows]), (sched, "rows of expert", e, "from", s)
        if d.masked:
            d.expert_x(l)[:] *= scale(e)  # the whole [R, M, H] block; only counted rows matter
        else:
            assert d.expert_x(l).shape == (d.count(l), H)
            d.expert_x(l)[:] *= scale(e)
    out = buf.combine(d)
    assert np.allclose(out, want, rtol=1e-5, atol=1e-5), (sched, np.abs(out - want).max())
    outs.append(out)
assert all(np.array_equal(outs[0], o) for o in outs[1:]), "schedules disagree"

for bad, what in (((np.ascontiguousarray(x[:, :5]), idx, w), "expected [T, hidden"),
                  # Rows of half the hidden size: as many elements as T / 2 tokens would have.
                  ((x.reshape(-1, H // 2), idx, w), "expected [T, hidden"),
                  ((np.ascontiguousarray(x[:, :5]).reshape(-1), idx, w), "not a multiple of hidden"),
                  ((x, np.ascontiguousarray(idx[:, :1]), w), "topk_idx has"),
                  ((x.astype(np.float64), idx, w), "dtype")):
    try:
        buf.dispatch(*bad, "prefill")
    except strata.InvalidArgument as e:
        assert what in str(e), str(e)
    else:
        raise AssertionError("no error for " + what)

# A shape the binding refuses on the last rank only: the other ranks' matching calls fail naming
# it (not by the timeout), and the Buffer stays usable.
import time  # noqa: E402

t0 = time.monotonic()
for sched in ("prefill", "decode", "relay"):
    try:
        buf.dispatch(x[:, :H - 1].copy() if r == n - 1 else x, idx, w, sched)
    except strata.InvalidArgument as e:
        want = "expected [T, hidden" if r == n - 1 else f"rank {n - 1} refused its call"
        assert want in str(e), str(e)
        # The binding's own check names the rank too, in the message and in Error.rank.
        assert e.rank == r, (e.rank, r, str(e))
    else:
        raise AssertionError(f"rank {r}: no error for a {sched} dispatch refused by rank {n - 1}")
    d = buf.dispatch(x, idx, w, sched)
    # A combine whose out the binding refuses on the last rank: the same, for combine.
    try:
        buf.combine(d, out=np.empty((T, H - 1), np.float32) if r == n - 1 else None)
    except strata.InvalidArgument as e:
        want = "moe.combine on rank" if r == n - 1 else f"rank {n - 1} refused its call"
        assert want in str(e), str(e)
    else:
        raise AssertionError(f"rank {r}: no error for a {sched} combine refused by rank {n - 1}")
    d = buf.dispatch(x, idx, w, sched)
    assert np.allclose(buf.combine(d), x * np.where(idx >= 0, w, 0).sum(1)[:, None], rtol=1e-5, atol=1e-5)
assert time.monotonic() - t0 < 30, "told by the refused call, not by the timeout"

# A schedule name or an argument type the last rank cannot read: refused there, the others told.
t0 = time.monotonic()
try:
    buf.dispatch(x, idx, w, "fast" if r == n - 1 else "prefill")
except strata.InvalidArgument as e:
    want = "schedule must be 'prefill', 'decode' or 'relay'" if r == n - 1 else f"rank {n - 1} refused its call"
    assert want in str(e) and e.rank == r, (e.rank, str(e))
else:
    raise AssertionError(f"rank {r}: no error for a dispatch with a bad schedule on rank {n - 1}")
d = buf.dispatch(x, idx, w, "prefill")
try:
    buf.combine("not a dispatch" if r == n - 1 else d)
except strata.InvalidArgument as e:
    want = "d must be the MoeDispatch" if r == n - 1 else f"rank {n - 1} refused its call"
    assert want in str(e), str(e)
else:
    raise AssertionError(f"rank {r}: no error for a combine of a non-dispatch on rank {n - 1}")
# Buffers whose configs differ, or whose arguments one rank cannot read, are refused everywhere.
for kw, want, differ in (({"max_tokens": M + 1}, f"max_tokens is {M} on rank 0 but {M + 1} on rank {n - 1}", True),
                         ({"hidden": 2 ** 62}, "larger than memory can address", False),
                         ({"topk": "two"}, "topk must be an integer", False)):
    args = dict(num_experts=E, hidden=H, max_tokens=M, topk=K, dtype="float32")
    if r == n - 1:
        args.update(kw)
    try:
        strata.moe.Buffer(comm, **args)
    except strata.InvalidArgument as e:
        if r == n - 1 or differ:
            assert want in str(e), (kw, str(e))
        else:
            assert f"rank {n - 1}'s config is invalid" in str(e), (kw, str(e))
    else:
        raise AssertionError(f"rank {r}: no error for a Buffer with {kw} on rank {n - 1}")
assert time.monotonic() - t0 < 30, "told by the refused call, not by the timeout"
d = buf.dispatch(x, idx, w, "decode")
assert np.allclose(buf.combine(d), x * np.where(idx >= 0, w, 0).sum(1)[:, None], rtol=1e-5, atol=1e-5)

try:
    import torch
except ImportError:
    torch = None
if torch is not None:
    bb = strata.moe.Buffer(comm, num_experts=E, hidden=H, max_tokens=M, topk=K, dtype="bfloat16")
    xt = torch.from_numpy(x).to(torch.bfloat16)
    d = bb.dispatch(xt, torch.from_numpy(idx), torch.from_numpy(w), "decode")
    assert d.window.dtype == torch.bfloat16
    out = bb.combine(d)  # identity experts
    ref = (xt.float() * torch.from_numpy(np.where(idx >= 0, w, 0).sum(1))[:, None])
    assert torch.allclose(out.float(), ref, rtol=2e-2, atol=2e-2), (out.float() - ref).abs().max()
    bb.close()
buf.close()
# Masking on with every rank alive: nothing dropped, the same result.
mb = strata.moe.Buffer(comm, num_experts=E, hidden=H, max_tokens=M, topk=K, dtype="float32",
                       mask_failed_ranks=True, renormalize=True)
d = mb.dispatch(x, idx, w, "prefill")
assert list(d.dropped) == [0] * T and list(d.failed_ranks) == [], (d.dropped, d.failed_ranks)
out = mb.combine(d)
assert list(d.dropped) == [0] * T
# Within one host nothing goes to another host.
assert mb.traffic() == {"dispatch_bytes": 0, "combine_bytes": 0, "record_bytes": 0, "rows_sent": 0,
                        "remote_selections": 0, "calls": 0}, mb.traffic()
mb.close()
comm.barrier()
# A schedule the last rank cannot read where the others call decode: the refusal (run as
# prefill) is what they are told, not a schedule mismatch, and not at their timeout. Last: the
# schedules differed, so the communicator is out of step after it.
if n > 1:
    last = strata.moe.Buffer(comm, num_experts=E, hidden=H, max_tokens=M, topk=K, dtype="float32")
    t0 = time.monotonic()
    try:
        last.dispatch(x, idx, w, "fast" if r == n - 1 else "decode")
    except strata.InvalidArgument as e:
        want = "schedule must be 'prefill', 'decode' or 'relay'" if r == n - 1 else f"rank {n - 1} refused its call"
        assert want in str(e), str(e)
    else:
        raise AssertionError(f"rank {r}: no error for a dispatch with a bad schedule on rank {n - 1}")
    assert time.monotonic() - t0 < 10, "told by the refused call, not by the timeout"
print("OK", flush=True)
