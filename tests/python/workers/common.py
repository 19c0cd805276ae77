"""Helpers for worker scripts (run as ranks by the tests)."""

import os
import sys

import numpy as np

import strata


def join():
    """strata.init() from explicit arguments when the test spawned us, else from strata run's env."""
    env = os.environ
    if "STRATA_TEST_STORE" in env:
        return strata.init(rank=int(env["STRATA_TEST_RANK"]), size=int(env["STRATA_TEST_SIZE"]),
                           store=env["STRATA_TEST_STORE"], token=env["STRATA_TEST_TOKEN"],
                           job_id=env["STRATA_TEST_JOB"])
    return strata.init()


def data(rank, count, dtype, salt=0):
    """Rank `rank`'s input: small positive integers (exact in every dtype, products stay small)."""
    return (((np.arange(count) + 3 * rank + salt) % 5) + 1).astype(dtype)


class Checker:
    def __init__(self, rank):
        self.rank = rank
        self.count = 0

    def equal(self, name, got, want, rtol=0.0):
        """Asserts got == want elementwise (within rtol); names the rank, index and both values."""
        got = np.asarray(got)
        want = np.asarray(want)
        self.count += 1
        if got.shape != want.shape:
            raise AssertionError(f"rank {self.rank}: {name}: shape {got.shape} != expected {want.shape}")
        g = got.astype(np.float64) if got.dtype.kind == "f" else got
        w = want.astype(np.float64) if want.dtype.kind == "f" else want
        bad = ~np.isclose(g, w, rtol=rtol, atol=0) if rtol else (g != w)
        if np.any(bad):
            i = np.unravel_index(int(np.argmax(bad)), bad.shape)
            raise AssertionError(f"rank {self.rank}: {name}: at index {i} got {got[i]!r}, expected {want[i]!r} "
                                 f"({int(bad.sum())} of {bad.size} elements differ)")

    def raises(self, name, cls, fn):
        self.count += 1
        try:
            fn()
        except cls as e:
            return e
        except Exception as e:  # the wrong class
            raise AssertionError(f"rank {self.rank}: {name}: raised {type(e).__name__} ({e}), "
                                 f"expected {cls.__name__}") from e
        raise AssertionError(f"rank {self.rank}: {name}: did not raise {cls.__name__}")

    def ok(self):
        print(f"OK {self.count} checks", flush=True)


def log(*a):
    print(*a, file=sys.stderr, flush=True)
