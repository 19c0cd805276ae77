#!/usr/bin/env bash
# MPICH's mpiexec (Hydra): its ranks find rank and size in PMI_RANK/PMI_SIZE (local rank in
# MPI_LOCALRANKID) and meet at a `strata store`.
set -euo pipefail
source "$(dirname "$0")/common.sh"

MPIEXEC=$(command -v mpiexec.mpich || command -v mpiexec.hydra || true)
[[ -n $MPIEXEC ]] || skip "MPICH's mpiexec (mpiexec.mpich / mpiexec.hydra) is not installed (Debian: apt-get install mpich)"
# The output is read whole first: `cmd | grep -q` under pipefail fails when grep, done early,
# leaves the command writing into a closed pipe (SIGPIPE), which skipped this test at random.
grep -qi hydra <<<"$("$MPIEXEC" --version 2>&1 || true)" || skip "$MPIEXEC is not Hydra"

start_store
# Hydra passes the whole environment on by default (-genvall).
run_case mpiexec 4 "$MPIEXEC" -n 4 "$PROBE" 4
# A second job on the same store: the launcher gives no job id that the ranks could tell apart
# from the first one's, so init() takes a new generation of the one it derives from the
# store (it read the first job's records before).
run_case mpiexec-again 4 "$MPIEXEC" -n 4 "$PROBE" 4
