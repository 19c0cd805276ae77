#!/usr/bin/env bash
# Slurm: a one-node cluster started here (Debian's slurmctld and slurmd, auth/none, root), then
#   srun -n 4 PROBE              ranks from SLURM_PROCID/SLURM_NTASKS, meeting at a `strata store`
#   salloc -n 4 strata run ...   strata run inside an allocation (its own store)
set -euo pipefail
source "$(dirname "$0")/common.sh"

for t in slurmctld slurmd srun salloc; do
  command -v $t >/dev/null || skip "$t is not installed (Debian: apt-get install slurmctld slurmd slurm-client)"
done
[[ $(id -u) -eq 0 ]] || skip "starting slurmd needs root"
plugins=$(dirname "$(find /usr/lib /usr/lib64 -name auth_none.so -path '*slurm*' 2>/dev/null | head -n 1)")
[[ $plugins != . ]] || skip "Slurm's auth/none plugin is not installed"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
host=$(hostname -s)
cpus=$(nproc)
((cpus >= 4)) || cpus=4  # 4 tasks on a smaller machine: slurmd accepts the count (config_overrides)
mkdir -p "$WORK/state" "$WORK/spool"
export SLURM_CONF=$WORK/slurm.conf
cat >"$SLURM_CONF" <<CONF
ClusterName=stratatest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$WORK/state
SlurmdSpoolDir=$WORK/spool
SlurmctldPidFile=$WORK/slurmctld.pid
SlurmdPidFile=$WORK/slurmd.pid
SlurmctldLogFile=$WORK/slurmctld.log
SlurmdLogFile=$WORK/slurmd.log
PluginDir=$plugins
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/linear
SchedulerType=sched/builtin
MpiDefault=none
SwitchType=switch/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SlurmdParameters=config_overrides
ReturnToService=2
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=strata Nodes=$host Default=YES MaxTime=10 State=UP
CONF

CTLD_PID= SLURMD_PID=
cleanup() {
  [[ -n $SLURMD_PID ]] && kill "$SLURMD_PID" 2>/dev/null && wait "$SLURMD_PID" 2>/dev/null
  [[ -n $CTLD_PID ]] && kill "$CTLD_PID" 2>/dev/null && wait "$CTLD_PID" 2>/dev/null
  cleanup_common
}
trap cleanup EXIT
slurmctld -D -i -f "$SLURM_CONF" >"$WORK/slurmctld.out" 2>&1 &
CTLD_PID=$!
slurmd -D -f "$SLURM_CONF" -N "$host" >"$WORK/slurmd.out" 2>&1 &
SLURMD_PID=$!
up=0
for i in $(seq 150); do
  if grep -qE '^(idle|mixed|allocated)' <<<"$(sinfo -h -N -o '%T' 2>/dev/null || true)"; then
    up=1
    break
  fi
  kill -0 $CTLD_PID 2>/dev/null && kill -0 $SLURMD_PID 2>/dev/null || break
  sleep 0.2
done
if ((!up)); then
  echo "slurmctld:"; tail -n 20 "$WORK/slurmctld.log" "$WORK/slurmctld.out" 2>/dev/null || true
  echo "slurmd:"; tail -n 20 "$WORK/slurmd.log" "$WORK/slurmd.out" 2>/dev/null || true
  skip "the test's Slurm cluster did not come up (logs above)"
fi
echo "--- Slurm $(srun --version | awk '{print $2}') up: node $host, $cpus CPUs"

start_store
run_case srun 4 srun -n 4 "$PROBE" 4
# strata run serves its own store; the test's is not wanted here.
unset STRATA_STORE STRATA_JOB_TOKEN
run_case salloc 4 salloc -n 4 "$STRATA_BIN" run -n 4 "$PROBE" 4
