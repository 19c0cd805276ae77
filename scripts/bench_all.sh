#!/usr/bin/env bash
# One run of strata and its peers, side by side, then docs/PERFORMANCE.md and its plots.
#
#   scripts/bench_all.sh                 # full run (about 13 minutes on an idle 2-core machine)
#   QUICK=1 scripts/bench_all.sh         # a couple of minutes: fewer sizes and repeats
#
# Runs, at 2 ranks, fp32, out of place:
#   memcpy probe (1 thread, 2 threads at once; 256 MiB, warm pages)
#   all_reduce 8 B - 256 MiB (x2), all_gather / reduce_scatter / all_to_all 1 KiB - 64 MiB (x4), each with
#     strata on heap, external and registered buffers, Open MPI default, Open MPI with
#     MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_ raised, torch gloo (x4 sizes, capped iterations)
#   all_reduce at 4 and 8 ranks, 8 B - 64 MiB (x4): strata heap, Open MPI default and malloc-tuned
# then scripts/perf_report.py writes docs/PERFORMANCE.md and docs/perf_*.png.
# The machine is shared and noisy, so everything but gloo runs in ROUNDS rounds (default 2), the
# systems alternating within each round; the report takes, per system and size, the best round
# (each round's figure being a median of REPEATS repeats). The memcpy probe runs at the start and
# at the end; the report compares with the faster of the two. Before each measurement the share of
# CPU time that other processes take (over 0.4 s) and the load average are logged (load.tsv) and
# summarised in the report: on a shared machine that says how far to trust a run.
#
# Settings (environment):
#   BUILD_DIR   build tree with strata and bench/peers (default build; configured and built if needed)
#   BENCH_OUT   where the JSON results and logs go (default $BUILD_DIR/bench-results)
#   DOCS_DIR    where PERFORMANCE.md and the plots go (default docs)
#   QUICK=1     quick mode; the variables below override either mode:
#   AR_MAX COLL_MIN COLL_MAX EXTRA_MAX EXTRA_RANKS REPEATS TARGET_MS GLOO_MAX_ITERS ROUNDS
#   SKIP_GLOO=1 SKIP_MPI=1 SKIP_BUILD=1
#   MEASURE_TIMEOUT  seconds one measurement may take before it is stopped and counted failed (300)
#   JOBS        compile parallelism for the build step (default: ninja's)
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BUILD_DIR=${BUILD_DIR:-build}
BENCH_OUT=${BENCH_OUT:-$BUILD_DIR/bench-results}
DOCS_DIR=${DOCS_DIR:-docs}
QUICK=${QUICK:-0}
PY=/usr/bin/python3
[[ -x $PY ]] || PY=python3

if [[ $QUICK == 1 ]]; then
  AR_MIN=${AR_MIN:-8} AR_MAX=${AR_MAX:-64M} AR_F=${AR_F:-8}
  COLL_MIN=${COLL_MIN:-1K} COLL_MAX=${COLL_MAX:-16M} COLL_F=${COLL_F:-8}
  EXTRA_MAX=${EXTRA_MAX:-4M} EXTRA_F=${EXTRA_F:-16} EXTRA_RANKS=${EXTRA_RANKS:-4 8}
  REPEATS=${REPEATS:-3} TARGET_MS=${TARGET_MS:-5} WARMUP=${WARMUP:-2} GLOO_MAX_ITERS=${GLOO_MAX_ITERS:-20}
  MEMCPY_BYTES=${MEMCPY_BYTES:-64M} ROUNDS=${ROUNDS:-1}
