#!/usr/bin/env python3
"""strata bench --neighbour: a tiny sweep runs beside the neighbour, which has one thread per
usable core while the sweep runs and is gone (killed and reaped) when the bench returns; a bad
kind is refused with a message naming the option. No timing is asserted.
usage: bench_neighbour.py STRATA_BINARY
"""
import os
import re
import subprocess
import sys


def main():
    strata = sys.argv[1]
    problems = []
    for kind in ("sleepy", "busy"):
        cmd = [strata, "bench", "all_reduce", "-n", "2", "-b", "8", "-e", "64", "--repeats", "1",
               "--target-ms", "1", "-w", "1", "-q", "--neighbour", kind]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            problems.append(f"{kind}: exit {out.returncode}: {out.stderr[-2000:]}")
            continue
        m = re.search(r"^# neighbour: " + kind + r", (\d+) threads?,.* \(pid (\d+)\)$", out.stdout, re.M)
        if not m:
            problems.append(f"{kind}: no '# neighbour: {kind}, N threads ... (pid P)' line in:\n{out.stdout}")
            continue
        threads, pid = int(m.group(1)), int(m.group(2))
        if threads != len(os.sched_getaffinity(0)):
            problems.append(f"{kind}: {threads} threads, expected one per usable core ({len(os.sched_getaffinity(0))})")
        if os.path.exists(f"/proc/{pid}"):
            problems.append(f"{kind}: the neighbour (pid {pid}) is still there after the bench returned")
        rows = [l for l in out.stdout.splitlines() if l.strip() and not l.startswith("#")]
        if not any(l.split()[0] == "64" and l.split()[-1] == "ok" for l in rows):
            problems.append(f"{kind}: no checked 64-byte row in:\n{out.stdout}")
    bad = subprocess.run([strata, "bench", "all_reduce", "-n", "2", "--neighbour", "noisy"],
                         capture_output=True, text=True, timeout=30)
    if bad.returncode == 0 or "--neighbour" not in bad.stderr:
        problems.append(f"--neighbour noisy: exit {bad.returncode}, stderr {bad.stderr!r}")
    for p in problems:
        print(p)
    print("FAIL" if problems else "ok: sleepy and busy neighbours started, sized and reaped")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
