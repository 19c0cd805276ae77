#!/usr/bin/env bash
# `strata bench moe` between "hosts" that are network namespaces on this machine (root), next
# to Open MPI's all-to-all-v dispatcher (bench/peers/mpi_moe_bench) across the same
# namespaces; the logs go to $BENCH_OUT, the table of docs/PERFORMANCE_MOE.md ("Across hosts")
# is written from them by hand.
#
#   scripts/bench_moe_multihost.sh            # QUICK=0 for the full iteration counts
#
# Setup (tests/multihost/netns_lib.sh): 2 hosts x 2 ranks, one veth per host into a bridge
# (TCP between hosts, shared memory within a host). strata: `strata run --nnodes 2`, one agent
# per namespace, ranks running `strata bench moe --as-rank` (which also prints the bytes each
# host sends to the other per call). Open MPI: mpirun from h0, daemons started in the
# namespaces by tests/multihost/mpi_rsh_agent.sh, btl tcp,vader,self on the test subnet.
# Settings: BUILD_DIR (build), BENCH_OUT ($BUILD_DIR/bench-moe-multihost), QUICK (1), ONLY
# (prefill|decode|empty for both), SKIP_MPI=1.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BUILD_DIR=${BUILD_DIR:-build}
BENCH_OUT=${BENCH_OUT:-$BUILD_DIR/bench-moe-multihost}
QUICK=${QUICK:-1}
ONLY=${ONLY:-}
HOSTS=2 PER_HOST=2
say() { printf '[bench_moe_multihost %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
# shellcheck source=../tests/multihost/netns_lib.sh
source "$ROOT/tests/multihost/netns_lib.sh"
(mh_require) || { say "needs root and network namespaces (see above)"; exit 1; }
STRATA=$(cd "$BUILD_DIR" && pwd)/strata
MPI_MOE=$(cd "$BUILD_DIR" && pwd)/bench/peers/mpi_moe_bench
args=()
[[ $QUICK == 1 ]] && args+=(--quick)
[[ -n $ONLY ]] && args+=(--only "$ONLY")
rm -rf "$BENCH_OUT"
mkdir -p "$BENCH_OUT/agents"
BENCH_OUT=$(cd "$BENCH_OUT" && pwd)
mh_setup "$HOSTS" || exit 1
trap mh_cleanup EXIT
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "git: $(git rev-parse --short HEAD)$(git diff --quiet || echo +dirty)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//') x $(nproc)"
  echo "load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "openmpi: $(mpirun --version 2>/dev/null | head -1)"
} >"$BENCH_OUT/machine.txt"
rc=0
say "strata"
STRATA_OVERSUBSCRIBED=1 STRATA_UCX_NET_DEVICES=eth0 mh_start_agents "$STRATA" "$PER_HOST,$PER_HOST" "$BENCH_OUT/agents" \
  --timeout 900s -- "$STRATA" bench moe --as-rank "${args[@]}"
mh_wait_agents "$BENCH_OUT/agents" "$HOSTS" 960 || { say "strata job did not finish"; rc=1; }
for ((i = 0; i < HOSTS; i++)); do [[ $(mh_rc "$BENCH_OUT/agents" $i) == 0 ]] || rc=1; done
grep -h '^\[h0:0\]' "$BENCH_OUT/agents/h0.out" | sed 's/^\[h0:0\] //' | tee "$BENCH_OUT/strata.txt"
if [[ ${SKIP_MPI:-0} != 1 && -x $MPI_MOE ]] && command -v mpirun >/dev/null; then
  say "Open MPI"
  mh_mpirun "$HOSTS" "$PER_HOST" "$BENCH_OUT" 900 -- \
    "$MPI_MOE" "${args[@]}" 2>&1 | tee "$BENCH_OUT/openmpi.txt" || rc=1
fi
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$BENCH_OUT/machine.txt"
exit $rc
