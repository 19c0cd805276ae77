#!/usr/bin/env bash
# `strata run --nnodes` between network namespaces: one agent per namespace, as on real
# hosts. Each case asserts exit statuses, reports and timing, and prints every agent's
# output when it fails.
#
#   launcher_netns_test.sh STRATA SMOKE_RANK CASE [ARGS...]
#   CASE: smoke | rank_failure | link_down          (the launcher alone)
#         matrix COUNTS PROGRAM [ARGS...]            (PROGRAM's ranks must all exit 0)
#         collective_link_down LINKDOWN_RANK         (mh_linkdown_rank.cpp)
#         settings_mismatch                          (h1 runs with STRATA_UCX_LANES=1)
#         options_mismatch TRAIN_DP                   (--ft on one agent, --max-failures differing)
#         ft TRAIN_DP                                 (--ft across hosts, examples/train_dp)
#         ft_spare_host TRAIN_DP                      (--ft --spare: a lost host's ranks move)
#         ft_store_lost TRAIN_DP                      (--ft, node 0 lost with its store)
#         moe_serve MOE_SERVE                         (examples/moe_serve across 2 x 2, --check)
# All but the first three need collectives across hosts, i.e. the UCX transport.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=netns_lib.sh
source "$here/netns_lib.sh"

strata=$1 smoke_rank=$2 case=$3
shift 3
mh_require
log=$(mktemp -d /tmp/strata-mhtest.XXXXXX)
failures=0
check() {  # check CONDITION-TEXT COMMAND...: counts and reports a failed assertion
  local what=$1
  shift
  if ! "$@"; then
    echo "FAILED: $what" >&2
    failures=$((failures + 1))
  fi
}
finish() {
  [[ -n ${MH_VERBOSE:-} ]] && mh_show "$log" "$1"
  if [[ $failures -gt 0 ]]; then
    mh_show "$log" "$1" >&2
    echo "$case: $failures assertion(s) failed" >&2
    exit 1
  fi
  echo "$case: passed"
  exit 0
}
# Seconds between two epoch timestamps, as an integer number of milliseconds.
ms_between() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%d", (b - a) * 1000 }'; }
grep_in() { grep -q -- "$2" "$1"; }
# agents_fail_within K SINCE LIMIT_MS WHAT: each of the K agents failed, LIMIT_MS or less after SINCE.
agents_fail_within() {
  local k=$1 since=$2 limit=$3 what=$4 i took
  for ((i = 0; i < k; i++)); do
    check "agent h$i fails (got $(mh_rc "$log" $i))" test "$(mh_rc "$log" $i)" != 0
    took=$(ms_between "$since" "$(mh_end "$log" $i)")
    check "agent h$i is done within $what (took $took ms)" test "$took" -lt "$limit"
  done
}

