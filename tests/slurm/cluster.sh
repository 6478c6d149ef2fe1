#!/usr/bin/env bash
# A real single-node Slurm for the tests: munged, slurmctld and slurmd from Debian's slurm-wlm, with every file
# under one work folder and every daemon stopped by PID.
#   cluster.sh start <work-dir>   prints the SLURM_CONF to export
#   cluster.sh stop <work-dir>
set -u
cmd=$1; W=$(realpath -m "$2")
stop() {
  for d in slurmd slurmctld munged; do
    if [ -f "$W/$d.pid" ]; then kill "$(cat "$W/$d.pid")" 2>/dev/null; fi
  done
  sleep 1
  for d in slurmd slurmctld munged; do
    if [ -f "$W/$d.pid" ] && kill -0 "$(cat "$W/$d.pid")" 2>/dev/null; then kill -9 "$(cat "$W/$d.pid")" 2>/dev/null; fi
    rm -f "$W/$d.pid"
  done
}
if [ "$cmd" = stop ]; then stop; exit 0; fi

stop
rm -rf "$W"; mkdir -p "$W/state" "$W/spool" "$W/munge"
host=$(hostname -s); cpus=$(nproc)
# Our own key, socket and ports: nothing of a site installation is touched.
dd if=/dev/urandom of="$W/munge/munge.key" bs=1024 count=1 status=none; chmod 600 "$W/munge/munge.key"
munged --force --socket="$W/munge/socket" --key-file="$W/munge/munge.key" --pid-file="$W/munged.pid" \
       --log-file="$W/munge/munged.log" --seed-file="$W/munge/seed" || { echo "munged failed" >&2; exit 1; }
cat > "$W/slurm.conf" <<CONF
ClusterName=fsdpp-test
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$W/munge/socket
CredType=cred/munge
SlurmctldPort=16817
SlurmdPort=16818
StateSaveLocation=$W/state
SlurmdSpoolDir=$W/spool
SlurmctldPidFile=$W/slurmctld.pid
SlurmdPidFile=$W/slurmd.pid
SlurmctldLogFile=$W/slurmctld.log
SlurmdLogFile=$W/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
NodeName=$host CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
export SLURM_CONF="$W/slurm.conf"
slurmctld -f "$SLURM_CONF" || { cat "$W/slurmctld.log"; exit 1; }
slurmd -f "$SLURM_CONF" || { cat "$W/slurmd.log"; exit 1; }
for _ in $(seq 60); do
  sinfo -h -o %t 2>/dev/null | grep -qE "idle|mix|alloc" && { echo "SLURM_CONF=$SLURM_CONF"; exit 0; }
  sleep 1
done
echo "the Slurm node did not come up" >&2; sinfo >&2; tail -20 "$W/slurmctld.log" "$W/slurmd.log" >&2; exit 1
