#!/usr/bin/env bash
# No launcher: the placement set by hand (STRATA_RANK, STRATA_WORLD_SIZE), the ranks meet at a
# `strata store` and no STRATA_JOB_ID is given. Jobs one after the other on that store, of one
# size and of another: each init() takes its own generation of the id derived from the store
# (the second job read the first one's records before), whichever rank comes first.
set -euo pipefail
source "$(dirname "$0")/common.sh"

start_store
# by_hand NAME N LATE: ranks 0..N-1; rank LATE starts half a second after the others (-1: none).
by_hand() {
  local name=$1 n=$2 late=$3 r
  echo "--- $name ($n ranks, rank $late late)"
  local -a pids=()
  for ((r = 0; r < n; r++)); do
    local d=0
    [[ $r -eq $late ]] && d=0.5
    (sleep "$d" && STRATA_RANK=$r STRATA_WORLD_SIZE=$n timeout -k 5 60 "$PROBE" "$n") >"$WORK/$name.$r" 2>&1 &
    pids+=($!)
  done
  local bad=0
  for ((r = 0; r < n; r++)); do wait "${pids[$r]}" || bad=1; done
  cat "$WORK/$name".* >"$WORK/$name.log"
  sed 's/^/    /' "$WORK/$name.log"
  [[ $bad -eq 0 ]] || fail "$name: a rank failed"
  check_probe "$WORK/$name.log" "$n"
  echo "--- $name: OK"
}
by_hand first 2 -1
by_hand rank0-late 2 0
by_hand rank1-late 2 1
# A larger job next: ranks 2 and 3 never joined a generation, and the newest open one is the
# 2-rank job's; they must wait for this job's rank 0.
by_hand larger-rank0-late 4 0
by_hand smaller-rank0-late 3 0