else
  AR_MIN=${AR_MIN:-8} AR_MAX=${AR_MAX:-256M} AR_F=${AR_F:-2}
  COLL_MIN=${COLL_MIN:-1K} COLL_MAX=${COLL_MAX:-64M} COLL_F=${COLL_F:-4}
  EXTRA_MAX=${EXTRA_MAX:-64M} EXTRA_F=${EXTRA_F:-4} EXTRA_RANKS=${EXTRA_RANKS:-4 8}
  REPEATS=${REPEATS:-7} TARGET_MS=${TARGET_MS:-20} WARMUP=${WARMUP:-5} GLOO_MAX_ITERS=${GLOO_MAX_ITERS:-200}
  MEMCPY_BYTES=${MEMCPY_BYTES:-256M} ROUNDS=${ROUNDS:-2}
fi
GLOO_F=$(( ${AR_F%.*} < 4 ? 4 : ${AR_F%.*} ))   # gloo is ~1000x slower at small sizes: fewer sizes
TUNED_ENV=(MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=4294967296)

# shellcheck source=scripts/bench_lib.sh
source "$ROOT/scripts/bench_lib.sh"
say() { printf '[bench_all %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
start=$(date +%s)

# ---- build --------------------------------------------------------------------------------------
if [[ ${SKIP_BUILD:-0} != 1 ]]; then
  if [[ ! -f $BUILD_DIR/build.ninja ]]; then
    say "configuring $BUILD_DIR (Release)"
    cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null || exit 1
  fi
  # Configured before Open MPI was installed: configure again so that FindMPI sees it.
  if command -v mpirun >/dev/null && ! grep -q 'build bench/peers/mpi_bench:' "$BUILD_DIR/build.ninja"; then
    cmake -S . -B "$BUILD_DIR" >/dev/null || exit 1
  fi
  targets=(strata_cli memcpy_probe)
  grep -q 'build bench/peers/mpi_bench:' "$BUILD_DIR/build.ninja" 2>/dev/null && targets+=(mpi_bench)
  say "building ${targets[*]}"
  cmake --build "$BUILD_DIR" --target "${targets[@]}" ${JOBS:+-j "$JOBS"} >/dev/null || exit 1
fi
STRATA=$BUILD_DIR/strata
MPI_BENCH=$BUILD_DIR/bench/peers/mpi_bench
MEMCPY=$BUILD_DIR/bench/peers/memcpy_probe
[[ -x $STRATA ]] || { echo "bench_all: $STRATA is missing" >&2; exit 1; }

HAVE_MPI=1
if [[ ${SKIP_MPI:-0} == 1 || ! -x $MPI_BENCH ]] || ! command -v mpirun >/dev/null; then
  HAVE_MPI=0
  say "Open MPI peer skipped (mpi_bench not built or mpirun missing: scripts/install_bench_deps.sh)"
fi
HAVE_GLOO=1
if [[ ${SKIP_GLOO:-0} == 1 ]] || ! $PY -c 'import torch.distributed' 2>/dev/null; then
  HAVE_GLOO=0
  say "gloo peer skipped (no torch for $PY: scripts/install_bench_deps.sh)"
fi
MPIRUN=(mpirun --oversubscribe)
[[ $(id -u) == 0 ]] && MPIRUN+=(--allow-run-as-root)

rm -rf "$BENCH_OUT"
mkdir -p "$BENCH_OUT"
failures=0
COMMON=(--warmup "$WARMUP" --repeats "$REPEATS" --target-ms "$TARGET_MS" -q)

# sweep COLL N MIN MAX FACTOR SYSTEMS...: every system at the same sizes, one after the other.
sweep() {
  local coll=$1 n=$2 min=$3 max=$4 f=$5
  shift 5
  local sizes=(-b "$min" -e "$max" -f "$f")
  for sys in "$@"; do
    local tag=${sys}_${coll}_n${n}_r${round}
    case $sys in
      strata-heap | strata-external | strata-registered)
        run "$tag" "$STRATA" bench "$coll" -n "$n" "${sizes[@]}" "${COMMON[@]}" --buffers "${sys#strata-}" \
          --json "$BENCH_OUT/$tag.json" ;;
      openmpi)
        [[ $HAVE_MPI == 1 ]] && run "$tag" "${MPIRUN[@]}" -np "$n" "$MPI_BENCH" "$coll" "${sizes[@]}" "${COMMON[@]}" \
          --label openmpi --json "$BENCH_OUT/$tag.json" ;;
      openmpi-malloc-tuned)
        [[ $HAVE_MPI == 1 ]] && run "$tag" env "${TUNED_ENV[@]}" "${MPIRUN[@]}" -x MALLOC_MMAP_THRESHOLD_ \
          -x MALLOC_TRIM_THRESHOLD_ -np "$n" "$MPI_BENCH" "$coll" "${sizes[@]}" "${COMMON[@]}" \
          --label openmpi-malloc-tuned --json "$BENCH_OUT/$tag.json" ;;
      gloo)
        [[ $HAVE_GLOO == 1 ]] && run "$tag" "$PY" bench/peers/torch_bench.py "$coll" -n "$n" -b "$min" -e "$max" \
          -f "$GLOO_F" "${COMMON[@]}" --max-iters "$GLOO_MAX_ITERS" --label gloo --json "$BENCH_OUT/$tag.json" ;;
    esac
  done
}

