#!/usr/bin/env bash
# strata vs Open MPI between "hosts" that are network namespaces on this machine (root), in
# one run, then docs/PERFORMANCE_MULTIHOST.md (+ its plot) and the linked section of
# docs/PERFORMANCE.md.
#
#   scripts/bench_multihost.sh           # about 6 minutes on an idle 2-core machine
#   QUICK=1 scripts/bench_multihost.sh   # about 1 minute: fewer sizes, one round
#
# Setup (tests/multihost/netns_lib.sh): 2 hosts, each a namespace with one veth to a bridge
# (10.77.0.0/24), with 2 ranks each (they share memory, and the 4 ranks share this machine's
# 2 cores) and with 1 rank each (a core per rank). Measured:
#   link probe   TCP over the same veth: iperf3, 1 and 2 streams (2 ranks per host send at
#                once), h1 -> h0, and 2 streams each way at once (two iperf3 pairs), once per round
#   strata       `strata run --nnodes 2` on each host, ranks running `strata bench --as-rank`
#                (all_reduce, all_to_all, all_gather, reduce_scatter, broadcast, barrier;
#                fp32, out of place)
#   Open MPI     mpirun from h0, daemons started in the namespaces by an rsh agent
#                (tests/multihost/mpi_rsh_agent.sh), TCP BTL between hosts (test subnet only),
#                vader (shared memory) within a host; bench/peers/mpi_bench with the same
#                method, sizes and definitions
# Systems alternate within each round; the report takes the median round per system and size.
#
# Settings (environment): BUILD_DIR (build), BENCH_OUT ($BUILD_DIR/bench-multihost),
# DOCS_DIR (docs), QUICK, MIN (4K), MAX (64M), FACTOR (4), REPEATS, TARGET_MS, WARMUP, ROUNDS,
# LAYOUTS ("2 1": ranks per host, one layout after the other within each round; 2 puts 4
# ranks on this 2-core machine, 1 leaves a core per rank and no shared memory between ranks),
# COLLS ("all_reduce all_to_all all_gather reduce_scatter broadcast barrier": the collectives,
# any that both `strata bench` and mpi_bench run), SKIP_STRATA=1 / SKIP_MPI=1 / SKIP_LINK=1,
# SKIP_BUILD=1, JOBS.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BUILD_DIR=${BUILD_DIR:-build}
BENCH_OUT=${BENCH_OUT:-$BUILD_DIR/bench-multihost}
DOCS_DIR=${DOCS_DIR:-docs}
QUICK=${QUICK:-0}
PY=/usr/bin/python3
[[ -x $PY ]] || PY=python3
MIN=${MIN:-4K} MAX=${MAX:-64M}
if [[ $QUICK == 1 ]]; then
  REPEATS=${REPEATS:-3} TARGET_MS=${TARGET_MS:-10} WARMUP=${WARMUP:-2} ROUNDS=${ROUNDS:-1} FACTOR=${FACTOR:-16}
else
  REPEATS=${REPEATS:-5} TARGET_MS=${TARGET_MS:-50} WARMUP=${WARMUP:-3} ROUNDS=${ROUNDS:-2} FACTOR=${FACTOR:-4}
fi
HOSTS=2 LAYOUTS=${LAYOUTS:-2 1}
for ph in $LAYOUTS; do
  [[ $ph =~ ^[1-9][0-9]?$ ]] || { echo "bench_multihost: LAYOUTS='$LAYOUTS': '$ph' is not a rank count per host from 1 to 99" >&2; exit 2; }
done
read -r -a COLLS <<<"${COLLS:-all_reduce all_to_all all_gather reduce_scatter broadcast barrier}"
# The command as it was given, with the settings that change what is measured.
COMMAND_LINE="$0 $*"
for v in QUICK BUILD_DIR MIN MAX FACTOR REPEATS TARGET_MS ROUNDS LAYOUTS; do
  [[ -n ${!v+x} && $(env | grep -c "^$v=") -gt 0 ]] && COMMAND_LINE="$v=${!v} $COMMAND_LINE"
done

