#!/usr/bin/env bash
# The job templates under a real single-node Slurm started here (cluster.sh), then stopped by PID even on
# failure: every template parses (bash -n, and shellcheck when installed); the GPU templates' #SBATCH lines pass
# sbatch --test-only against fake 8-GPU nodes; cpu.sbatch runs to completion; the GPU templates run on this
# node's fake GPUs, where the CUDA demand must fail loudly, and with FSDPP_DEVICE=host to completion (the HSDP and
# tensor-parallel and pipeline ones with the meshes they derive); sweep-array.sbatch runs a 2-run list, then a list with a missing deck and an index
# past its end, which must fail with clear errors; requeue.sbatch is signalled part-way, saves, requeues itself,
# resumes, and ends with the same final loss, bitwise, as an uninterrupted run.
set -u
root=$1; fsdpp=$2; mpirun=$3; work=$4
rm -rf "$work"; mkdir -p "$work"
trap '"$root/tests/slurm/cluster.sh" stop "$work/slurm"' EXIT
out=$("$root/tests/slurm/cluster.sh" start "$work/slurm") || { echo "FAIL: could not start Slurm"; exit 1; }
export "$out"
for t in "$root"/jobs/*.sbatch; do bash -n "$t" || { echo "FAIL: $t does not parse"; exit 1; }; done
if command -v shellcheck > /dev/null; then
  shellcheck -S warning "$root"/jobs/*.sbatch || { echo "FAIL: shellcheck on jobs/*.sbatch"; exit 1; }
fi
cd "$work" || exit 1
export FSDPP="$fsdpp" DECK="$root/input/tiny.yaml"
short=(train.steps=10 schedule.warmup_steps=2)

# 0. The GPU templates' #SBATCH lines, unchanged, against partition gpu: two fake nodes of 64 CPUs and 8 GPUs
#    (cluster.sh).
test_only() {  # template, pattern the answer must match, extra sbatch options
  local t=$1 want=$2; shift 2
  local answer
  answer=$(sbatch --test-only -p gpu "$@" "$root/jobs/$t" 2>&1) || { echo "$answer"; echo "FAIL: $t refused by sbatch --test-only"; exit 1; }
  echo "$t: $answer"
  grep -Eq "$want" <<< "$answer" || { echo "FAIL: $t: expected '$want'"; exit 1; }
}
test_only gpu-single-node.sbatch "using 32 processors on nodes fakegpu[12] "
test_only gpu-multi-node.sbatch "using 64 processors on nodes fakegpu\\[1-2\\] "
test_only hsdp-multi-node.sbatch "using 64 processors on nodes fakegpu\\[1-2\\] "
test_only tp-multi-node.sbatch "using 64 processors on nodes fakegpu\\[1-2\\] "
test_only pp-multi-node.sbatch "using 64 processors on nodes fakegpu\\[1-2\\] "
# ... and the check has teeth: 9 tasks with a GPU each do not fit an 8-GPU node.
if sbatch --test-only -p gpu --ntasks-per-node=9 "$root/jobs/hsdp-multi-node.sbatch" 2> /dev/null; then
  echo "FAIL: sbatch --test-only accepted 9 GPUs per node"; exit 1
fi

# Sections 1 to 3 submit all their jobs at once (sbatch --wait in the background, each job's id and exit code in
# files), and the node runs up to four at a time (OverSubscribe=FORCE:4): the jobs are small, and most of their
# time is Slurm's and mpiexec's start-up, not training. Each is checked after all have ended, as if run in turn.
submit() {  # NAME sbatch-arguments...: sbatch --wait --parsable in the background; NAME.id, then NAME.rc
  local name=$1; shift
  { sbatch --wait --parsable "$@" > "$name.id"; echo $? > "$name.rc"; } &
}
ended() {  # NAME: the job's id (sbatch's exit code is its return code)
  cat "$1.id"; return "$(cat "$1.rc")"
}
# 1. cpu.sbatch
submit cpu "$root/jobs/cpu.sbatch" train.steps=20 "run.output=$work/cpu-run"
# 2. The GPU templates on this node (2 tasks, 1 CPU each; the node's GPUs are fake). They demand CUDA, so they
#    must stop with fsdpp's error rather than train on the CPU; with FSDPP_DEVICE=host they run to the end.
small=(--nodes=1 --ntasks-per-node=2 --cpus-per-task=1)
submit gpu --ntasks=2 --cpus-per-task=1 "$root/jobs/gpu-single-node.sbatch" "${short[@]}"
FSDPP_DEVICE=host submit multi "${small[@]}" "$root/jobs/gpu-multi-node.sbatch" "${short[@]}" "run.output=$work/multi-run"
FSDPP_DEVICE=host submit hsdp "${small[@]}" "$root/jobs/hsdp-multi-node.sbatch" "${short[@]}" "run.output=$work/hsdp-run"
FSDPP_DEVICE=host submit tp "${small[@]}" "$root/jobs/tp-multi-node.sbatch" "${short[@]}" "run.output=$work/tp-run"
FSDPP_DEVICE=host submit pp "${small[@]}" "$root/jobs/pp-multi-node.sbatch" "${short[@]}" "run.output=$work/pp-run"
# 3. sweep-array.sbatch: a list of 2 runs (a deck with overrides; overrides alone, on DECK), each with its own
#    log and run folder; then a list whose index 1 names a missing deck, submitted with an index past its end.
printf '# two runs\n%s %s\n\n%s optim.lr=1e-2\n' "$DECK" "${short[*]}" "${short[*]}" > good.list
SWEEP_LIST=good.list SWEEP_RUNS="$work/sweep" submit good-sweep --array=0-1 "$root/jobs/sweep-array.sbatch"
printf '%s %s\n%s/missing.yaml %s\n' "$DECK" "${short[*]}" "$work" "${short[*]}" > bad.list
SWEEP_LIST=bad.list SWEEP_RUNS="$work/sweep" submit bad-sweep --array=0-2 "$root/jobs/sweep-array.sbatch"
wait

ended cpu > /dev/null || { cat fsdpp-cpu-*.out; echo "FAIL: cpu.sbatch"; exit 1; }
grep -E "Loop time of [0-9.]+ on 2 procs for 20 steps" fsdpp-cpu-*.out || { cat fsdpp-cpu-*.out; echo "FAIL: cpu.sbatch output"; exit 1; }

job=$(ended gpu) && { cat "fsdpp-gpu-$job.out"; echo "FAIL: gpu-single-node.sbatch ran without a GPU"; exit 1; }
grep "sees no CUDA GPU" "fsdpp-gpu-$job.out" || { cat "fsdpp-gpu-$job.out"; echo "FAIL: no clear error without a GPU"; exit 1; }
job=$(ended multi) || { cat "fsdpp-gpu-multi-$job.out"; echo "FAIL: gpu-multi-node.sbatch"; exit 1; }
grep -E "Loop time of [0-9.]+ on 2 procs for 10 steps" "fsdpp-gpu-multi-$job.out" \
  || { cat "fsdpp-gpu-multi-$job.out"; echo "FAIL: gpu-multi-node.sbatch output"; exit 1; }
job=$(ended hsdp) || { cat "fsdpp-hsdp-$job.out"; echo "FAIL: hsdp-multi-node.sbatch"; exit 1; }
for want in "fully_shard over dp_replicate=1 x dp_shard=2 " "Loop time of [0-9.]+ on 2 procs for 10 steps"; do
  grep -E "$want" "fsdpp-hsdp-$job.out" || { cat "fsdpp-hsdp-$job.out"; echo "FAIL: hsdp-multi-node.sbatch output"; exit 1; }
done
job=$(ended tp) || { cat "fsdpp-tp-$job.out"; echo "FAIL: tp-multi-node.sbatch"; exit 1; }
for want in "fully_shard over dp_shard=1 x tp=2 " "Loop time of [0-9.]+ on 2 procs for 10 steps"; do
  grep -E "$want" "fsdpp-tp-$job.out" || { cat "fsdpp-tp-$job.out"; echo "FAIL: tp-multi-node.sbatch output"; exit 1; }
done
job=$(ended pp) || { cat "fsdpp-pp-$job.out"; echo "FAIL: pp-multi-node.sbatch"; exit 1; }
for want in "mesh.pp=1 mesh.dp_shard=2" "Loop time of [0-9.]+ on 2 procs for 10 steps"; do  # one node: one stage
  grep -E "$want" "fsdpp-pp-$job.out" || { cat "fsdpp-pp-$job.out"; echo "FAIL: pp-multi-node.sbatch output"; exit 1; }
done

job=$(ended good-sweep) || { cat fsdpp-sweep-*.out; echo "FAIL: sweep-array.sbatch"; exit 1; }
for i in 0 1; do
  log="fsdpp-sweep-${job}_$i.out"
  grep -E "Loop time of [0-9.]+ on 2 procs for 10 steps" "$log" || { cat "$log"; echo "FAIL: sweep index $i"; exit 1; }
  [ -s "$work/sweep/sweep-$job-$i/metrics.jsonl" ] || { echo "FAIL: no $work/sweep/sweep-$job-$i/metrics.jsonl"; exit 1; }
done
grep -Eq '^ +lr: 0\.01$' "$work/sweep/sweep-$job-1/deck.resolved.yaml" || { echo "FAIL: sweep index 1 lost its override"; exit 1; }
if job=$(ended bad-sweep); then
  echo "FAIL: a sweep with a missing deck ended with exit code 0"; exit 1
fi
grep -E "Loop time of [0-9.]+ on 2 procs for 10 steps" "fsdpp-sweep-${job}_0.out" || { cat "fsdpp-sweep-${job}_0.out"; echo "FAIL: bad sweep, index 0"; exit 1; }
grep "cannot read deck '$work/missing.yaml'" "fsdpp-sweep-${job}_1.out" || { cat "fsdpp-sweep-${job}_1.out"; echo "FAIL: no clear error for the missing deck"; exit 1; }
grep "array index 2 is past the end of the sweep list bad.list, which has 2 run(s)" "fsdpp-sweep-${job}_2.out" \
  || { cat "fsdpp-sweep-${job}_2.out"; echo "FAIL: no clear error past the end of the list"; exit 1; }

# 4. requeue.sbatch, preempted part-way (signalled after 5 of its 40 steps), beside the uninterrupted reference
#    run, which runs while the job does and while Slurm holds it after its requeue
args=(train.steps=40 schedule.warmup_steps=2 train.eval_interval=0 model.n_embd=128 model.n_layer=3
      checkpoint.interval=100000 log.interval=1)
"$mpirun" -n 2 "$fsdpp" train "$DECK" "${args[@]}" "checkpoint.dir=$work/ref-ck" "run.output=$work/ref" > ref.log 2>&1 &
ref=$!
job=$(sbatch --parsable "$root/jobs/requeue.sbatch" "${args[@]}" "checkpoint.dir=$work/ck" "run.output=$work/run")
for _ in $(seq 300); do
  [ -f "$work/run/metrics.jsonl" ] && [ "$(wc -l < "$work/run/metrics.jsonl")" -ge 5 ] && break
  sleep 0.2
done
scancel --signal=USR1 --batch "$job"
state=""
for _ in $(seq 800); do  # Slurm holds a requeued job for a while (Reason=BeginTime: cred_expire, cluster.sh)
  state=$(scontrol show job "$job" | grep -o "JobState=[A-Z]*")
  [ "$state" = JobState=COMPLETED ] || [ "$state" = JobState=FAILED ] && break
  sleep 0.5
done
wait "$ref" || { cat ref.log; echo "FAIL: reference run"; exit 1; }
log="fsdpp-requeue-$job.out"
cat "$log" | grep -E "requeue.sbatch|preempted|resumed"
[ "$state" = JobState=COMPLETED ] || { tail -30 "$log"; echo "FAIL: job ended $state"; exit 1; }
grep -q "requeue.sbatch: job $job, restart 1" "$log" || { echo "FAIL: the job was not requeued"; exit 1; }
grep -Eq "resumed from .*step_[0-9]+\.h5 at step [0-9]+" "$log" || { echo "FAIL: no resume"; exit 1; }
want=$(grep '"step":40,' "$work/ref/metrics.jsonl" | grep -o '"loss":[^,]*')
got=$(grep '"step":40,' "$work/run/metrics.jsonl" | grep -o '"loss":[^,]*')
echo "uninterrupted $want, preempted under Slurm and requeued $got"
[ -n "$want" ] && [ "$want" = "$got" ] || { echo "FAIL: final losses differ"; exit 1; }
echo "slurm: templates parse; GPU templates pass --test-only and fail loudly without a GPU; cpu, GPU (on host)," \
     "HSDP and sweep templates ran; requeue.sbatch preempted, requeued, resumed, same final loss"
