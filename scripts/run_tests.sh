#!/usr/bin/env bash
# Builds and tests Strata in one or more build trees and prints one closing line
# "N passed, N failed" that sums every ctest run. Exits non-zero if anything failed
# (a test, or a configure/build step, which counts as one failure).
#
#   scripts/run_tests.sh            # main tree, then ASan+UBSan and TSan trees
#   scripts/run_tests.sh main       # main tree only (make test-fast)
#   scripts/run_tests.sh asan tsan  # any subset, in the order given
#
# Settings (environment; the Makefile passes its variables through):
#   BUILD_DIR, ASAN_DIR, TSAN_DIR   build trees (build, build-asan, build-tsan)
#   JOBS                            parallel compile jobs (empty: ninja's default)
#   CTEST_JOBS                      tests run at once (2: many tests start several ranks)
#   CTEST_ARGS                      extra ctest arguments for every tree (e.g. "-R Reduce")
#   SANITIZER_CTEST_ARGS            extra ctest arguments for sanitizer trees ("-LE slow|multihost":
#                                   tests labelled `slow`, and the network-namespace tests, which
#                                   the main tree runs, are skipped there)
# The fuzz tests (label `fuzz`, tests/fuzz/) are defined in the main tree only: the fuzzers
# carry their own ASan/UBSan. Without clang++-14/libFuzzer the summary says why they were skipped.
#   CMAKE_ARGS                      extra configure arguments for every tree
set -euo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)

BUILD_DIR=${BUILD_DIR:-build}
ASAN_DIR=${ASAN_DIR:-build-asan}
TSAN_DIR=${TSAN_DIR:-build-tsan}
JOBS=${JOBS:-}
CTEST_JOBS=${CTEST_JOBS:-2}
CTEST_ARGS=${CTEST_ARGS:-}
SANITIZER_CTEST_ARGS=${SANITIZER_CTEST_ARGS--LE slow|multihost}
CMAKE_ARGS=${CMAKE_ARGS:-}

trees=("$@")
[[ ${#trees[@]} -eq 0 ]] && trees=(main asan tsan)

# Sanitizer trees: -O1 keeps them fast to build and run while keeping stack traces usable;
# Debug keeps assertions on. Benchmarks are not built there.
sanitizer_flags=(-DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g" -DSTRATA_BUILD_BENCH=OFF)

total_pass=0
total_fail=0
summary=()
digests=()

# Counts passed and failed tests in a ctest JUnit file: prints "PASS FAIL".
count_junit() {
  local file=$1
  if command -v python3 >/dev/null 2>&1; then
    python3 - "$file" <<'PY'
import sys
import xml.etree.ElementTree as ET
cases = ET.parse(sys.argv[1]).getroot().iter("testcase")
status = [c.get("status") for c in cases]
print(status.count("run"), status.count("fail"))
PY
  else
    echo "$(grep -c '<testcase .*status="run"' "$file" || true)" \
         "$(grep -c '<testcase .*status="fail"' "$file" || true)"
  fi
}

# Why each failed test in a ctest JUnit file failed, a few lines each (scripts/junit_failures.py),
# so that the end of a long CI log, which is often all that is kept, shows the cause.
failure_digest() {
  command -v python3 >/dev/null 2>&1 || return 0
  python3 "$root/scripts/junit_failures.py" "$1" "$2" || true
}

# run_tree NAME DIR [configure args...]
run_tree() {
  local name=$1 dir=$2
  shift 2
  local -a configure=("$@")
  echo "==> [$name] configure $dir"
  local -a generator=(-G Ninja)
  [[ -f $dir/CMakeCache.txt ]] && generator=()  # keep the generator the tree was made with
  # shellcheck disable=SC2086
  if ! cmake -S "$root" -B "$dir" "${generator[@]}" "${configure[@]}" $CMAKE_ARGS; then
    summary+=("$name: configure FAILED")
    total_fail=$((total_fail + 1))
    return
  fi
  echo "==> [$name] build $dir"
  if ! cmake --build "$dir" ${JOBS:+-j "$JOBS"}; then
    summary+=("$name: build FAILED")
    total_fail=$((total_fail + 1))
    return
  fi

  local -a extra=()
  # shellcheck disable=SC2206
  extra+=($CTEST_ARGS)
  local -a launcher=()
  if [[ $name != main ]]; then
    # shellcheck disable=SC2206
    extra+=($SANITIZER_CTEST_ARGS)
  fi
  if [[ $name == tsan ]]; then
    # UCX's libucm (loaded with libstrata in UCX builds) patches madvise/mmap for its
    # memory events; TSan's interceptors crash in those hooks when a thread exits. The
    # events only serve UCX's RDMA registration cache, unused over TCP: off under TSan.
    launcher=(env UCX_MEM_EVENTS=no)
    if setarch "$(uname -m)" -R true 2>/dev/null; then
      # TSan's shadow memory layout breaks with high mmap randomisation on recent kernels.
      launcher+=(setarch "$(uname -m)" -R)
    fi
  fi

  local junit="$root/$dir/ctest-junit.xml"
  rm -f "$junit"
  echo "==> [$name] ctest -j$CTEST_JOBS ${extra[*]}"
  local rc=0
  (cd "$dir" && "${launcher[@]}" ctest --output-on-failure -j "$CTEST_JOBS" --no-tests=error \
      --output-junit "$junit" "${extra[@]}") || rc=$?

  local pass=0 fail=0
  if [[ -s $junit ]] && read -r pass fail < <(count_junit "$junit"); then
    if [[ $rc -ne 0 && $fail -eq 0 ]]; then
      fail=1  # ctest itself failed (no tests found, crash) without a failed test case
    fi
  else
    pass=0
    fail=1
    echo "==> [$name] ctest left no JUnit report (rc=$rc)"
  fi
  if [[ $name == main && -f $dir/fuzz-skipped.txt ]]; then
    # The fuzz tests (label `fuzz`) run in this tree only; say why they did not.
    echo "==> [$name] fuzz tests skipped: $(cat "$dir/fuzz-skipped.txt")"
    summary+=("$name: fuzz tests skipped: $(cat "$dir/fuzz-skipped.txt")")
  fi
  if [[ $fail -gt 0 && -s $junit ]]; then
    local digest
    digest=$(failure_digest "$name" "$junit")
    [[ -n $digest ]] && digests+=("$digest")
  fi
  summary+=("$name: $pass passed, $fail failed")
  total_pass=$((total_pass + pass))
  total_fail=$((total_fail + fail))
}

start=$SECONDS
for tree in "${trees[@]}"; do
  case $tree in
    main) run_tree main "$BUILD_DIR" ;;
    asan) run_tree asan "$ASAN_DIR" -DSTRATA_SANITIZE=address "${sanitizer_flags[@]}" ;;
    tsan) run_tree tsan "$TSAN_DIR" -DSTRATA_SANITIZE=thread "${sanitizer_flags[@]}" ;;
    *) echo "run_tests: unknown tree '$tree' (main, asan, tsan)" >&2; exit 2 ;;
  esac
done

if [[ ${#digests[@]} -gt 0 ]]; then
  echo "==> why the failed tests failed (their output is in full above)"
  printf '%s\n' "${digests[@]}"
fi
echo "==> summary ($((SECONDS - start)) s)"
for line in "${summary[@]}"; do
  echo "    $line"
done
echo "$total_pass passed, $total_fail failed"
[[ $total_fail -eq 0 ]]
