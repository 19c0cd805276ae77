# Network namespaces as hosts, for multi-host tests and benches on one machine (bash, root).
# Source it, then:
#
#   mh_require                  exit 77 (ctest's SKIP_RETURN_CODE) with a reason when
#                               not root, or namespaces / veth / bridges are unavailable
#   mh_setup K                  K "hosts" h0..h(K-1), each a namespace with lo up and one
#                               veth (eth0, 10.77.0.(i+1)/24) plugged into a bridge; the
#                               bridge lives in a "switch" namespace of its own, so the
#                               machine's own network namespace is never touched
#   mh_exec I CMD...            runs CMD in host I with its own UTS namespace whose
#                               hostname is h<I> (Open MPI's shared-memory BTL and the
#                               launcher's output prefixes tell hosts apart by hostname)
#   mh_link_down I / mh_link_up I
#                               takes host I's link down (its eth0) or up again
#   mh_mpirun K PER_HOST DIR TIMEOUT_S [mpirun options] -- PROGRAM [ARGS...]
#                               Open MPI's mpirun from h0 over hosts h0..h(K-1), PER_HOST
#                               ranks each (daemons started by mpi_rsh_agent.sh)
#   mh_cleanup                  kills what still runs in the namespaces and deletes them,
#                               which deletes the veths and the bridge with them
#
# mh_setup installs an EXIT/INT/TERM/HUP trap that calls mh_cleanup, so the namespaces go
# even when the test fails, times out (ctest sends SIGTERM... or SIGKILL: hence also the
# sweep of namespaces left by dead earlier runs in mh_setup) or is interrupted. Names carry
# the PID of the shell that made them: two runs at once (ctest -j) never collide, and each
# run has its own bridge, so both can use the same test subnet.

MH_SUBNET=${MH_SUBNET:-10.77.0}
MH_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MH_PREFIX=strmh
MH_TAG="${MH_PREFIX}$$"
MH_HOSTS=()
MH_SWITCH=""

mh_skip() {
  echo "SKIP: $*" >&2
  exit 77
}

mh_require() {
  [[ $(id -u) -eq 0 ]] || mh_skip "multi-host tests need root (network namespaces); run as root"
  command -v ip >/dev/null || mh_skip "'ip' (iproute2) is not installed"
  command -v unshare >/dev/null || mh_skip "'unshare' (util-linux) is not installed"
  local probe="${MH_TAG}probe"
  if ! ip netns add "$probe" 2>/dev/null; then
    mh_skip "cannot create network namespaces here (ip netns add failed: no CAP_SYS_ADMIN, or a restricted container)"
  fi
  local ok=1
  ip -n "$probe" link add mhv0 type veth peer name mhv1 2>/dev/null || ok=0
  ip -n "$probe" link add mhbr type bridge 2>/dev/null || ok=0
  unshare --uts true 2>/dev/null || ok=0
  ip netns del "$probe" 2>/dev/null
  [[ $ok -eq 1 ]] || mh_skip "veth pairs, bridges or UTS namespaces are not available in this kernel/container"
}

# Namespaces of earlier runs whose shell is gone (killed by a ctest timeout before its trap
# could run). Only names this library makes are touched.
mh_sweep_stale() {
  local ns pid
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
    [[ $ns =~ ^${MH_PREFIX}([0-9]+) ]] || continue
    pid=${BASH_REMATCH[1]}
    [[ $pid == "$$" ]] && continue
    kill -0 "$pid" 2>/dev/null && continue
    mh_kill_in "$ns"
    ip netns del "$ns" 2>/dev/null || true
  done
}

mh_kill_in() {
  local pids
  pids=$(ip netns pids "$1" 2>/dev/null || true)
  # shellcheck disable=SC2086
  [[ -n $pids ]] && kill -KILL $pids 2>/dev/null
  return 0
}

mh_cleanup() {
  local ns
  for ns in "${MH_HOSTS[@]}" $MH_SWITCH; do mh_kill_in "$ns"; done
  # A killed process leaves its namespace only once it is reaped; give them a moment, or
  # the namespace (and its veth) outlives `ip netns del` until they are.
  local i
  for i in 1 2 3 4 5 6 7 8 9 10; do
    local busy=0
    for ns in "${MH_HOSTS[@]}" $MH_SWITCH; do [[ -n $(ip netns pids "$ns" 2>/dev/null) ]] && busy=1; done
    [[ $busy -eq 0 ]] && break
    sleep 0.1
  done
  for ns in "${MH_HOSTS[@]}" $MH_SWITCH; do ip netns del "$ns" 2>/dev/null || true; done
  rm -rf "/tmp/strata-$MH_TAG-h"* 2>/dev/null
  MH_HOSTS=()
  MH_SWITCH=""
}

mh_host_ns() { echo "${MH_HOSTS[$1]}"; }
mh_addr() { echo "${MH_SUBNET}.$(($1 + 1))"; }

