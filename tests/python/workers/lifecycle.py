"""Calls that must leave the ranks in step, and a communicator's life across threads, forks
and signals; one mode per run (argv[1]), started by test_lifecycle.py with explicit init args.

in_step:  rank 1 makes argument errors that are found after a count exchange (all_to_all_v
          without recv_counts) or by the binding before the call (split with a str color or
          an int past 2**31); every rank must fail that call, and later all_reduces pair up.
destroy:  rank 0's thread destroys the communicator while its main thread waits in an
          all_reduce for a late rank 1: the wait raises strata.Aborted (no crash).
fork:     rank 0 forks; the child's calls on the inherited communicator (and a wait for its
          parent's work) raise InvalidArgument, the child exits through sys.exit (its
          destructors run), and the parent goes on with its peers.
send_timeout: rank 0's async send is never received: Work.wait() raises Timeout at the send's
          deadline (it polls the send, which must still time out), not never.
sigint:   rank 0 gets SIGINT while it waits in an all_reduce and in Work.wait() for a rank
          that never comes: KeyboardInterrupt within a second each, not at the timeout.
"""

import gc
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


def expect_sums(c, rounds, tag):
    for i in range(1, rounds + 1):
        a = np.array([100.0 * i + r])
        c.all_reduce(a)
        want = sum(100.0 * i + k for k in range(n))
        assert a[0] == want, f"rank {r}: {tag}: all_reduce #{i} gave {a[0]}, want {want}"


if mode == "in_step":
    f = np.float32
    bad_out = np.empty(1 if r == 1 else 2 * n, f)  # too small on rank 1, found after the exchange
    try:
        comm.all_to_all_v(np.ones(2 * n, f), [2] * n, out=bad_out)
        raise AssertionError(f"rank {r}: all_to_all_v with a short out did not fail")
    except strata.InvalidArgument as e:
        assert ("out has 1 elements" in str(e)) if r == 1 else ("rank 1 refused" in str(e)), e
    expect_sums(comm, 3, "after all_to_all_v")
    for color in ("0", 2**31):
        try:
            comm.split(color if r == 1 else 0)
            raise AssertionError(f"rank {r}: split with color {color!r} on rank 1 did not fail")
        except strata.InvalidArgument as e:
            assert ("split on rank 1: color" in str(e)) if r == 1 else ("rank 1 refused" in str(e)), e
        expect_sums(comm, 2, f"after split({color!r})")
    print("OK in step", flush=True)

elif mode == "destroy":
    if r == 0:
        def destroy_soon():
            time.sleep(0.5)
            comm.destroy()

        t = threading.Thread(target=destroy_soon)
        t.start()
        t0 = time.monotonic()
        try:
            comm.all_reduce(np.ones(4))
            raise AssertionError("all_reduce returned although its communicator was destroyed")
        except strata.Aborted as e:
            waited = time.monotonic() - t0
            assert waited < 5, f"Aborted after {waited:.1f} s"
        t.join()
        assert not comm.valid
        try:
            comm.all_reduce(np.ones(4))
            raise AssertionError("a call after destroy() did not fail")
        except strata.InvalidArgument as e:
            assert "destroyed" in str(e), e
    else:
        time.sleep(2)
    print("OK destroy", flush=True)

elif mode == "fork":
    a = comm.zeros((1024,), "float32")
    a[:] = 1
    w = comm.all_reduce(a, async_op=True) if r == 0 else None
    if r == 0:
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                comm.all_reduce(np.ones(4))
                print("child: all_reduce on the parent's communicator did not fail", flush=True)
                code = 3
            except strata.InvalidArgument as e:
                if "forked" not in str(e):
                    code = 4
            try:
                # The parent's work, unfinished unless rank 1 was very late to start it
                unfinished = not w.completed()
                w.wait()
                if unfinished:
                    print("child: waiting for the parent's unfinished work did not fail", flush=True)
                    code = 5
            except strata.InvalidArgument as e:
                if "forked" not in str(e):
                    code = 6
            sys.exit(code)  # destructors run here, in the child
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status:#x}"
        w.wait()
    else:
        time.sleep(2)  # after rank 0's child has tried its calls
        comm.all_reduce(a)
    assert a[0] == n, a[:4]
    expect_sums(comm, 5, "after the fork")
    sub = comm.split(0)
    sub.all_reduce(np.ones(3))
    print("OK fork", flush=True)

elif mode == "send_timeout":
    if r == 0:
        w = comm.send(np.ones(4), 1, async_op=True, timeout=2)
        t0 = time.monotonic()
        try:
            w.wait()
            raise AssertionError("wait() returned for a send nobody received")
        except strata.Timeout as e:
            waited = time.monotonic() - t0
            assert 1.5 < waited < 10, f"Timeout after {waited:.1f} s for a 2 s deadline"
            assert "withdrawn" in str(e), e
    else:
        time.sleep(4)
    print("OK send_timeout", flush=True)
    os._exit(0)

elif mode == "sigint":
    sub = comm.split(0)
    if r == 0:
        # Work.wait() first: its operation goes on (on `sub`); the blocking call then aborts
        # `comm`, as the interrupt stops it wherever it is.
        for how in ("async", "blocking"):
            threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
            t0 = time.monotonic()
            try:
                if how == "blocking":
                    comm.all_reduce(np.ones(4), timeout=60)
                else:
                    sub.barrier(async_op=True).wait()
                raise AssertionError(f"{how}: the call returned")
            except KeyboardInterrupt:
                waited = time.monotonic() - t0
                assert waited < 3, f"{how}: KeyboardInterrupt after {waited:.1f} s"
        print("OK sigint", flush=True)
        os._exit(0)  # rank 1 never calls; the aborted communicator holds nothing worth waiting for
    time.sleep(8)
    print("OK sigint", flush=True)
    os._exit(0)
