#!/usr/bin/env bash
# Small sizes beside a neighbour that sleeps and wakes often (issue 19): strata bench and the Open
# MPI peer, each started with `--neighbour sleepy` (one thread per core: busy 200 us, sleep
# 100-500 us), all_reduce and all_to_all at 2 ranks, 8 B - 64 KiB. The systems alternate within
# each round; the report takes per system and size the median over the rounds (each round's figure
# is itself a median of REPEATS repeats) and writes the "Beside a sleepy neighbour" section of
# docs/PERFORMANCE.md (scripts/neighbour_report.py; scripts/perf_report.py keeps that section).
#
#   scripts/bench_neighbour.sh               # about 2 minutes on a 2-core machine
#   NEIGHBOUR=busy ROUNDS=5 scripts/bench_neighbour.sh
#
# Settings (environment): BUILD_DIR (default build), BENCH_OUT (default $BUILD_DIR/bench-neighbour),
# DOCS_DIR (default docs), NEIGHBOUR (sleepy), COLLS ("all_reduce all_to_all"), MIN (8), MAX (64K),
# ROUNDS (3), REPEATS (7), TARGET_MS (20), SKIP_MPI=1, NO_DOCS=1 (results and table on stdout only),
# VARIANT_ENV="NAME=VALUE ..." with VARIANT_LABEL: one more strata run per round under that
# environment (to compare two builds' behaviours side by side; the product has no such switch).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BUILD_DIR=${BUILD_DIR:-build}
OUT=${BENCH_OUT:-$BUILD_DIR/bench-neighbour}
DOCS_DIR=${DOCS_DIR:-docs}
NEIGHBOUR=${NEIGHBOUR:-sleepy}
COLLS=${COLLS:-all_reduce all_to_all}
MIN=${MIN:-8} MAX=${MAX:-64K}
ROUNDS=${ROUNDS:-3} REPEATS=${REPEATS:-7} TARGET_MS=${TARGET_MS:-20}
PY=/usr/bin/python3
[[ -x $PY ]] || PY=python3
STRATA=$BUILD_DIR/strata
MPI_BENCH=$BUILD_DIR/bench/peers/mpi_bench
say() { printf '[bench_neighbour %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

[[ -x $STRATA ]] || { say "no $STRATA: build first (ninja -C $BUILD_DIR strata_cli mpi_bench)"; exit 1; }
if [[ ${SKIP_MPI:-0} != 1 ]] && { [[ ! -x $MPI_BENCH ]] || ! command -v mpirun >/dev/null; }; then
  say "no Open MPI peer ($MPI_BENCH, mpirun): scripts/install_bench_deps.sh, then rebuild; or SKIP_MPI=1"
  exit 1
fi
MPIRUN=(mpirun -np 2 --bind-to none)
[[ $(id -u) == 0 ]] && MPIRUN+=(--allow-run-as-root)

# shellcheck source=scripts/bench_lib.sh
source "$ROOT/scripts/bench_lib.sh"

rm -rf "$OUT" && mkdir -p "$OUT"
common=(-b "$MIN" -e "$MAX" -f 2 --repeats "$REPEATS" --target-ms "$TARGET_MS" -q --neighbour "$NEIGHBOUR")
: >"$OUT/load.tsv"
fail=0
for round in $(seq 1 "$ROUNDS"); do
  for coll in $COLLS; do
    printf '%s\t%s\t%s\t%s\n' "$round" "$coll" "$(others_busy)" "$(cut -d' ' -f1 /proc/loadavg)" >>"$OUT/load.tsv"
    say "round $round/$ROUNDS: $coll, strata"
    "$STRATA" bench "$coll" -n 2 "${common[@]}" --json "$OUT/strata-$coll-r$round.json" >"$OUT/strata-$coll-r$round.txt" || fail=1
    if [[ -n ${VARIANT_ENV:-} ]]; then
      say "round $round/$ROUNDS: $coll, strata ($VARIANT_LABEL)"
      env $VARIANT_ENV "$STRATA" bench "$coll" -n 2 "${common[@]}" --label "${VARIANT_LABEL:-strata-variant}" \
        --json "$OUT/variant-$coll-r$round.json" >"$OUT/variant-$coll-r$round.txt" || fail=1
    fi
    if [[ ${SKIP_MPI:-0} != 1 ]]; then
      say "round $round/$ROUNDS: $coll, Open MPI"
      "${MPIRUN[@]}" "$MPI_BENCH" "$coll" "${common[@]}" --json "$OUT/mpi-$coll-r$round.json" \
        >"$OUT/mpi-$coll-r$round.txt" 2>"$OUT/mpi-$coll-r$round.err" || fail=1
    fi
  done
done
# The niceness it ran at (nice -n -10 keeps the other work of a shared machine out of the way).
prefix=""
[[ $(nice) == 0 ]] || prefix="nice -n $(nice) "
report=("$PY" scripts/neighbour_report.py "$OUT" --neighbour "$NEIGHBOUR"
        --command "${prefix}scripts/bench_neighbour.sh (ROUNDS=$ROUNDS REPEATS=$REPEATS TARGET_MS=$TARGET_MS)")
[[ ${NO_DOCS:-0} == 1 ]] || report+=(--docs "$DOCS_DIR")
"${report[@]}" || fail=1
exit $fail