mh_setup() {
  local k=$1 i ns
  trap 'mh_cleanup' EXIT
  trap 'mh_cleanup; exit 130' INT
  trap 'mh_cleanup; exit 143' TERM
  trap 'mh_cleanup; exit 129' HUP
  mh_sweep_stale
  MH_SWITCH="${MH_TAG}sw"
  ip netns add "$MH_SWITCH"
  # No STP and no forwarding delay: ports forward as soon as they are up.
  ip -n "$MH_SWITCH" link add br0 type bridge forward_delay 0 stp_state 0
  ip -n "$MH_SWITCH" link set br0 up
  ip -n "$MH_SWITCH" link set lo up
  for ((i = 0; i < k; i++)); do
    ns="${MH_TAG}h$i"
    MH_HOSTS+=("$ns")
    ip netns add "$ns"
    # Both ends are made in the switch namespace, then one end moves to the host: no
    # interface ever appears in the machine's own namespace.
    ip -n "$MH_SWITCH" link add "p$i" type veth peer name "eth0-h$i"
    ip -n "$MH_SWITCH" link set "eth0-h$i" netns "$ns"
    ip -n "$ns" link set "eth0-h$i" name eth0
    ip -n "$MH_SWITCH" link set "p$i" master br0
    ip -n "$MH_SWITCH" link set "p$i" up
    ip -n "$ns" addr add "$(mh_addr "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
  done
  # The bridge forwards once its ports are up; wait until each host answers ARP for its
  # neighbours (there is no ping: a TCP connect to a closed port gets a RST once L2 works).
  for ((i = 1; i < k; i++)); do
    local tries=0 out
    while true; do
      out=$(ip netns exec "${MH_HOSTS[0]}" bash -c "exec 3<>/dev/tcp/$(mh_addr "$i")/9" 2>&1)
      [[ $out == *refused* ]] && break
      tries=$((tries + 1))
      if [[ $tries -gt 50 ]]; then
        echo "mh_setup: host h$i ($(mh_addr "$i")) is not reachable from h0 after 5 s" >&2
        return 1
      fi
      sleep 0.1
    done
  done
}

mh_exec() {
  local i=$1
  shift
  ip netns exec "${MH_HOSTS[$i]}" unshare --uts sh -c 'hostname "$0" && exec "$@"' "h$i" "$@"
}

mh_link_down() { ip -n "${MH_HOSTS[$1]}" link set eth0 down; }
mh_link_up() { ip -n "${MH_HOSTS[$1]}" link set eth0 up; }