# ---- the machine ------------------------------------------------------------------------------
{
  echo "{"
  echo "  \"date\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\","
  echo "  \"nproc\": $(nproc),"
  echo "  \"cpu\": \"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//; s/"//g')\","
  echo "  \"kernel\": \"$(uname -r)\","
  echo "  \"mem_gib\": $(awk '/MemTotal/ {printf "%.1f", $2 / 1048576}' /proc/meminfo),"
  echo "  \"loadavg_start\": \"$(cut -d' ' -f1-3 /proc/loadavg)\","
  echo "  \"git\": \"$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo '+dirty')\","
  echo "  \"openmpi\": \"$(mpirun --version 2>/dev/null | head -1 | sed 's/"//g')\","
  echo "  \"torch\": \"$($PY -c 'import torch; print(torch.__version__)' 2>/dev/null)\","
  echo "  \"quick\": $QUICK"
  echo "}"
} >"$BENCH_OUT/machine.json"

say "results in $BENCH_OUT (QUICK=$QUICK)"
run memcpy_start "$MEMCPY" --bytes "$MEMCPY_BYTES" --threads 2 --repeats "$REPEATS" --json "$BENCH_OUT/memcpy_start.json"

for ((round = 1; round <= ROUNDS; round++)); do
  ALL=(strata-heap strata-external strata-registered openmpi openmpi-malloc-tuned)
  [[ $round == 1 ]] && ALL+=(gloo)  # one round: it takes longer than all the others together
  sweep all_reduce 2 "$AR_MIN" "$AR_MAX" "$AR_F" "${ALL[@]}"
  for coll in all_gather reduce_scatter all_to_all; do
    sweep "$coll" 2 "$COLL_MIN" "$COLL_MAX" "$COLL_F" "${ALL[@]}"
  done
  for n in $EXTRA_RANKS; do
    sweep all_reduce "$n" 8 "$EXTRA_MAX" "$EXTRA_F" strata-heap openmpi openmpi-malloc-tuned
  done
done
run memcpy_end "$MEMCPY" --bytes "$MEMCPY_BYTES" --threads 2 --repeats "$REPEATS" --json "$BENCH_OUT/memcpy_end.json"

sed -i "s/\"quick\": $QUICK/\"loadavg_end\": \"$(cut -d' ' -f1-3 /proc/loadavg)\",\n  \"seconds\": $(($(date +%s) - start)),\n  \"quick\": $QUICK/" \
  "$BENCH_OUT/machine.json"
say "measurements done in $(($(date +%s) - start)) s, $failures failed; writing $DOCS_DIR/PERFORMANCE.md"
"$PY" scripts/perf_report.py "$BENCH_OUT" --docs "$DOCS_DIR" || exit 1
[[ $failures == 0 ]] || { say "$failures measurement(s) failed (logs in $BENCH_OUT)"; exit 1; }
