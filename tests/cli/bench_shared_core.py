#!/usr/bin/env python3
"""Issue 19: two ranks that believe they have cores of their own (STRATA_OVERSUBSCRIBED=0) but
share one (pinned to a single CPU, as when a neighbour holds the other cores). The waiter's spin
then only delays the peer it waits for: a fixed spin made every wait last exactly STRATA_SPIN_US
(500 us here: 505 us per 8-byte all_reduce, 1,013 us at 4 KiB). The waits now shorten a spin that
keeps running out, so a call takes a few microseconds; the bound below is half of one spin, far
above what the fixed code can reach and far below what it must pay. Another process that lands
on the same CPU (a test running beside this one, a compiler) can still stretch one sweep past the
bound, so up to ATTEMPTS sweeps are taken and the fastest counts: the fixed spin pays its 500 us
in every one of them.
usage: bench_shared_core.py STRATA_BINARY
"""
import os
import subprocess
import sys

SPIN_US = 500
BOUND_US = SPIN_US / 2
ATTEMPTS = 3


def sweep(strata, cpu):
    """One 8-byte sweep pinned to `cpu`: (time_us, None) or (None, why it failed)."""
    env = dict(os.environ, STRATA_OVERSUBSCRIBED="0", STRATA_SPIN_US=str(SPIN_US))
    cmd = [strata, "bench", "all_reduce", "-n", "2", "-b", "8", "-e", "8", "--repeats", "5", "--target-ms", "20", "-q"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env,
                         preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    if out.returncode != 0:
        return None, f"exit {out.returncode}: {out.stderr[-2000:]}"
    rows = [l.split() for l in out.stdout.splitlines() if l.strip() and not l.startswith("#")]
    if len(rows) != 1 or rows[0][0] != "8" or rows[0][-1] != "ok":
        return None, f"expected one checked 8-byte row in:\n{out.stdout}"
    return float(rows[0][6]), None


def main():
    strata = sys.argv[1]
    cpu = min(os.sched_getaffinity(0))
    times = []
    for _ in range(ATTEMPTS):
        time_us, why = sweep(strata, cpu)
        if why:
            print(f"FAIL: {why}")
            return 1
        times.append(time_us)
        if time_us < BOUND_US:
            print(f"ok: 8-byte all_reduce, both ranks on CPU {cpu}, {time_us} us per call (< {BOUND_US}; "
                  f"sweeps: {times})")
            return 0
    print(f"FAIL: 8-byte all_reduce with both ranks on CPU {cpu} took {times} us per call in {ATTEMPTS} sweeps "
          f"(>= {BOUND_US} us: the waits spin out their {SPIN_US} us while the peer needs the core)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
