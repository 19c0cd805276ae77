# Sourced by the launcher tests: skipping, a rendezvous store, the check of the probe's output.
# Expects STRATA_BIN (the strata binary) and PROBE (launcher_probe) in the environment.

SKIP_CODE=77  # the tests' SKIP_RETURN_CODE in CMakeLists.txt

skip() {
  echo "SKIP: $*"
  exit $SKIP_CODE
}

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

WORK=$(mktemp -d /tmp/strata-launcher.XXXXXX)
STORE_PID=
cleanup_common() {
  [[ -n $STORE_PID ]] && kill "$STORE_PID" 2>/dev/null && wait "$STORE_PID" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup_common EXIT

# A launcher that is not strata run starts no store: the ranks meet at a `strata store`,
# found through STRATA_STORE, and prove the token in STRATA_JOB_TOKEN.
start_store() {
  "$STRATA_BIN" store --port 0 >"$WORK/store.out" 2>"$WORK/store.err" &
  STORE_PID=$!
  local i
  for i in $(seq 100); do
    grep -q '^STRATA_JOB_TOKEN=' "$WORK/store.out" 2>/dev/null && break
    sleep 0.1
  done
  STRATA_STORE=$(sed -n 's/^STRATA_STORE=//p' "$WORK/store.out")
  STRATA_JOB_TOKEN=$(sed -n 's/^STRATA_JOB_TOKEN=//p' "$WORK/store.out")
  [[ -n $STRATA_STORE && -n $STRATA_JOB_TOKEN ]] || fail "strata store did not start: $(cat "$WORK/store.err")"
  export STRATA_STORE STRATA_JOB_TOKEN
}

# check_probe LOG N: every one of the N ranks printed its OK line, once.
check_probe() {
  local log=$1 n=$2 r
  for ((r = 0; r < n; r++)); do
    [[ $(grep -c "launcher_probe: rank $r of $n (local [0-9]*) OK" "$log") -eq 1 ]] ||
      fail "rank $r of $n did not report OK; output:
$(cat "$log")"
  done
}

# run_case NAME N COMMAND...: runs COMMAND (60 s at most), shows its output, checks N ranks.
run_case() {
  local name=$1 n=$2
  shift 2
  echo "--- $name: $*"
  local rc=0
  timeout -k 5 60 "$@" >"$WORK/$name.log" 2>&1 || rc=$?
  sed 's/^/    /' "$WORK/$name.log"
  [[ $rc -eq 0 ]] || fail "$name exited with $rc"
  check_probe "$WORK/$name.log" "$n"
  echo "--- $name: OK"
}
