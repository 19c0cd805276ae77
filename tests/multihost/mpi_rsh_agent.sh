#!/bin/sh
# Open MPI's "rsh agent" for hosts that are network namespaces on this machine (see
# netns_lib.sh): mpirun calls it as `AGENT [rsh options] HOST COMMAND...` to start its daemon
# on HOST. HOST is a test address (10.77.0.X) or a name hN; the agent runs COMMAND in that
# namespace, under a UTS namespace of its own whose hostname is hN: Open MPI tells hosts apart
# by hostname, and its shared-memory BTL crashes when two "hosts" share one.
#
# MH_NETNS_MAP (set by the caller): "ADDR=NAMESPACE=hN ..." for every host.
while [ $# -gt 0 ]; do
  case $1 in
    -l | -p | -o | -i | -F) shift 2 ;;  # ssh options with a value
    -*) shift ;;
    *) break ;;
  esac
done
host=$1
shift
for entry in $MH_NETNS_MAP; do
  addr=${entry%%=*}
  rest=${entry#*=}
  ns=${rest%%=*}
  name=${rest#*=}
  if [ "$host" = "$addr" ] || [ "$host" = "$name" ]; then
    # Like ssh, the remote side gets one command line for a shell.
    exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$1"; shift; exec sh -c "$*"' sh "$name" "$@"
  fi
done
echo "mpi_rsh_agent: no test namespace for host '$host' (MH_NETNS_MAP='$MH_NETNS_MAP')" >&2
exit 255
