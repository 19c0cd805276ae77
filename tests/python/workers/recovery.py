"""Data-parallel training of a tiny numpy MLP under strata.recovery_run (started by
test_recovery.py through `strata run --ft`).

    recovery.py STEPS [FAIL_RANK FAIL_STEP]

Every rank trains a replica on synthetic data that depends only on (data cursor, RNG state,
rank), all of it registered in a strata.State, so a run in which FAIL_RANK SIGKILLs itself
at FAIL_STEP must end with the same bytes as a run without failure. Lines for the test:
    IMPORTED pid=P                         (before strata.init(): a hot spare prints it as [spareN])
    START rank=R pid=P replacement=0|1 env_rank=STRATA_RANK
    RECOVERED rank=R epoch=E failed=F replacement=0|1 step=S bytes=B
    TICKS rank=R ticks=N waited_ms=T       (survivors: a Python thread ran during the recovery)
    DONE rank=R pid=P steps=S recoveries=K epoch=E
    HASH <sha256 of the state>             (rank 0)
    OK ...
"""

import os

# One BLAS thread: the same float32 results in every process whatever the machine's load,
# and no oversubscription of the test machine.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import hashlib  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import strata  # noqa: E402
from common import join  # noqa: E402

D, H, C, B = 8, 32, 4, 16  # inputs, hidden units, outputs, samples per rank and step
LR, MOMENTUM = 0.05, 0.9

steps = int(sys.argv[1])
fail_rank, fail_step = (int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) > 3 else (-1, -1)

print(f"IMPORTED pid={os.getpid()}", flush=True)
# RECOVERY_SPARE_READY (a file): a hot spare creates it once imported, and the failing rank
# waits for it, so that the failure finds the spare waiting, however slow the machine.
spare_ready = os.environ.get("RECOVERY_SPARE_READY")
if spare_ready and "STRATA_SPARE" in os.environ:
    open(spare_ready, "w").close()
comm = join()
rank, size = comm.rank, comm.size
replacement = strata.is_replacement()
print(f"START rank={rank} pid={os.getpid()} replacement={int(replacement)} "
      f"env_rank={os.environ.get('STRATA_RANK', '-')}", flush=True)

sizes = [H * D, H, C * H, C]
n_params = sum(sizes)
params = comm.zeros(n_params, np.float32)  # heap: restored with no copy
grads = comm.empty(n_params, np.float32)  # not state: recomputed by every (re)done step
momentum = np.zeros(n_params, np.float32)  # an ordinary array: the external-buffer path
cursor = np.zeros(1, np.uint64)
rng_state = np.array([12345], np.uint64)


def views(flat):
    out, at = [], 0
    for k in sizes:
        out.append(flat[at:at + k])
        at += k
    w1, b1, w2, b2 = out
    return w1.reshape(H, D), b1, w2.reshape(C, H), b2


params[:] = np.random.default_rng(7).standard_normal(n_params).astype(np.float32) * 0.1
if replacement:
    # A replacement that trained on without receiving the survivors' state must not be able
    # to end with the right bytes.
    params[:] = np.nan
    momentum[:] = np.nan
    cursor[:] = 0
    rng_state[:] = 0
teacher = np.random.default_rng(11).standard_normal((D, C)).astype(np.float32)

state = strata.State(comm)
state.add("params", params)
state.add("momentum", momentum)
state.add("cursor", cursor)
state.add("rng", rng_state)
assert state.nbytes == 8 + 2 * 4 * n_params + 16, state.nbytes
assert state.names == ["step", "params", "momentum", "cursor", "rng"], state.names


def compute(step):
    seed = [int(rng_state[0]), int(cursor[0]), rank]
    x = np.random.default_rng(seed).standard_normal((B, D)).astype(np.float32)
    target = np.sin(x @ teacher)
    w1, b1, w2, b2 = views(params)
    gw1, gb1, gw2, gb2 = views(grads)
    pre = x @ w1.T + b1
    h = np.maximum(pre, 0)
    dy = 2 * (h @ w2.T + b2 - target)
    gw2[:] = dy.T @ h
    gb2[:] = dy.sum(0)
    dh = (dy @ w2) * (pre > 0)
    gw1[:] = dh.T @ x
    gb1[:] = dh.sum(0)
    if rank == fail_rank and step == fail_step and not replacement:
        deadline = time.monotonic() + 30
        while spare_ready and not os.path.exists(spare_ready) and time.monotonic() < deadline:
            time.sleep(0.01)
        if spare_ready:
            time.sleep(0.1)  # the launcher prints the spare's IMPORTED line before this rank's INJECT
        print(f"INJECT rank={rank} step={step}", flush=True)
        strata.mark_failure(comm)
        os.kill(os.getpid(), signal.SIGKILL)
    comm.all_reduce(grads)


def apply(step):
    # In place: the State holds these very arrays.
    momentum[:] = np.float32(MOMENTUM) * momentum + grads * np.float32(1.0 / (size * B))
    params[:] -= np.float32(LR) * momentum
    cursor[0] += size * B
    rng_state[0] = (int(rng_state[0]) * 6364136223846793005 + 1442695040888963407) % (1 << 64)


recoveries = []
ticker = {}


def tick(stop, count):
    while not stop.is_set():
        count[0] += 1
        time.sleep(0.001)


def on_failure():
    # A Python thread must keep running while recover() and restore() wait for the replacement.
    ticker["stop"], ticker["count"], ticker["t0"] = threading.Event(), [0], time.monotonic()
    ticker["thread"] = threading.Thread(target=tick, args=(ticker["stop"], ticker["count"]))
    ticker["thread"].start()


def on_recovered(report):
    recoveries.append(report)
    if ticker:
        ticker["stop"].set()
        ticker["thread"].join()
        waited = time.monotonic() - ticker["t0"]
        # The replacement needs a Python start-up at least, so the wait is long enough to tell.
        assert waited < 0.2 or ticker["count"][0] >= 10, \
            f"rank {rank}: the ticker ran {ticker['count'][0]} times in {waited:.2f} s of recovery"
        print(f"TICKS rank={rank} ticks={ticker['count'][0]} waited_ms={waited * 1000:.0f}", flush=True)
    print(f"RECOVERED rank={rank} epoch={report.epoch} failed={','.join(map(str, report.failed))} "
          f"replacement={int(report.replacement)} step={state.step} bytes={report.restored_bytes}", flush=True)


strata.recovery_run(comm, state, steps, compute, apply, on_failure=on_failure, on_recovered=on_recovered)

digest = hashlib.sha256()
for a in (params, momentum, cursor, rng_state):
    digest.update(a.tobytes())
mine = np.frombuffer(digest.digest()[:8], np.uint64).copy()
every = comm.all_gather(mine)
assert np.all(every == mine), f"rank {rank}: replicas diverged: {every}"
assert state.step == steps and not np.isnan(params).any()
if recoveries:
    assert comm.epoch == recoveries[-1].epoch >= 1, (comm.epoch, recoveries[-1])
    assert recoveries[-1].failed == [fail_rank], recoveries[-1]
    assert recoveries[-1].replacement == replacement
    # The replacement received everything, step included; a survivor sent or received nothing
    # unless it was the donor.
    if replacement:
        assert recoveries[-1].restored_bytes == state.nbytes, (recoveries[-1], state.nbytes)
print(f"DONE rank={rank} pid={os.getpid()} steps={state.step} recoveries={len(recoveries)} epoch={comm.epoch}",
      flush=True)
if rank == 0:
    print(f"HASH {digest.hexdigest()}", flush=True)
print("OK", flush=True)
