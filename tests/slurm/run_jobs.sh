#!/usr/bin/env bash
# The job templates under a real single-node Slurm started here (cluster.sh), then stopped by PID even on
# failure: cpu.sbatch runs to completion; requeue.sbatch is signalled part-way, saves, requeues itself, resumes,
# and ends with the same final loss, bitwise, as an uninterrupted run.
set -u
root=$1; fsdpp=$2; mpirun=$3; work=$4
rm -rf "$work"; mkdir -p "$work"
trap '"$root/tests/slurm/cluster.sh" stop "$work/slurm"' EXIT
out=$("$root/tests/slurm/cluster.sh" start "$work/slurm") || { echo "FAIL: could not start Slurm"; exit 1; }
export "$out"
for t in "$root"/jobs/*.sbatch; do bash -n "$t" || { echo "FAIL: $t does not parse"; exit 1; }; done
cd "$work"
export FSDPP="$fsdpp" DECK="$root/input/tiny.yaml"

# 1. cpu.sbatch
sbatch --wait "$root/jobs/cpu.sbatch" train.steps=20 "run.output=$work/cpu-run" > /dev/null || { cat fsdpp-cpu-*.out; echo "FAIL: cpu.sbatch"; exit 1; }
grep -E "Loop time of [0-9.]+ on 2 procs for 20 steps" fsdpp-cpu-*.out || { cat fsdpp-cpu-*.out; echo "FAIL: cpu.sbatch output"; exit 1; }

# 2. requeue.sbatch, preempted part-way
args=(train.steps=120 schedule.warmup_steps=2 train.eval_interval=0 model.n_embd=128 model.n_layer=3
      checkpoint.interval=100000 log.interval=1)
"$mpirun" -n 2 "$fsdpp" train "$DECK" "${args[@]}" "checkpoint.dir=$work/ref-ck" "run.output=$work/ref" > ref.log 2>&1 \
  || { cat ref.log; echo "FAIL: reference run"; exit 1; }
job=$(sbatch --parsable "$root/jobs/requeue.sbatch" "${args[@]}" "checkpoint.dir=$work/ck" "run.output=$work/run")
for _ in $(seq 300); do
  [ -f "$work/run/metrics.jsonl" ] && [ "$(wc -l < "$work/run/metrics.jsonl")" -ge 5 ] && break
  sleep 0.2
done
scancel --signal=USR1 --batch "$job"
state=""
for _ in $(seq 400); do  # Slurm holds a requeued job for a while (Reason=BeginTime) before it starts again
  state=$(scontrol show job "$job" | grep -o "JobState=[A-Z]*")
  [ "$state" = JobState=COMPLETED ] || [ "$state" = JobState=FAILED ] && break
  sleep 1
done
log="fsdpp-requeue-$job.out"
cat "$log" | grep -E "requeue.sbatch|preempted|resumed"
[ "$state" = JobState=COMPLETED ] || { tail -30 "$log"; echo "FAIL: job ended $state"; exit 1; }
grep -q "requeue.sbatch: job $job, restart 1" "$log" || { echo "FAIL: the job was not requeued"; exit 1; }
grep -Eq "resumed from .*step_[0-9]+\.h5 at step [0-9]+" "$log" || { echo "FAIL: no resume"; exit 1; }
want=$(grep '"step":120,' "$work/ref/metrics.jsonl" | grep -o '"loss":[^,]*')
got=$(grep '"step":120,' "$work/run/metrics.jsonl" | grep -o '"loss":[^,]*')
echo "uninterrupted $want, preempted under Slurm and requeued $got"
[ -n "$want" ] && [ "$want" = "$got" ] || { echo "FAIL: final losses differ"; exit 1; }
echo "slurm: cpu.sbatch ran; requeue.sbatch preempted, requeued, resumed, same final loss"
