#!/usr/bin/env bash
# Striped bulk transfers between hosts, measured against one connection per peer: strata only,
# the same build, STRATA_UCX_LANES=1 and the default alternating within each round, through
# scripts/bench_multihost.sh (namespaces as hosts). Writes the "Lanes" section of
# docs/PERFORMANCE_MULTIHOST.md (scripts/perf_lanes_report.py), which the full multihost
# report keeps when it rewrites the file.
#
#   scripts/bench_lanes.sh          (as root; after `make build`)
#
# Settings: BUILD_DIR (build), ROUNDS (3), LAYOUTS ("2 1"), COLLS (all_reduce all_to_all
# all_gather reduce_scatter broadcast), MIN (256K), MAX (64M), FACTOR (4), OUT
# ($BUILD_DIR/bench-lanes), DOCS_DIR (docs).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1
BUILD_DIR=${BUILD_DIR:-build} ROUNDS=${ROUNDS:-3} LAYOUTS=${LAYOUTS:-2 1}
COLLS=${COLLS:-all_reduce all_to_all all_gather reduce_scatter broadcast}
MIN=${MIN:-256K} MAX=${MAX:-64M} FACTOR=${FACTOR:-4}
OUT=${OUT:-$BUILD_DIR/bench-lanes} DOCS_DIR=${DOCS_DIR:-docs}
PY=/usr/bin/python3
[[ -x $PY ]] || PY=python3
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "bench_lanes: ROUNDS='$ROUNDS' is not a positive count" >&2; exit 2; }
rm -rf "$OUT"
mkdir -p "$OUT/docs-scratch"
for ((r = 1; r <= ROUNDS; r++)); do
  for lanes in 1 default; do
    dir=$OUT/lanes-$lanes/r$r
    if [[ $lanes == 1 ]]; then export STRATA_UCX_LANES=1; else unset STRATA_UCX_LANES; fi
    BUILD_DIR=$BUILD_DIR SKIP_MPI=1 SKIP_LINK=1 SKIP_BUILD=$([[ $r == 1 && $lanes == 1 ]] && echo 0 || echo 1) \
      LAYOUTS="$LAYOUTS" ROUNDS=1 COLLS="$COLLS" MIN=$MIN MAX=$MAX FACTOR=$FACTOR BENCH_OUT="$dir" \
      DOCS_DIR="$OUT/docs-scratch" scripts/bench_multihost.sh >"$OUT/round$r-$lanes.log" 2>&1 ||
      { echo "bench_lanes: round $r ($lanes lanes) failed, see $OUT/round$r-$lanes.log" >&2; exit 1; }
  done
done
unset STRATA_UCX_LANES
"$PY" scripts/perf_lanes_report.py "$OUT" --docs "$DOCS_DIR" \
  --command "$( [[ $ROUNDS != 3 ]] && printf 'ROUNDS=%s ' "$ROUNDS")scripts/bench_lanes.sh"
