#!/usr/bin/env bash
# Open MPI's mpirun: OMPI_COMM_WORLD_* give the placement; the ranks meet at a `strata store`.
set -euo pipefail
source "$(dirname "$0")/common.sh"

MPIRUN=
for c in mpirun.openmpi mpirun; do
  # Read whole, then matched: see mpich_test.sh (grep -q in a pipe under pipefail).
  if command -v "$c" >/dev/null && grep -q "Open MPI" <<<"$("$c" --version 2>&1 || true)"; then
    MPIRUN=$(command -v "$c")
    break
  fi
done
[[ -n $MPIRUN ]] || skip "Open MPI's mpirun is not installed (Debian: apt-get install openmpi-bin)"

start_store
args=(-n 4 --oversubscribe -x STRATA_STORE -x STRATA_JOB_TOKEN)
[[ $(id -u) -eq 0 ]] && args+=(--allow-run-as-root)
run_case mpirun 4 "$MPIRUN" "${args[@]}" "$PROBE" 4
# A second job on the same store: the launcher gives no job id that the ranks could tell apart
# from the first one's but its own (PMIX_NAMESPACE).
run_case mpirun-again 4 "$MPIRUN" "${args[@]}" "$PROBE" 4