# mh_start_agents STRATA COUNTS LOGDIR [strata run options...] -- PROGRAM [ARGS...]
#   One `strata run` agent per host: COUNTS is the ranks per host, e.g. "1,2,2" for three
#   hosts. Host I gets STRATA_HOST_ID=mh-h<I>; node 0 serves the store on h0's address.
#   Each agent's stdout/stderr go to LOGDIR/h<I>.out/.err; when it exits, LOGDIR/h<I>.rc
#   gets "<exit status> <epoch seconds>".
MH_STORE_PORT=${MH_STORE_PORT:-29400}
mh_start_agents() {
  local strata=$1 counts=$2 log=$3
  shift 3
  local -a run_opts=()
  while [[ $# -gt 0 && $1 != -- ]]; do run_opts+=("$1"); shift; done
  [[ ${1:-} == -- ]] && shift
  local -a n
  IFS=, read -r -a n <<<"$counts"
  local token=${MH_TOKEN:-}
  [[ -n $token ]] || token=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
  local i extra
  for ((i = 0; i < ${#n[@]}; i++)); do
    rm -f "$log/h$i.rc"
    # MH_OPTS_H<i>: more options for host i's agent alone (words split on blanks).
    extra="MH_OPTS_H$i"
    (
      rc=0
      # shellcheck disable=SC2086
      STRATA_HOST_ID="mh-h$i" STRATA_JOB_TOKEN="$token" STRATA_SOCKET_DIR="$(mh_socket_dir "$i")" mh_exec "$i" "$strata" run \
        --nnodes "${#n[@]}" --node-rank "$i" --store "${MH_STORE_ADDR:-$(mh_addr 0):$MH_STORE_PORT}" -n "${n[$i]}" \
        ${!extra:-} "${run_opts[@]}" -- "$@" >"$log/h$i.out" 2>"$log/h$i.err" </dev/null || rc=$?
      echo "$rc $(date +%s.%N)" >"$log/h$i.rc"
    ) &
  done
}

# MH_STORE_ADDR (ADDR:PORT), when set, is where the agents find the job's store instead of
# node 0 (with --external-store: `strata store` runs there, see mh_start_store).
#
# mh_start_store STRATA I: in the background, `strata store` on host I at its address and
# MH_STORE_PORT, with token MH_TOKEN; prints the ADDR:PORT to put in MH_STORE_ADDR.
mh_start_store() {
  local strata=$1 i=$2
  STRATA_JOB_TOKEN="$MH_TOKEN" mh_exec "$i" "$strata" store --host "$(mh_addr "$i")" --port "$MH_STORE_PORT" \
    >/dev/null 2>&1 </dev/null &
  echo "$(mh_addr "$i"):$MH_STORE_PORT"
}

# mh_socket_dir I: host I's heap socket directory. The namespaces share the machine's /tmp,
# real hosts do not: a rank cut off on one "host" must not hold the name its replacement on
# another binds.
mh_socket_dir() { echo "/tmp/strata-$MH_TAG-h$1"; }

# mh_start_spare STRATA I LOGDIR [RUN OPTIONS] -- PROGRAM [ARGS...]: in the background, a
# spare host agent (`strata run --ft --spare`) on host I for the job whose store node 0 serves,
# output in LOGDIR/hI.{out,err}, exit status in LOGDIR/hI.rc. The job's agents must share its
# token: set MH_TOKEN for both calls.
mh_start_spare() {
  local strata=$1 i=$2 log=$3
  shift 3
  local -a run_opts=()
  while [[ $# -gt 0 && $1 != -- ]]; do run_opts+=("$1"); shift; done
  [[ ${1:-} == -- ]] && shift
  rm -f "$log/h$i.rc"
  (
    rc=0
    STRATA_HOST_ID="mh-h$i" STRATA_JOB_TOKEN="$MH_TOKEN" STRATA_SOCKET_DIR="$(mh_socket_dir "$i")" mh_exec "$i" "$strata" run --ft --spare \
      --store "${MH_STORE_ADDR:-$(mh_addr 0):$MH_STORE_PORT}" "${run_opts[@]}" -- "$@" >"$log/h$i.out" 2>"$log/h$i.err" </dev/null || rc=$?
    echo "$rc $(date +%s.%N)" >"$log/h$i.rc"
  ) &
}

# mh_wait_agents LOGDIR K TIMEOUT_S: waits for the K agents' .rc files; 1 after the timeout.
mh_wait_agents() {
  local log=$1 k=$2 limit=$3 i
  local end=$((SECONDS + limit))
  while [[ $SECONDS -lt $end ]]; do
    local all=1
    for ((i = 0; i < k; i++)); do [[ -s $log/h$i.rc ]] || all=0; done
    [[ $all -eq 1 ]] && return 0
    sleep 0.05
  done
  return 1
}

# mh_rc LOGDIR I / mh_end LOGDIR I: an agent's exit status / end time (epoch seconds).
mh_rc() { awk '{print $1}' "$1/h$2.rc" 2>/dev/null || echo none; }
mh_end() { awk '{print $2}' "$1/h$2.rc" 2>/dev/null || echo 0; }

# mh_mpirun K PER_HOST DIR TIMEOUT_S [mpirun options] -- PROGRAM [ARGS...]
#   mpirun from h0, K*PER_HOST ranks placed host by host (--map-by slot over a hostfile in
#   DIR); its daemons start in the namespaces through mpi_rsh_agent.sh. TCP between hosts on
#   the test subnet only, vader within a host; ranks yield when idle (they outnumber the cores).
mh_mpirun() {
  local k=$1 per=$2 dir=$3 limit=$4 i map=""
  shift 4
  local -a opts=()
  while [[ $# -gt 0 && $1 != -- ]]; do opts+=("$1"); shift; done
  [[ ${1:-} == -- ]] && shift
  for ((i = 0; i < k; i++)); do echo "$(mh_addr $i) slots=$per"; done >"$dir/hostfile"
  for ((i = 0; i < k; i++)); do map+="$(mh_addr $i)=$(mh_host_ns $i)=h$i "; done
  local subnet="${MH_SUBNET}.0/24"
  MH_NETNS_MAP=$map mh_exec 0 timeout "$limit" mpirun --allow-run-as-root --oversubscribe -np $((k * per)) \
    --hostfile "$dir/hostfile" --map-by slot --mca plm_rsh_agent "$MH_LIB_DIR/mpi_rsh_agent.sh" \
    --mca mpi_yield_when_idle 1 --mca btl tcp,vader,self --mca btl_tcp_if_include "$subnet" \
    --mca oob_tcp_if_include "$subnet" "${opts[@]}" "$@"
}

# mh_show LOGDIR K: every agent's output, for a failing test's log.
mh_show() {
  local log=$1 k=$2 i
  for ((i = 0; i < k; i++)); do
    echo "---- h$i: exit $(mh_rc "$log" "$i")"
    sed 's/^/  out| /' "$log/h$i.out" 2>/dev/null
    sed 's/^/  err| /' "$log/h$i.err" 2>/dev/null
  done
}
