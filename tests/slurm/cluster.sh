#!/usr/bin/env bash
# A real single-node Slurm for the tests: munged, slurmctld and slurmd from Debian's slurm-wlm, with every file
# under one work folder and every daemon stopped by PID.
# Partitions: "debug" (default) is this machine, with 8 fake GPUs (GRES gpu, device files under the work folder)
# so that jobs asking for --gpus-per-task run and get CUDA_VISIBLE_DEVICES, without any GPU behind it. "gpu" is
# two fake GPU nodes (64 CPUs, 8 GPUs each) for `sbatch --test-only -p gpu` alone, which checks a GPU template's
# unchanged #SBATCH lines (several nodes, GPUs per task) against the shape of a real GPU node. --test-only only
# considers nodes that could run a job now: IDLE and answering (not DOWN, DRAIN or UNKNOWN, and a node that does
# not answer slurmctld's pings turns "idle*" within about 15 s). So the fake nodes' address is this machine's
# slurmd, which answers for them. Never submit a job to partition gpu: it would be sent to that slurmd.
# Quick for tests (the defaults would make them wait on timers, not on the jobs): a requeued job may start again
# cred_expire (AuthInfo; default 120 s, least 5) + 1 s after its requeue; the scheduler passes over the pending
# jobs every second (sched_interval, default 60 s; bf_interval, default 30 s), so a pending job that can start (its
# begin time come, or the cores it waited for freed) does within a second; MinJobAge=4 (default 300), so sbatch
# --wait polls the job every 2 s instead of backing off to 8 s and then 32 s (its sleep grows only while below
# MinJobAge / 2), and a finished job's record still outlives that poll (purged no sooner than 4 s after its end).
#   cluster.sh start <work-dir>   prints the SLURM_CONF to export
#   cluster.sh stop <work-dir>
set -u
cmd=$1; W=$(realpath -m "$2")
stop() {
  local pids=() d p alive _
  for d in slurmd slurmctld munged; do
    if [ -f "$W/$d.pid" ] && kill "$(cat "$W/$d.pid")" 2>/dev/null; then pids+=("$(cat "$W/$d.pid")"); fi
  done
  for _ in $(seq 20); do  # up to 1 s for them to go, then SIGKILL
    alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.05
  done
  for d in slurmd slurmctld munged; do
    if [ -f "$W/$d.pid" ] && kill -0 "$(cat "$W/$d.pid")" 2>/dev/null; then kill -9 "$(cat "$W/$d.pid")" 2>/dev/null; fi
    rm -f "$W/$d.pid"
  done
}
if [ "$cmd" = stop ]; then stop; exit 0; fi

stop
rm -rf "$W"; mkdir -p "$W/state" "$W/spool" "$W/munge" "$W/gpu"
host=$(hostname -s); cpus=$(nproc)
# slurmd accepts only character devices as GPU files: copies of /dev/null. Without mknod, count-only GPUs
# (scheduled, but no CUDA_VISIBLE_DEVICES).
gres="Name=gpu Count=8"
if mknod -m 666 "$W/gpu/nvidia0" c 1 3 2>/dev/null; then
  for i in 1 2 3 4 5 6 7; do mknod -m 666 "$W/gpu/nvidia$i" c 1 3; done
  gres="Name=gpu File=$W/gpu/nvidia[0-7]"
fi
printf 'AutoDetect=off\nNodeName=%s %s\n' "$host" "$gres" > "$W/gres.conf"  # slurmd reads it next to slurm.conf
# Our own key, socket and ports: nothing of a site installation is touched.
dd if=/dev/urandom of="$W/munge/munge.key" bs=1024 count=1 status=none; chmod 600 "$W/munge/munge.key"
munged --force --socket="$W/munge/socket" --key-file="$W/munge/munge.key" --pid-file="$W/munged.pid" \
       --log-file="$W/munge/munged.log" --seed-file="$W/munge/seed" || { echo "munged failed" >&2; exit 1; }
cat > "$W/slurm.conf" <<CONF
ClusterName=fsdpp-test
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$W/munge/socket,cred_expire=10
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
SchedulerParameters=sched_interval=1,bf_interval=1
MinJobAge=4
GresTypes=gpu
NodeName=$host CPUs=$cpus Gres=gpu:8 State=UNKNOWN
NodeName=fakegpu[1-2] NodeAddr=127.0.0.1 CPUs=64 Gres=gpu:8 State=IDLE
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
PartitionName=gpu Nodes=fakegpu[1-2] MaxTime=INFINITE State=UP
CONF
export SLURM_CONF="$W/slurm.conf"
slurmctld -f "$SLURM_CONF" || { cat "$W/slurmctld.log"; exit 1; }
slurmd -f "$SLURM_CONF" || { cat "$W/slurmd.log"; exit 1; }
for _ in $(seq 300); do  # 60 s
  sinfo -h -o %t 2>/dev/null | grep -qE "idle|mix|alloc" && { echo "SLURM_CONF=$SLURM_CONF"; exit 0; }
  sleep 0.2
done
echo "the Slurm node did not come up" >&2; sinfo >&2; tail -20 "$W/slurmctld.log" "$W/slurmd.log" >&2; exit 1
