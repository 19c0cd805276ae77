"""Expert-parallel MoE dispatch/combine without relay buffers (strata::moe).

    import strata, strata.moe
    comm = strata.init()
    buf = strata.moe.Buffer(comm, num_experts=8, hidden=1024, max_tokens=256, topk=2, dtype="float32")
    d = buf.dispatch(x, topk_idx, topk_w, "prefill")   # or "decode", "relay"
    for l in range(d.local_experts):
        rows = d.expert_x(l)          # a view of the receive window: compute in place
        rows[:] = expert(l, rows)
    out = buf.combine(d)              # out[t] = sum_k w[t,k] * y[slot(t,k)]

Every rank calls Buffer(), dispatch() and combine() in the same order with the same schedule.
Buffer(..., mask_failed_ranks=True[, renormalize=True]): a dead peer's experts are masked
instead of failing the call; d.dropped counts each token's dropped selections.
On a communicator that spans hosts, buf.traffic() counts the bytes and rows this rank sent to
other hosts (each token once per destination host).
"""

from ._strata import MoeBuffer as Buffer, MoeDispatch as Dispatch

SCHEDULES = ("prefill", "decode", "relay")
__all__ = ["Buffer", "Dispatch", "SCHEDULES"]
