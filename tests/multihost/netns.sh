#!/usr/bin/env bash
# Runs a Strata job across "hosts" made of network namespaces on this machine (root).
#
#   tests/multihost/netns.sh [--hosts 2,2] [--timeout 120] [--cut I@SECONDS] [--strata PATH]
#                            [--log DIR] [-- strata run options] -- PROGRAM [ARGS...]
#
# --hosts C0,C1,...  ranks per host (one namespace and one `strata run` agent each);
#                    default 2,2
# --timeout S        kill everything after S seconds (exit 124)
# --cut I@S          take host I's link down S seconds after the agents start (the time
#                    it happened, epoch seconds, goes to LOGDIR/cut_time)
# --strata PATH      the strata binary (default: build/strata of this checkout)
# --log DIR          keep the agents' output there (default: a temporary directory,
#                    removed at exit)
# --run-opt OPT      one extra `strata run` option (repeatable), e.g. --run-opt --timeout=60s
#
# Prints every agent's output and exits with 0 when all agents exited with 0, else with the
# first non-zero status in node order. Namespaces, veths and the bridge are removed at exit,
# whatever happens. Exits with 77 when namespaces are not available (not root, container).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=netns_lib.sh
source "$here/netns_lib.sh"

hosts=2,2
limit=120
cut=""
strata="$here/../../build/strata"
log=""
run_opts=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --hosts) hosts=$2; shift 2 ;;
    --timeout) limit=$2; shift 2 ;;
    --cut) cut=$2; shift 2 ;;
    --strata) strata=$2; shift 2 ;;
    --log) log=$2; shift 2 ;;
    --run-opt) run_opts+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    *) echo "netns.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
[[ $# -gt 0 ]] || { echo "netns.sh: missing the program to run (after --)" >&2; exit 2; }
[[ $hosts =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || { echo "netns.sh: --hosts must look like 2,2 or 1,2,2" >&2; exit 2; }
[[ -x $strata ]] || { echo "netns.sh: $strata is not an executable (build first, or pass --strata)" >&2; exit 2; }
[[ $limit =~ ^[0-9]+$ ]] || { echo "netns.sh: --timeout takes whole seconds" >&2; exit 2; }
cut_host="" cut_after=""
if [[ -n $cut ]]; then
  [[ $cut =~ ^([0-9]+)@([0-9.]+)$ ]] || { echo "netns.sh: --cut takes HOST@SECONDS, e.g. 1@2.5" >&2; exit 2; }
  cut_host=${BASH_REMATCH[1]} cut_after=${BASH_REMATCH[2]}
fi
strata=$(cd "$(dirname "$strata")" && pwd)/$(basename "$strata")

IFS=, read -r -a counts <<<"$hosts"
k=${#counts[@]}
[[ -z $cut_host || $cut_host -lt $k ]] || { echo "netns.sh: --cut host $cut_host does not exist (hosts 0-$((k - 1)))" >&2; exit 2; }

mh_require
own_log=0
if [[ -z $log ]]; then
  log=$(mktemp -d /tmp/strata-netns.XXXXXX)
  own_log=1
fi
mkdir -p "$log"
mh_setup "$k" || exit 1
# mh_setup's trap, plus our temporary directory.
trap 'mh_cleanup; [[ $own_log -eq 1 ]] && rm -rf "$log"' EXIT

mh_start_agents "$strata" "$hosts" "$log" "${run_opts[@]}" -- "$@"
if [[ -n $cut_host ]]; then
  (
    sleep "$cut_after"
    date +%s.%N >"$log/cut_time"
    mh_link_down "$cut_host"
    echo "netns.sh: took host h$cut_host's link down" >&2
  ) &
fi
rc=0
if ! mh_wait_agents "$log" "$k" "$limit"; then
  echo "netns.sh: the job did not finish within $limit s; killing it" >&2
  rc=124
fi
mh_show "$log" "$k"
if [[ $rc -eq 0 ]]; then
  for ((i = 0; i < k; i++)); do
    r=$(mh_rc "$log" "$i")
    if [[ $r != 0 ]]; then rc=$r; break; fi
  done
fi
exit "$rc"
