#!/usr/bin/env bash
# MoE dispatch/combine in one run: strata's Prefill and Decode schedules and its Relay baseline
# (`strata bench moe`) against Open MPI the way Megatron's all-to-all dispatcher does it
# (bench/peers/mpi_moe_bench), at R = 2, 4, 8 ranks. Writes docs/PERFORMANCE_MOE.md and
# docs/perf_moe.png, and the MoE section of docs/PERFORMANCE.md (scripts/moe_report.py).
#
#   scripts/bench_moe.sh              # ~5-10 min on an idle 2-core machine
#   QUICK=1 scripts/bench_moe.sh      # fewer iterations
#   RANKS="2" SKIP_MPI=1 scripts/bench_moe.sh
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BUILD_DIR=${BUILD_DIR:-build}
OUT=${BENCH_OUT:-$BUILD_DIR/bench-moe}
DOCS_DIR=${DOCS_DIR:-docs}
RANKS=${RANKS:-2 4 8}
QUICK=${QUICK:-0}
PY=/usr/bin/python3
[[ -x $PY ]] || PY=python3
say() { printf '[bench_moe %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [[ ${SKIP_BUILD:-0} != 1 ]]; then
  [[ -f $BUILD_DIR/build.ninja ]] || cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null || exit 1
  targets=(strata_cli)
  grep -q 'build bench/peers/mpi_moe_bench:' "$BUILD_DIR/build.ninja" 2>/dev/null && targets+=(mpi_moe_bench)
  say "building ${targets[*]}"
  cmake --build "$BUILD_DIR" --target "${targets[@]}" ${JOBS:+-j "$JOBS"} >/dev/null || exit 1
fi
STRATA=$BUILD_DIR/strata
MPI_BENCH=$BUILD_DIR/bench/peers/mpi_moe_bench
HAVE_MPI=1
if [[ ${SKIP_MPI:-0} == 1 || ! -x $MPI_BENCH ]] || ! command -v mpirun >/dev/null; then
  HAVE_MPI=0
  say "Open MPI peer skipped (mpi_moe_bench not built or mpirun missing: scripts/install_bench_deps.sh)"
fi
MPIRUN=(mpirun --oversubscribe)
[[ $(id -u) == 0 ]] && MPIRUN+=(--allow-run-as-root)
# Keep glibc from mapping/unmapping Open MPI's large temporaries per call (MEASURED.md).
TUNED_ENV=(MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=4294967296)
Q=()
[[ $QUICK == 1 ]] && Q=(--quick)

rm -rf "$OUT"
mkdir -p "$OUT"
echo "$(cut -d' ' -f1-3 /proc/loadavg)" >"$OUT/load_start"
failures=0
run() {
  local name=$1
  shift
  local t0=$SECONDS
  if "$@" >"$OUT/$name.log" 2>&1; then
    say "$name ok ($((SECONDS - t0)) s)"
  else
    say "$name FAILED (exit $?; see $OUT/$name.log)"
    failures=$((failures + 1))
  fi
}
# Open MPI polls without sleeping; strata's waits spin STRATA_SPIN_US, then yield and sleep on a
# futex (a rank that sleeps on a loaded machine takes ~1 ms to be scheduled again). Give strata the
# same polling as its peer; with more ranks than cores the library spins ~0 whatever this says.
SPIN_ENV=(STRATA_SPIN_US=${STRATA_SPIN_US:-100000})
for n in $RANKS; do
  run "strata_n$n" env "${SPIN_ENV[@]}" "$STRATA" bench moe -n "$n" "${Q[@]}" --json "$OUT/results.jsonl"
  [[ $HAVE_MPI == 1 ]] && run "openmpi_n$n" env "${TUNED_ENV[@]}" "${MPIRUN[@]}" -x MALLOC_MMAP_THRESHOLD_ \
    -x MALLOC_TRIM_THRESHOLD_ -np "$n" "$MPI_BENCH" "${Q[@]}" --json "$OUT/results.jsonl"
done
echo "$(cut -d' ' -f1-3 /proc/loadavg)" >"$OUT/load_end"

cmd="scripts/bench_moe.sh"
[[ $QUICK == 1 ]] && cmd="QUICK=1 $cmd"
[[ $RANKS != "2 4 8" ]] && cmd="RANKS=\"$RANKS\" $cmd"
$PY scripts/moe_report.py --results "$OUT" --docs "$DOCS_DIR" --command "$cmd" || failures=$((failures + 1))
exit $((failures > 0))