case $case in
  smoke)
    # Uneven rank counts, ranks numbered by node order; every rank checks its placement and
    # meets every other rank through the store served by node 0.
    mh_setup 3 || exit 1
    trap 'mh_cleanup; rm -rf "$log"' EXIT
    mh_start_agents "$strata" 1,2,2 "$log" --timeout 60s -- "$smoke_rank" 1,2,2
    check "all agents finish within 60 s" mh_wait_agents "$log" 3 60
    for i in 0 1 2; do check "agent h$i exits with 0 (got $(mh_rc "$log" $i))" test "$(mh_rc "$log" $i)" = 0; done
    check "h0 relays rank 0" grep_in "$log/h0.out" "^\[h0:0\] rank 0 of 5 on h0 (node 0, local 0 of 1): ok, met 4 ranks"
    for r in 1 2; do
      check "h1 relays rank $r" grep_in "$log/h1.out" "^\[h1:$r\] rank $r of 5 on h1 (node 1, local $((r - 1)) of 2): ok, met 3"
    done
    for r in 3 4; do
      check "h2 relays rank $r" grep_in "$log/h2.out" "^\[h2:$r\] rank $r of 5 on h2 (node 2, local $((r - 3)) of 2): ok, met 3"
    done
    finish 3
    ;;
  rank_failure)
    # A rank failing on h1 stops the ranks on every host; every agent exits with its code.
    mh_setup 2 || exit 1
    trap 'mh_cleanup; rm -rf "$log"' EXIT
    start=$(date +%s.%N)
    mh_start_agents "$strata" 2,2 "$log" -- sh -c 'sleep 1; [ "$STRATA_RANK" = 3 ] && exit 7; exec sleep 60'
    check "all agents finish within 20 s" mh_wait_agents "$log" 2 20
    for i in 0 1; do
      check "agent h$i exits with the failed rank's code 7 (got $(mh_rc "$log" $i))" test "$(mh_rc "$log" $i)" = 7
      took=$(ms_between "$start" "$(mh_end "$log" $i)")
      check "agent h$i is done within 6 s of the start (took $took ms)" test "$took" -lt 6000
    done
    check "h1 reports its rank" grep_in "$log/h1.err" "rank 3 on h1 (pid [0-9]*) exited with code 7; stopping the other 1 rank(s) and the ranks on every other node"
    check "h0 reports node 1's failure" grep_in "$log/h0.err" "the job failed on node 1 (h1): rank 3 on h1 (pid [0-9]*) exited with code 7; stopping the 2 rank(s) on h0"
    finish 2
    ;;
  link_down)
    # h1's link goes down while the job runs: node 0 misses its heartbeats, h1 loses the
    # store; both stop their ranks and fail within twice the agent timeout.
    mh_setup 2 || exit 1
    trap 'mh_cleanup; rm -rf "$log"' EXIT
    export STRATA_AGENT_TIMEOUT=2s
    mh_start_agents "$strata" 2,2 "$log" -- sleep 60
    sleep 2
    cut=$(date +%s.%N)
    mh_link_down 1
    check "all agents finish within 20 s" mh_wait_agents "$log" 2 20
    agents_fail_within 2 "$cut" 4000 "2 x 2 s of the cut"
    check "h0 names the silent node" grep_in "$log/h0.err" "the agent of node 1 (h1) sent no heartbeat for [0-9.]* s"
    check "h0 stops its ranks" grep_in "$log/h0.err" "stopping the 2 rank(s) on h0"
    check "h1 reports the lost store" grep_in "$log/h1.err" "lost the store of node 0 at 10.77.0.1:$MH_STORE_PORT"
    check "h1 stops its ranks" grep_in "$log/h1.err" "stopping the 2 rank(s) on h1"
    finish 2
    ;;
  matrix)
    # A rank program that runs the collective matrix through the public API; the hosts
    # have uneven rank counts when COUNTS says so (1,2,2).
    counts=$1
    shift
    IFS=, read -r -a n <<<"$counts"
    k=${#n[@]}
    mh_setup "$k" || exit 1
    trap 'mh_cleanup; rm -rf "$log"' EXIT
    # UCX over the test link only (lo would short-cut within a host, which shm covers).
    export STRATA_UCX_NET_DEVICES=${STRATA_UCX_NET_DEVICES:-eth0} STRATA_TIMEOUT=${STRATA_TIMEOUT:-30s}
    mh_start_agents "$strata" "$counts" "$log" --timeout 150s -- "$@"
    check "all agents finish within 160 s" mh_wait_agents "$log" "$k" 160
    for ((i = 0; i < k; i++)); do check "agent h$i exits with 0 (got $(mh_rc "$log" $i))" test "$(mh_rc "$log" $i)" = 0; done
    finish "$k"
    ;;
  collective_link_down)
    # h1's link goes down while every rank runs all_reduce in a loop: every rank on h0 and
    # h2 must fail with PeerFailed or Timeout within 2 x STRATA_TIMEOUT of the cut. The agent
    # timeout is longer, so the ranks' own detection is what is measured, then the launchers
    # stop the job on every host.
    linkdown_rank=$1
    mh_setup 3 || exit 1
    trap 'mh_cleanup; rm -rf "$log"' EXIT
    export STRATA_UCX_NET_DEVICES=${STRATA_UCX_NET_DEVICES:-eth0} STRATA_TIMEOUT=3s STRATA_AGENT_TIMEOUT=10s
    mh_start_agents "$strata" 1,2,2 "$log" --timeout 90s -- "$linkdown_rank" "$log/cut_time" 1
    sleep 4
    date +%s.%N >"$log/cut_time"
    mh_link_down 1
    check "all agents finish within 40 s" mh_wait_agents "$log" 3 40
    for i in 0 2; do
      check "agent h$i fails (got $(mh_rc "$log" $i))" test "$(mh_rc "$log" $i)" != 0
    done
    for r in 0 3 4; do
      h=$([[ $r == 0 ]] && echo 0 || echo 2)
      check "rank $r (h$h) fails with PeerFailed or Timeout within 6 s of the cut" \
        grep_in "$log/h$h.out" "^\[h$h:$r\] LINKDOWN-OK rank $r: "
    done
    check "no rank ran into a wrong result or a wrong error" bash -c "! grep -h LINKDOWN-BAD $log/h*.out"
    check "h0's launcher reports the failure" grep_in "$log/h0.err" "strata run: "
    finish 3
    ;;
  settings_mismatch)
    # h1's ranks run with one lane, h0's with the default four: bulk transfers would be cut
    # differently on the two sides, so the first connection between them refuses it, naming
    # both ranks' settings, and every rank fails at once instead of timing out.
    mh_setup 2 || exit 1
    trap 'mh_cleanup; rm -rf "$log"' EXIT
    export STRATA_UCX_NET_DEVICES=${STRATA_UCX_NET_DEVICES:-eth0} STRATA_TIMEOUT=30s
    start=$(date +%s.%N)
    # shellcheck disable=SC2016
    mh_start_agents "$strata" 1,1 "$log" --timeout 60s -- sh -c \
      '[ "$STRATA_HOST_ID" = mh-h1 ] && export STRATA_UCX_LANES=1; exec "$0" bench all_reduce --as-rank -b 1M -e 1M -q' \
      "$strata"
    check "all agents finish within 40 s" mh_wait_agents "$log" 2 40
    agents_fail_within 2 "$start" 15000 "15 s, long before STRATA_TIMEOUT"
    check "a rank names the mismatch" bash -c "cat $log/h*.out $log/h*.err | grep -q 'runs with data path tag, 1 lane(s).*every rank of a job must use the same STRATA_UCX_DATAPATH, STRATA_UCX_LANES'"
    # The failed call had posted its receives before the send that failed: they are cancelled
    # (UCX complains at exit about a request still held otherwise).
    check "no receive is left posted" bash -c "! cat $log/h*.out $log/h*.err | grep -q 'was not returned to mpool'"
    finish 2
    ;;
  options_mismatch)
    # Agents given different job-wide options (--ft on one only; --max-failures differing):
    # every agent names both sides in the rendezvous and fails within seconds, rather than one
    # of them reading as a lost host, or the job running on two failure budgets.
    train_dp=$1
    mh_setup 2 || exit 1
    trap 'mh_cleanup; rm -rf "$log"' EXIT
    export STRATA_UCX_NET_DEVICES=${STRATA_UCX_NET_DEVICES:-eth0}
    for variant in ft max_failures; do
      rm -f "$log"/h*
      if [[ $variant == ft ]]; then
        export MH_OPTS_H0="--ft" MH_OPTS_H1=""
        want="was started with (no --ft|--ft, --max-failures 3), this node with (no --ft|--ft, --max-failures 3)"
      else
        export MH_OPTS_H0="--ft --max-failures 1" MH_OPTS_H1="--ft --max-failures 5"
        want="was started with --ft, --max-failures [15], this node with --ft, --max-failures [15]"
      fi
      start=$(date +%s.%N)
      mh_start_agents "$strata" 1,1 "$log" --timeout 60s -- "$train_dp" --steps 4
      check "$variant: all agents finish within 30 s" mh_wait_agents "$log" 2 30
      agents_fail_within 2 "$start" 10000 "$variant: 10 s"
      check "$variant: node 0 names the differing options" grep -Eq "$want" "$log/h0.err"
    done
    unset MH_OPTS_H0 MH_OPTS_H1
    finish 2
    ;;
  ft)
    # Recovery across hosts (`strata run --ft --nnodes 2`), 2 hosts x 2 ranks of train_dp: a
    # failed rank is replaced on its own host while every other rank keeps its process, and
    # the final parameters are bit-identical to the same job without a failure.
    train_dp=$1
    mh_setup 2 || exit 1
    trap 'mh_cleanup; [[ -n ${MH_KEEP:-} ]] && echo "logs kept in $log" || rm -rf "$log"' EXIT
    # A longer agent timeout than --ft's default (0.75 s) where no host is lost: a loaded machine
    # must not mistake a slow agent for a lost one.
    export STRATA_UCX_NET_DEVICES=${STRATA_UCX_NET_DEVICES:-eth0} STRATA_TIMEOUT=${STRATA_TIMEOUT:-15s}
    export STRATA_AGENT_TIMEOUT=${STRATA_AGENT_TIMEOUT:-5s}
    # ft_job NAME [RUN OPTIONS] -- [TRAIN_DP OPTIONS]: one job, its logs under $log/NAME.
    ft_job() {
      local name=$1
      shift
      local -a run=()
      while [[ $# -gt 0 && $1 != -- ]]; do run+=("$1"); shift; done
      shift
      mkdir -p "$log/$name"
      mh_start_agents "$strata" 2,2 "$log/$name" --ft --timeout 60s "${run[@]}" -- "$train_dp" --steps 16 "$@"
      check "$name: both agents finish within 70 s" mh_wait_agents "$log/$name" 2 70
      for i in 0 1; do
        check "$name: agent h$i exits with 0 (got $(mh_rc "$log/$name" $i))" test "$(mh_rc "$log/$name" $i)" = 0
      done
    }
    hash_of() { sed -n 's/.*final params hash \([0-9a-f]*\) after.*/\1/p' "$log/$1/h0.out" | head -1; }
    pids_of() { grep -ho "START rank=$2 pid=[0-9]*" "$log/$1/h0.out" "$log/$1/h1.out" | sort -u; }
    same_hash() {
      local want got
      want=$(hash_of clean) got=$(hash_of "$1")
      check "$1: final parameters equal the run without failure ($got vs $want)" test -n "$want" -a "$got" = "$want"
    }
    # Every job's output when something failed (the cases above keep one job in $log).
    mh_show() {
      local d
      for d in "$1"/*/; do
        echo "==== job $(basename "$d")"
        mh_show_one "$d"
      done
    }
    mh_show_one() {
      local i
      for i in 0 1; do
        echo "---- h$i: exit $(mh_rc "$1" "$i")"
        sed 's/^/  out| /' "$1/h$i.out" 2>/dev/null
        sed 's/^/  err| /' "$1/h$i.err" 2>/dev/null
      done
    }

    ft_job clean --
    ft_job rank_on_h1 -- --fail 3:8 --times
    same_hash rank_on_h1
    check "rank_on_h1: h1's agent replaces rank 3 on h1" grep_in "$log/rank_on_h1/h1.err" "rank 3 on h1 (pid [0-9]*) was killed by signal 9 (SIGKILL); replacing it (epoch 1"
    check "rank_on_h1: h0 reports the recovery" grep_in "$log/rank_on_h1/h0.out" "recovered epoch 1 (replaced rank 3)"
    for r in 0 1 2; do
      check "rank_on_h1: rank $r keeps its process ($(pids_of rank_on_h1 $r | wc -l) pid(s))" test "$(pids_of rank_on_h1 $r | wc -l)" = 1
    done
    check "rank_on_h1: rank 3 is a new process" test "$(pids_of rank_on_h1 3 | wc -l)" = 2
    # A second rank, on the other host, dies as soon as the first recovery starts: the job
    # moves to epoch 2, which replaces both.
    ft_job during_recovery -- --fail 2:8 --fail-in-recovery 1
    same_hash during_recovery
    check "during_recovery: one recovery replaced both ranks" grep_in "$log/during_recovery/h0.out" "recovered epoch 2 (replaced rank 1,2)"
    # Hot spares on each host: the failed ranks go to spares of their own hosts.
    ft_job spares --spares 1 -- --fail 3:6 --fail 0:12 --pace 20
    same_hash spares
    check "spares: rank 3 goes to h1's spare" grep_in "$log/spares/h1.err" "rank 3 goes to spare 100000"
    check "spares: rank 0 goes to h0's spare" grep_in "$log/spares/h0.err" "rank 0 goes to spare 0"
    # Host h1 lost (its agent and both its ranks SIGKILLed) with no spare host: with --ft's
    # default agent timeout (0.75 s) every survivor gets an error naming the lost host and its
    # ranks, and exits, within 5 s.
    (
      unset STRATA_AGENT_TIMEOUT
      mkdir -p "$log/host_lost"
      mh_start_agents "$strata" 2,2 "$log/host_lost" --ft --timeout 60s -- "$train_dp" --steps 16 --fail 3:8:host --times
      mh_wait_agents "$log/host_lost" 2 70
    )
    check "host_lost: h0's agent fails (got $(mh_rc "$log/host_lost" 0))" test "$(mh_rc "$log/host_lost" 0)" != 0
    # The loss is when h1's agent died (its output dies with it, INJECT line included).
    check "host_lost: h1's agent was killed (got $(mh_rc "$log/host_lost" 1))" test "$(mh_rc "$log/host_lost" 1)" = 137
    took=$(ms_between "$(mh_end "$log/host_lost" 1)" "$(mh_end "$log/host_lost" 0)")
    check "host_lost: h0 is done within 5 s of the loss (took $took ms)" test "$took" -lt 5000
    for r in 0 1; do
      check "host_lost: rank $r gets an error naming h1 and its ranks" grep -q "^\[h0:$r\] rank $r: training failed: .*the job cannot recover: .*the agent of node 1 (h1) sent no heartbeat .*lost with it: ranks 2-3; no spare host is left" "$log/host_lost/h0.out" "$log/host_lost/h0.err"
    done
    finish 2
    ;;
  ft_store_lost)
    # Node 0 lost with the store it serves (the default: no --external-store), 2 hosts x 2
    # ranks under --ft: the job cannot go on. h1's agent must name the lost store and stop
    # its ranks, and h1 must be done within 5 s of the loss: no hang.
    train_dp=$1
    unset STRATA_AGENT_TIMEOUT  # --ft's default
    mh_setup 2 || exit 1
    trap 'mh_cleanup; [[ -n ${MH_KEEP:-} ]] && echo "logs kept in $log" || rm -rf "$log"' EXIT
    export STRATA_UCX_NET_DEVICES=${STRATA_UCX_NET_DEVICES:-eth0} STRATA_TIMEOUT=${STRATA_TIMEOUT:-15s}
    mh_start_agents "$strata" 2,2 "$log" --ft --timeout 60s -- "$train_dp" --steps 16 --pace 40 --fail 0:6:host
    check "both agents finish within 70 s" mh_wait_agents "$log" 2 70
    check "h0's agent was killed (got $(mh_rc "$log" 0))" test "$(mh_rc "$log" 0)" = 137
    check "h1's agent fails (got $(mh_rc "$log" 1))" test "$(mh_rc "$log" 1)" != 0 -a "$(mh_rc "$log" 1)" != none
    took=$(ms_between "$(mh_end "$log" 0)" "$(mh_end "$log" 1)")
    check "h1 is done within 5 s of the loss (took $took ms)" test "$took" -ge 0 -a "$took" -lt 5000
    check "h1's agent names the lost store" grep_in "$log/h1.err" "lost the store of node 0 at 10.77.0.1:$MH_STORE_PORT"
    check "h1's agent stops its ranks" grep_in "$log/h1.err" "stopping the 2 rank(s) on h1"
    finish 2
    ;;
  ft_spare_host)
    # A lost host's ranks start again on a spare host (`strata run --ft --spare`): h0 and h1
    # run the job (2 ranks each), h2 waits as a spare host. The final parameters must equal
    # the job's without a failure, and the recovery (detection included) take at most 2 s.
    train_dp=$1
    mh_setup 4 || exit 1  # h3 serves the store of the last job (--external-store)
    trap 'mh_cleanup; [[ -n ${MH_KEEP:-} ]] && echo "logs kept in $log" || rm -rf "$log"' EXIT
    export STRATA_UCX_NET_DEVICES=${STRATA_UCX_NET_DEVICES:-eth0} STRATA_TIMEOUT=${STRATA_TIMEOUT:-15s}
    MH_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
    export MH_TOKEN
    hash_of() { sed -n 's/.*final params hash \([0-9a-f]*\) after.*/\1/p' "$log/$1/h0.out" | head -1; }
    mh_show() {
      local d i
      for d in "$1"/*/; do
        echo "==== job $(basename "$d")"
        for i in 0 1 2 3; do
          [[ -e $d/h$i.out ]] || continue
          echo "---- h$i: exit $(mh_rc "$d" "$i")"
          sed 's/^/  out| /' "$d/h$i.out" 2>/dev/null
          sed 's/^/  err| /' "$d/h$i.err" 2>/dev/null
        done
      done
    }
    mkdir -p "$log/clean"
    STRATA_AGENT_TIMEOUT=5s mh_start_agents "$strata" 2,2 "$log/clean" --ft --timeout 60s -- "$train_dp" --steps 16
    check "clean: both agents finish" mh_wait_agents "$log/clean" 2 70
    # spare_job NAME [TRAIN_DP OPTIONS]: the job on h0, h1 and the spare host h2.
    spare_job() {
      local name=$1
      shift
      mkdir -p "$log/$name"
      mh_start_agents "$strata" 2,2 "$log/$name" --ft --timeout 60s -- "$train_dp" --steps 16 "$@"
      mh_start_spare "$strata" 2 "$log/$name" -n 2 --timeout 60s -- "$train_dp" --steps 16 "$@"
    }
    # ends_clean NAME K SPARE: h0 and spare host hSPARE (of the job's K agents) end with 0 and
    # the parameters of the run without a failure.
    ends_clean() {
      local name=$1 k=$2 spare=$3 i want got
      check "$name: h0 and the spare host h$spare finish within 70 s" mh_wait_agents "$log/$name" "$k" 70
      for i in 0 "$spare"; do
        check "$name: agent h$i exits with 0 (got $(mh_rc "$log/$name" "$i"))" test "$(mh_rc "$log/$name" "$i")" = 0
      done
      want=$(hash_of clean) got=$(hash_of "$name")
      check "$name: final parameters equal the run without failure ($got vs $want)" test -n "$want" -a "$got" = "$want"
    }
    spare_done() {
      local name=$1
      ends_clean "$name" 3 2
      check "$name: h0 hands node 1's ranks to the spare host" grep_in "$log/$name/h0.err" "node 1 lost: the agent of node 1 (h1) sent no heartbeat .*lost with it: ranks 2-3; its ranks start again on spare host h2 (epoch 1"
      check "$name: the spare host takes them" grep_in "$log/$name/h2.err" "spare host h2 takes node 1's ranks 2-3 in epoch 1"
      check "$name: rank 0 reports the recovery" grep_in "$log/$name/h0.out" "recovered epoch 1 (replaced rank 2,3)"
      if [[ ${2:-} != timed ]]; then
        # The RTO counts from the injected failure, which a link cut has not: no time is made up.
        check "$name: rank 0 reports no RTO for a failure it did not inject" grep_in "$log/$name/h0.out" "recovered epoch 1 (replaced rank 2,3): the failure came from outside this program"
        return 0
      fi
      rto=$(sed -n 's/.*recovered epoch 1 (replaced rank 2,3): detection [0-9.]* ms, RTO \([0-9]*\).*/\1/p' "$log/$name/h0.out")
      check "$name: RTO at most 2 s (got ${rto:-none} ms)" test -n "$rto" -a "${rto:-9999}" -le 2000
    }
    # The whole host h1 SIGKILLed at step 6 (its agent and both ranks).
    spare_job host_killed --fail 3:6:host --pace 40
    spare_done host_killed timed
    # h1's link taken down while the job runs (16 steps of 200 ms): h1's agent loses the store
    # and stops its ranks, h0 misses h1's beats and gives its ranks to the spare host.
    spare_job link_down --pace 200
    sleep 1.5
    mh_link_down 1
    spare_done link_down
    mh_link_up 1
    # two_spares NAME [RUN OPTIONS]: the job on h0 and h1 (16 steps of 300 ms), spare hosts
    # waiting on h2, then h3 (in that order, so h2 is the first one claimed).
    in_err() { grep -q "$3" "$log/$1/h$2.err" 2>/dev/null; }
    two_spares() {
      local name=$1 i
      shift
      mkdir -p "$log/$name"
      mh_start_agents "$strata" 2,2 "$log/$name" --ft "$@" --timeout 60s -- "$train_dp" --steps 16 --pace 300
      for i in 2 3; do
        mh_start_spare "$strata" "$i" "$log/$name" -n 2 --timeout 60s -- "$train_dp" --steps 16 --pace 300
        for _ in $(seq 100); do in_err "$name" "$i" "spare host h$i waits at the store" && break; sleep 0.05; done
        sleep 0.2
      done
    }
    # A spare host that dies while it waits is skipped: h2 is SIGKILLed, then the whole host
    # h1: its ranks go to h3, and h0 names h2 as skipped.
    two_spares dead_spare
    mh_kill_in "$(mh_host_ns 2)"
    sleep 0.3
    mh_kill_in "$(mh_host_ns 1)"
    ends_clean dead_spare 4 3
    check "dead_spare: h0 skips the dead spare host h2 and hands node 1's ranks to h3" grep_in "$log/dead_spare/h0.err" "node 1 lost: .*lost with it: ranks 2-3; spare host(s) h2 (no heartbeat for [0-9.]* s) skipped: dead or cut off; its ranks start again on spare host h3 (epoch 1"
    check "dead_spare: the spare host h3 takes them" grep_in "$log/dead_spare/h3.err" "spare host h3 takes node 1's ranks 2-3 in epoch 1"
    # A spare host that dies as soon as it was given the lost host's ranks: the node is watched
    # afresh, found silent again, and its ranks go to the next spare host (h3) in epoch 2.
    # Two losses of 2 ranks each: 4 failures, above --max-failures' default of 3.
    two_spares dead_assigned --max-failures 4
    mh_kill_in "$(mh_host_ns 1)"
    for _ in $(seq 200); do in_err dead_assigned 2 "spare host h2 takes node 1" && break; sleep 0.01; done
    mh_kill_in "$(mh_host_ns 2)"
    ends_clean dead_assigned 4 3
    check "dead_assigned: h0 hands node 1's ranks to h2, then to h3" grep_in "$log/dead_assigned/h0.err" "node 1 lost: the agent of node 1 (h2) sent no heartbeat .*its ranks start again on spare host h3 (epoch 2"
    # The store outside the job (`strata store` on h3, --external-store everywhere): node 0
    # itself is lost, and its ranks start again on the spare host; h1's agent handles it.
    MH_STORE_ADDR=$(mh_start_store "$strata" 3)
    export MH_STORE_ADDR
    sleep 0.3
    mkdir -p "$log/node0_lost"
    mh_start_agents "$strata" 2,2 "$log/node0_lost" --ft --external-store --timeout 60s -- "$train_dp" --steps 16 --pace 40 --fail 0:6:host
    mh_start_spare "$strata" 2 "$log/node0_lost" --external-store -n 2 --timeout 60s -- "$train_dp" --steps 16 --pace 40 --fail 0:6:host
    check "node0_lost: h1 and the spare host finish within 70 s" mh_wait_agents "$log/node0_lost" 3 70
    for i in 1 2; do
      check "node0_lost: agent h$i exits with 0 (got $(mh_rc "$log/node0_lost" $i))" test "$(mh_rc "$log/node0_lost" $i)" = 0
    done
    got=$(sed -n 's/.*final params hash \([0-9a-f]*\) after.*/\1/p' "$log/node0_lost/h2.out" | head -1)
    check "node0_lost: final parameters (from the new rank 0 on h2) equal the run without failure ($got vs $(hash_of clean))" test -n "$got" -a "$got" = "$(hash_of clean)"
    check "node0_lost: h1 hands node 0's ranks to the spare host" grep_in "$log/node0_lost/h1.err" "node 0 lost: the agent of node 0 (h0) sent no heartbeat .*lost with it: ranks 0-1; its ranks start again on spare host h2 (epoch 1"
    # fresh_store: a new `strata store` on h3 (the last job's keys would mislead the next).
    fresh_store() {
      mh_kill_in "$(mh_host_ns 3)"
      sleep 0.3
      MH_STORE_ADDR=$(mh_start_store "$strata" 3)
      sleep 0.3
    }
    # The external store itself lost mid-job: the agents name it, not node 0, and fail.
    fresh_store
    mkdir -p "$log/ext_store_lost"
    mh_start_agents "$strata" 2,2 "$log/ext_store_lost" --ft --external-store --timeout 60s -- "$train_dp" --steps 16 --pace 300
    sleep 1.5
    mh_kill_in "$(mh_host_ns 3)"
    check "ext_store_lost: both agents end within 30 s" mh_wait_agents "$log/ext_store_lost" 2 30
    for i in 0 1; do
      check "ext_store_lost: agent h$i fails (got $(mh_rc "$log/ext_store_lost" $i))" test "$(mh_rc "$log/ext_store_lost" $i)" != 0
    done
    check "ext_store_lost: h1 names the lost store, not node 0" grep_in "$log/ext_store_lost/h1.err" "lost the job's store (strata store) at $MH_STORE_ADDR .*the store is down or this host is cut off"
    # A spare host started with the wrong -n is refused when it is needed: the job fails, and so
    # does the spare host, with the reason (it had exited 0, "not needed").
    fresh_store
    mkdir -p "$log/wrong_n"
    mh_start_agents "$strata" 2,2 "$log/wrong_n" --ft --external-store --timeout 60s -- "$train_dp" --steps 16 --pace 300
    mh_start_spare "$strata" 2 "$log/wrong_n" --external-store -n 1 --timeout 60s -- "$train_dp" --steps 16 --pace 300
    for _ in $(seq 100); do grep -q "spare host h2 waits at the store" "$log/wrong_n/h2.err" 2>/dev/null && break; sleep 0.05; done
    sleep 0.5
    mh_kill_in "$(mh_host_ns 1)"
    check "wrong_n: h0 and the spare host end within 30 s" mh_wait_agents "$log/wrong_n" 3 30
    check "wrong_n: the spare host fails (got $(mh_rc "$log/wrong_n" 2))" test "$(mh_rc "$log/wrong_n" 2)" != 0
    check "wrong_n: the spare host says why" grep_in "$log/wrong_n/h2.err" "spare host h2 was refused by the job: it runs 1 rank(s) (strata run -n) where node 1 had 2"
    mh_kill_in "$(mh_host_ns 3)"
    finish 3
    ;;
  moe_serve)
    # examples/moe_serve, tiny, on 2 hosts x 2 ranks, every path: relay (k ascending) must
    # give the bits of the same 4 ranks on one host; strata (the Buffer's per-host sums) must
    # match the example's reference summed in that order (--check), and differ from relay's
    # bits, which shows that its rows took the cross-host combine.
    moe_serve=$1
    tiny=(--layers 2 --hidden 64 --ffn 32 --experts 4 --topk 2 --prompt 16 --decode-steps 3 --decode-tokens 2
      --requests 2 --warmup 1)
    sum_of() { awk -v p="$1" '{ sub(/^\[[^]]*\] /, "") } $1 == p && $2 == 4 && NF == 7 { print $7 }' "$2" | head -1; }
    "$strata" run -n 4 --timeout 120s -- "$moe_serve" --path relay "${tiny[@]}" >"$log/one_host.out" 2>&1
    one=$(sum_of relay "$log/one_host.out")
    check "one host: relay at 4 ranks gives a checksum ($(tail -1 "$log/one_host.out"))" test -n "$one"
    mh_setup 2 || exit 1
    trap 'mh_cleanup; rm -rf "$log"' EXIT
    export STRATA_UCX_NET_DEVICES=${STRATA_UCX_NET_DEVICES:-eth0} STRATA_TIMEOUT=${STRATA_TIMEOUT:-30s}
    mh_start_agents "$strata" 2,2 "$log" --timeout 150s -- "$moe_serve" --path all "${tiny[@]}" --check --expect "$one"
    check "both agents finish within 160 s" mh_wait_agents "$log" 2 160
    for i in 0 1; do check "agent h$i exits with 0 (got $(mh_rc "$log" $i))" test "$(mh_rc "$log" $i)" = 0; done
    relay=$(sum_of relay "$log/h0.out") strata_sum=$(sum_of strata "$log/h0.out")
    check "across hosts: relay's checksum equals one host's ($relay vs $one)" test -n "$one" -a "$relay" = "$one"
    check "across hosts: strata's per-host sums differ from k order ($strata_sum vs $relay)" \
      test -n "$strata_sum" -a "$strata_sum" != "$relay"
    check "every path matches the reference" grep_in "$log/h0.out" \
      "^\[h0:0\] moe_serve: across hosts: strata sums per host.*(and matches the single-process reference)"
    finish 2
    ;;
  *)
    echo "unknown case '$case'" >&2
    exit 2
    ;;
esac
