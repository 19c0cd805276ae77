#!/usr/bin/env python3
"""Examples.moe_serve: examples/moe_serve, tiny, at 2 ranks through `strata run`. Every path
(strata: Prefill + Decode schedules; relay) must give the same checksum and match the
single-process reference (--check), and a wrong --expect must fail the run (the mismatch exit
works). With --mpi PEER (Examples.moe_serve_openmpi, registered where Open MPI was found), the
Open MPI peer under mpirun must give the same checksum too (bit-identical: the same fp32 sum
in the same order as the library's combine).

  moe_serve_test.py STRATA MOE_SERVE [--mpi MPI_MOE_SERVE]"""
import os
import re
import shutil
import subprocess
import sys

TINY = ["--layers", "2", "--hidden", "64", "--ffn", "32", "--experts", "4", "--topk", "2", "--prompt", "16",
        "--decode-steps", "3", "--decode-tokens", "2", "--requests", "2", "--warmup", "1", "--check"]
ROW = re.compile(r"^(?:\[\d+\] )?(strata|relay|openmpi)\s+(\d+)\s+\S+\s+\S+\s+\S+\s+\S+\s+([0-9a-f]{16})\s*$")


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    return p.returncode, p.stdout


def checksums(out):
    sums = {}
    for line in out.splitlines():
        m = ROW.match(line.strip())
        if m:
            sums[m.group(1)] = m.group(3)
    return sums


def fail(msg, out=""):
    sys.stderr.write("FAIL: %s\n%s\n" % (msg, out))
    sys.exit(1)


def main():
    args = sys.argv[1:]
    mpi = None
    if "--mpi" in args:
        i = args.index("--mpi")
        mpi = args[i + 1]
        del args[i:i + 2]
    strata, exe = args
    rc, out = run([strata, "run", "-n", "2", exe, "--path", "all"] + TINY)
    if rc != 0:
        fail("strata run of moe_serve exited %d" % rc, out)
    sums = checksums(out)
    if set(sums) != {"strata", "relay"}:
        fail("expected a row for strata and relay, got %s" % sorted(sums), out)
    if sums["strata"] != sums["relay"]:
        fail("strata %s != relay %s" % (sums["strata"], sums["relay"]), out)
    if "matches the single-process reference" not in out:
        fail("no reference check in the output", out)
    ref = sums["strata"]
    print("strata == relay == reference: %s" % ref)

    # One path alone gives the same bits (the paths do not lean on each other's state).
    rc, out = run([strata, "run", "-n", "2", exe, "--path", "relay", "--expect", ref] + TINY)
    if rc != 0 or checksums(out).get("relay") != ref:
        fail("--path relay alone: exit %d, checksum %s, want %s" % (rc, checksums(out).get("relay"), ref), out)
    # A wrong expectation must fail the job: the mismatch exit is what the figures rely on.
    wrong = "%016x" % (int(ref, 16) ^ 1)
    rc, out = run([strata, "run", "-n", "2", exe, "--path", "strata", "--expect", wrong] + TINY)
    if rc == 0 or "MISMATCH" not in out:
        fail("a wrong --expect did not fail the run (exit %d)" % rc, out)
    print("--path relay alone agrees; a wrong --expect fails the run")

    if mpi:
        mpirun = shutil.which("mpirun")
        if not mpirun or not os.access(mpi, os.X_OK):
            print("SKIP: no mpirun or no %s" % mpi)
            sys.exit(77)
        cmd = [mpirun, "--oversubscribe"] + (["--allow-run-as-root"] if os.getuid() == 0 else [])
        rc, out = run(cmd + ["-np", "2", mpi, "--expect", ref] + TINY)
        if rc != 0 or checksums(out).get("openmpi") != ref:
            fail("Open MPI peer: exit %d, checksum %s, want %s" % (rc, checksums(out).get("openmpi"), ref), out)
        print("openmpi == strata: %s" % ref)


if __name__ == "__main__":
    main()