say() { printf '[bench_multihost %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
start=$(date +%s)

# shellcheck source=../tests/multihost/netns_lib.sh
source "$ROOT/tests/multihost/netns_lib.sh"
(mh_require) || { say "needs root and network namespaces (see above)"; exit 1; }

if [[ ${SKIP_BUILD:-0} != 1 ]]; then
  [[ -f $BUILD_DIR/build.ninja ]] || cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release || exit 1
  targets=(strata_cli)
  # Configured before Open MPI was installed: configure again so that FindMPI sees it.
  if command -v mpirun >/dev/null && ! grep -q 'build bench/peers/mpi_bench:' "$BUILD_DIR/build.ninja"; then
    cmake -S . -B "$BUILD_DIR" >/dev/null || exit 1
  fi
  grep -q 'build bench/peers/mpi_bench:' "$BUILD_DIR/build.ninja" && targets+=(mpi_bench)
  cmake --build "$BUILD_DIR" ${JOBS:+-j "$JOBS"} --target "${targets[@]}" || exit 1
fi
STRATA=$(cd "$BUILD_DIR" && pwd)/strata
MPI_BENCH=$(cd "$BUILD_DIR" && pwd)/bench/peers/mpi_bench
HAVE_MPI=1
if [[ ${SKIP_MPI:-0} == 1 || ! -x $MPI_BENCH ]] || ! command -v mpirun >/dev/null; then
  HAVE_MPI=0
  say "Open MPI skipped (mpi_bench not built or mpirun missing: scripts/install_bench_deps.sh)"
fi
HAVE_IPERF=1
if [[ ${SKIP_LINK:-0} == 1 ]] || ! command -v iperf3 >/dev/null; then
  HAVE_IPERF=0
  say "link probe skipped (iperf3 missing: scripts/install_bench_deps.sh)"
fi

rm -rf "$BENCH_OUT"
mkdir -p "$BENCH_OUT"
BENCH_OUT=$(cd "$BENCH_OUT" && pwd)
mh_setup "$HOSTS" || exit 1
failures=0
COMMON=(-b "$MIN" -e "$MAX" -f "$FACTOR" --warmup "$WARMUP" --repeats "$REPEATS" --target-ms "$TARGET_MS" -q)
export MH_NETNS_MAP=""
for ((i = 0; i < HOSTS; i++)); do MH_NETNS_MAP+="$(mh_addr $i)=$(mh_host_ns $i)=h$i "; done
subnet="${MH_SUBNET}.0/24"
# The hostfile gives each host PER_HOST slots, so Open MPI does not know that all ranks share
# this machine's few cores and busy-polls; yield_when_idle tells it (measured here: 4 KiB
# all_reduce ~12 ms without, ~0.1 ms with). Strata is told the same with
# STRATA_OVERSUBSCRIBED=1 (its waits then yield at once instead of spinning 500 µs first;
# measured here: 4 KiB all_reduce ~2.6 ms without, ~0.2 ms with).
# use_layout P: P ranks per host from here on (strata's per-host counts, Open MPI's hostfile).
use_layout() {
  PER_HOST=$1
  counts=$(printf "$PER_HOST,%.0s" $(seq "$HOSTS"))
  counts=${counts%,}
  local hostfile=$BENCH_OUT/hostfile_p$PER_HOST i
  for ((i = 0; i < HOSTS; i++)); do echo "$(mh_addr $i) slots=$PER_HOST"; done >"$hostfile"
  MPIRUN=(mpirun --allow-run-as-root --oversubscribe -np $((HOSTS * PER_HOST)) --hostfile "$hostfile"
    --map-by slot --mca plm_rsh_agent "$ROOT/tests/multihost/mpi_rsh_agent.sh" --mca mpi_yield_when_idle 1
    --mca btl tcp,vader,self --mca btl_tcp_if_include "$subnet" --mca oob_tcp_if_include "$subnet")
}

# shellcheck source=scripts/bench_lib.sh
source "$ROOT/scripts/bench_lib.sh"

# The strata job: one agent per namespace, as on real hosts; rank 0 writes the JSON.
strata_job() {
  local coll=$1 json=$2 log=$BENCH_OUT/agents_$3
  mkdir -p "$log"
  STRATA_OVERSUBSCRIBED=1 mh_start_agents "$STRATA" "$counts" "$log" --timeout 900s -- "$STRATA" bench "$coll" --as-rank "${COMMON[@]}" \
    --label strata --json "$json"
  mh_wait_agents "$log" "$HOSTS" 960 || { echo "strata job did not finish"; return 124; }
  mh_show "$log" "$HOSTS"
  for ((i = 0; i < HOSTS; i++)); do [[ $(mh_rc "$log" $i) == 0 ]] || return 1; done
}

mpi_job() {
  local coll=$1 json=$2
  mh_exec 0 timeout 900 "${MPIRUN[@]}" "$MPI_BENCH" "$coll" "${COMMON[@]}" --label openmpi --json "$json"
}

# iperf3 server in h0, client in h1, over the veths and the bridge the collectives use.
link_probe() {
  local streams=$1 json=$2
  mh_exec 0 iperf3 -s -1 -B "$(mh_addr 0)" -p 5201 >"$BENCH_OUT/iperf3_server_$streams.log" 2>&1 &
  local server=$!
  sleep 0.5
  mh_exec 1 iperf3 -c "$(mh_addr 0)" -p 5201 -t "$([[ $QUICK == 1 ]] && echo 2 || echo 5)" -P "$streams" -J >"$json"
  local rc=$?
  wait "$server"
  return $rc
}

# Both directions at once, each by its own iperf3 pair (iperf3 is single-threaded, so one
# process doing both directions would measure itself): h1 -> h0 and h0 -> h1, 2 streams each.
link_probe_both() {
  local json=$1 t
  t=$([[ $QUICK == 1 ]] && echo 2 || echo 5)
  mh_exec 0 iperf3 -s -1 -B "$(mh_addr 0)" -p 5201 >"$BENCH_OUT/iperf3_server_both0.log" 2>&1 &
  local s0=$!
  mh_exec 1 iperf3 -s -1 -B "$(mh_addr 1)" -p 5202 >"$BENCH_OUT/iperf3_server_both1.log" 2>&1 &
  local s1=$!
  sleep 0.5
  mh_exec 1 iperf3 -c "$(mh_addr 0)" -p 5201 -t "$t" -P 2 -J >"${json%.json}_fwd.json" &
  local c0=$!
  mh_exec 0 iperf3 -c "$(mh_addr 1)" -p 5202 -t "$t" -P 2 -J >"${json%.json}_rev.json"
  local rc=$?
  wait "$c0" || rc=1
  wait "$s0" "$s1"
  return $rc
}

{
  echo "{"
  echo "  \"date\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\","
  echo "  \"command\": \"$COMMAND_LINE\","
  echo "  \"nproc\": $(nproc),"
  echo "  \"cpu\": \"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//; s/"//g')\","
  echo "  \"kernel\": \"$(uname -r)\","
  echo "  \"hosts\": $HOSTS, \"layouts\": [$(echo $LAYOUTS | tr ' ' ',')],"
  echo "  \"loadavg_start\": \"$(cut -d' ' -f1-3 /proc/loadavg)\","
  echo "  \"git\": \"$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo '+dirty')\","
  echo "  \"openmpi\": \"$(mpirun --version 2>/dev/null | head -1 | sed 's/"//g')\","
  echo "  \"iperf3\": \"$(iperf3 --version 2>/dev/null | head -1 | sed 's/"//g')\","
  echo "  \"quick\": $QUICK"
  echo "}"
} >"$BENCH_OUT/machine.json"

say "results in $BENCH_OUT (QUICK=$QUICK)"
for ((round = 1; round <= ROUNDS; round++)); do
  # The link is probed in every round too: on a shared machine what it can carry changes
  # with the load, and the report compares the collectives with the best it showed.
  if [[ $HAVE_IPERF == 1 ]]; then
    run "link_1stream_r$round" link_probe 1 "$BENCH_OUT/link_1stream_r$round.json"
    run "link_2streams_r$round" link_probe 2 "$BENCH_OUT/link_2streams_r$round.json"
    # Both collectives send in both directions at once, and the two directions' TCP work
    # shares the same cores: this is the probe they are held against.
    run "link_both_r$round" link_probe_both "$BENCH_OUT/link_both_r$round.json"
  fi
  for ph in $LAYOUTS; do
    use_layout "$ph"
    for coll in "${COLLS[@]}"; do
      id=${coll}_p${ph}_r$round
      [[ ${SKIP_STRATA:-0} == 1 ]] || run "strata_$id" strata_job "$coll" "$BENCH_OUT/strata_$id.json" "$id"
      [[ $HAVE_MPI == 1 ]] && run "openmpi_$id" mpi_job "$coll" "$BENCH_OUT/openmpi_$id.json"
    done
  done
done
sed -i "s/\"quick\": $QUICK/\"loadavg_end\": \"$(cut -d' ' -f1-3 /proc/loadavg)\",\n  \"seconds\": $(($(date +%s) - start)),\n  \"quick\": $QUICK/" \
  "$BENCH_OUT/machine.json"
mh_cleanup
say "measurements done in $(($(date +%s) - start)) s, $failures failed; writing $DOCS_DIR/PERFORMANCE_MULTIHOST.md"
"$PY" scripts/perf_multihost_report.py "$BENCH_OUT" --docs "$DOCS_DIR" || exit 1
[[ $failures == 0 ]] || { say "$failures measurement(s) failed (logs in $BENCH_OUT)"; exit 1; }
