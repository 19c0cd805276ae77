#!/usr/bin/env bash
# No launcher: the placement set by hand (STRATA_RANK, STRATA_WORLD_SIZE), the ranks meet at a
# `strata store` and no STRATA_JOB_ID is given. Two jobs one after the other on that store: each
# init() takes its own generation of the id derived from the store (the second job read the
# first one's records before), whichever rank comes first.
set -euo pipefail
source "$(dirname "$0")/common.sh"

start_store
# by_hand NAME DELAY0 DELAY1: ranks 0 and 1, each started after its delay (seconds).
by_hand() {
  local name=$1 d0=$2 d1=$3
  echo "--- $name (rank 0 after ${d0}s, rank 1 after ${d1}s)"
  (sleep "$d0" && STRATA_RANK=0 STRATA_WORLD_SIZE=2 timeout -k 5 60 "$PROBE" 2) >"$WORK/$name.0" 2>&1 &
  local p0=$!
  (sleep "$d1" && STRATA_RANK=1 STRATA_WORLD_SIZE=2 timeout -k 5 60 "$PROBE" 2) >"$WORK/$name.1" 2>&1 &
  local p1=$! rc0=0 rc1=0
  wait $p0 || rc0=$?
  wait $p1 || rc1=$?
  cat "$WORK/$name.0" "$WORK/$name.1" >"$WORK/$name.log"
  sed 's/^/    /' "$WORK/$name.log"
  [[ $rc0 -eq 0 && $rc1 -eq 0 ]] || fail "$name: rank 0 exited with $rc0, rank 1 with $rc1"
  check_probe "$WORK/$name.log" 2
  echo "--- $name: OK"
}
by_hand first 0 0
by_hand second-rank0-late 0.5 0
by_hand third-rank1-late 0 0.5
