"""Failure scenarios, one per mode (argv[1]); started by test_faults.py with explicit init args.

kill:  the last rank SIGKILLs itself in the middle of an async all_reduce; every other rank
       must get strata.PeerFailed well before its timeout, then fail fast on the next call.
stop:  the last rank SIGSTOPs itself; the others must get strata.Timeout within about twice
       the per-call timeout.
gil:   rank 0 blocks in a barrier that rank 1 joins late; a Python thread of rank 0 must keep
       running meanwhile (the call released the GIL).
"""

import os
import signal
import sys
import threading
import time

import numpy as np

import strata
from common import join

mode = sys.argv[1]
comm = join()
r, n = comm.rank, comm.size
last = n - 1
buf = comm.empty((1 << 20,), np.float32)  # 4 MiB: two-shot, long enough to be caught mid-way
buf[:] = 1

if mode == "kill":
    for _ in range(3):
        comm.all_reduce(buf)
    comm.barrier()
    if r == last:
        comm.all_reduce(buf, async_op=True)  # in flight on the copy engine...
        os.kill(os.getpid(), signal.SIGKILL)  # ...when the process dies
    t0 = time.monotonic()
    try:
        for _ in range(1000):
            comm.all_reduce(buf)
        print(f"FAIL rank {r}: no error after the peer died", flush=True)
        sys.exit(1)
    except strata.PeerFailed as e:
        elapsed = time.monotonic() - t0
        assert e.code == strata.Code.PeerFailed and isinstance(e, strata.Error), e
        assert elapsed < comm.timeout / 2, f"PeerFailed after {elapsed:.2f} s (timeout {comm.timeout} s)"
        # Revoked: the next call fails fast with the same code.
        t1 = time.monotonic()
        try:
            comm.barrier()
        except strata.PeerFailed:
            pass
        assert time.monotonic() - t1 < 1.0
        print(f"OK PeerFailed after {elapsed:.3f} s: {e}", flush=True)

elif mode == "stop":
    comm.barrier()
    if r == last:
        os.kill(os.getpid(), signal.SIGSTOP)  # the test kills us afterwards
        time.sleep(60)
        sys.exit(0)
    t0 = time.monotonic()
    try:
        for _ in range(1000):
            comm.all_reduce(buf, timeout=1.5)
        print(f"FAIL rank {r}: no error while the peer was stopped", flush=True)
        sys.exit(1)
    except strata.Timeout as e:
        elapsed = time.monotonic() - t0
        assert isinstance(e, TimeoutError) and e.code == strata.Code.Timeout
        assert elapsed < 2 * 1.5 + 1.0, f"Timeout after {elapsed:.2f} s for a 1.5 s timeout"
        print(f"OK Timeout after {elapsed:.3f} s: {e}", flush=True)

elif mode == "gil":
    ticks = 0
    stop = threading.Event()

    def spin():
        global ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.001)

    if r == 0:
        t = threading.Thread(target=spin)
        t.start()
        comm.barrier()  # rank 1 joins 1 s late
        stop.set()
        t.join()
        assert ticks > 100, f"the Python thread ran only {ticks} times while rank 0 waited"
        w = comm.all_reduce(buf, async_op=True)
        w.wait()
        print(f"OK {ticks} ticks during the barrier", flush=True)
    else:
        time.sleep(1.0)
        comm.barrier()
        comm.all_reduce(buf)
        print("OK", flush=True)
