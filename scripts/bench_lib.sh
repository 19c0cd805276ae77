# Shared by the bench scripts (sourced, not run).

# Percent of the CPU time other processes used over 0.4 s (the caller runs nothing of its own
# meanwhile), for the load line each report prints.
others_busy() {
  local a b c d e f g h t1 i1 t2 i2
  read -r _ a b c d e f g h _ </proc/stat
  t1=$((a + b + c + d + e + f + g + h)) i1=$((d + e))
  sleep 0.4
  read -r _ a b c d e f g h _ </proc/stat
  t2=$((a + b + c + d + e + f + g + h)) i2=$((d + e))
  echo $((100 * ((t2 - t1) - (i2 - i1)) / (t2 - t1 > 0 ? t2 - t1 : 1)))
}

# run NAME CMD...: one measurement, its output in $BENCH_OUT/NAME.log, the load before it in
# load.tsv. A failure is counted in `failures`, not fatal: the report uses the other rounds.
# A program (not a shell function) that runs past MEASURE_TIMEOUT seconds (default 300; a
# whole sweep of one system takes well under a minute) is stopped, SIGTERM then SIGKILL 10 s
# later, and counted failed: a hung peer (an Open MPI rank once spun for minutes in an 8-rank
# all_reduce) must not hold the run.
run() {
  local name=$1
  shift
  local t0=$SECONDS rc=0
  printf '%s\t%s\t%s\n' "$name" "$(cut -d' ' -f1 /proc/loadavg)" "$(others_busy)" >>"$BENCH_OUT/load.tsv"
  # stdin from /dev/null: under timeout the command is not in the terminal's foreground group,
  # and mpirun, which forwards stdin to rank 0, would be stopped reading it.
  if declare -F "$1" >/dev/null; then
    # A function of the calling script (timeout runs programs only) bounds its own waits.
    "$@" </dev/null >"$BENCH_OUT/$name.log" 2>&1 || rc=$?
  else
    timeout -k 10 "${MEASURE_TIMEOUT:-300}" "$@" </dev/null >"$BENCH_OUT/$name.log" 2>&1 || rc=$?
  fi
  if [[ $rc -eq 0 ]]; then
    say "$name ok ($((SECONDS - t0)) s)"
  elif [[ $rc -eq 124 || $rc -eq 137 ]]; then
    say "$name TIMED OUT after $((SECONDS - t0)) s (MEASURE_TIMEOUT=${MEASURE_TIMEOUT:-300}; stopped; see $BENCH_OUT/$name.log)"
    failures=$((failures + 1))
  else
    say "$name FAILED (exit $rc; see $BENCH_OUT/$name.log)"
    failures=$((failures + 1))
  fi
}
