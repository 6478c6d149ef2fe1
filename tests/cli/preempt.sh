#!/usr/bin/env bash
# Preemption without Slurm: SIGUSR1 to mpiexec (Open MPI forwards it to the ranks) part-way through a run; the
# run must save, exit with code 85, and a resume (checkpoint.resume: auto) must finish with the same final loss,
# bitwise, as an uninterrupted run of the same deck.
set -u
fsdpp=$1; mpirun=$2; dir=$3
rm -rf "$dir"; mkdir -p "$dir"
args=(train.steps=120 schedule.warmup_steps=2 train.eval_interval=0 model.n_embd=128 model.n_layer=3
      checkpoint.interval=100000 log.interval=1)
"$mpirun" -n 2 "$fsdpp" train "${args[@]}" "checkpoint.dir=$dir/ref-ck" "run.output=$dir/ref" > "$dir/ref.log" 2>&1 \
  || { cat "$dir/ref.log"; echo "FAIL: reference run"; exit 1; }
"$mpirun" -n 2 "$fsdpp" train "${args[@]}" "checkpoint.dir=$dir/ck" "run.output=$dir/run" > "$dir/run.log" 2>&1 &
pid=$!
for _ in $(seq 600); do  # until 5 steps are logged (at most 60 s)
  [ -f "$dir/run/metrics.jsonl" ] && [ "$(wc -l < "$dir/run/metrics.jsonl")" -ge 5 ] && break
  sleep 0.1
done
kill -USR1 "$pid"
wait "$pid"; rc=$?
cat "$dir/run.log" | grep -E "preempted|checkpoint" || true
[ "$rc" = 85 ] || { tail -20 "$dir/run.log"; echo "FAIL: exit code $rc, expected 85"; exit 1; }
grep -Eq "preempted: signal 10 received; stopped after step [0-9]+ of 120, saved .*step_[0-9]+\.h5" "$dir/run.log" \
  || { echo "FAIL: no preemption line"; exit 1; }
"$mpirun" -n 2 "$fsdpp" train "${args[@]}" "checkpoint.dir=$dir/ck" "run.output=$dir/run" checkpoint.resume=auto \
  > "$dir/resume.log" 2>&1 || { tail -20 "$dir/resume.log"; echo "FAIL: resume"; exit 1; }
grep -E "resumed from .* at step [0-9]+" "$dir/resume.log" || { echo "FAIL: did not resume"; exit 1; }
want=$(grep '"step":120,' "$dir/ref/metrics.jsonl" | grep -o '"loss":[^,]*')
got=$(grep '"step":120,' "$dir/run/metrics.jsonl" | grep -o '"loss":[^,]*')
echo "uninterrupted $want, preempted and resumed $got"
[ -n "$want" ] && [ "$want" = "$got" ] || { echo "FAIL: final losses differ"; exit 1; }
echo "preemption: saved, exit 85, resumed, same final loss"
