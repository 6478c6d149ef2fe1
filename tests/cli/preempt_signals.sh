#!/usr/bin/env bash
# Signals beyond preempt.sh's SIGUSR1 to mpiexec:
#  1. SIGTERM to share/scripts/fsdpp-mpiexec (Open MPI's mpiexec itself would kill the job and exit 1): the ranks
#     save and stop with exit code 85, and the run resumes. With checkpoint.interval 1 the step it stops at was
#     just saved at its interval: the preemption must not write it a second time.
#  2. SIGINT to the process group of fsdpp-mpiexec, as a terminal's Ctrl-C: the same.
#  3. SIGUSR1 to rank 1 alone: the log names the signal (10), not rank 0's "0".
set -u
fsdpp=$1; mpirun=$2; wrapper=$3; dir=$4
rm -rf "$dir"; mkdir -p "$dir"
args=(train.steps=60 schedule.warmup_steps=2 train.eval_interval=0 model.n_embd=128 model.n_layer=3 log.interval=1)
fail() { echo "FAIL: $*"; exit 1; }
export MPIEXEC=$mpirun

# Waits until run folder $1 has logged 5 steps (at most 60 s).
wait_for_steps() {
  for _ in $(seq 600); do
    [ -f "$1/metrics.jsonl" ] && [ "$(wc -l < "$1/metrics.jsonl")" -ge 5 ] && return 0
    sleep 0.1
  done
  return 1
}

# 1. SIGTERM to the wrapper; every step is checkpointed.
"$wrapper" -n 2 "$fsdpp" train "${args[@]}" checkpoint.interval=1 checkpoint.keep_last=3 "checkpoint.dir=$dir/term-ck" \
  "run.output=$dir/term" > "$dir/term.log" 2>&1 &
pid=$!
wait_for_steps "$dir/term" || fail "SIGTERM run: no steps logged"
kill -TERM "$pid"
wait "$pid"; rc=$?
grep -E "fsdpp-mpiexec|preempted" "$dir/term.log"
[ "$rc" = 85 ] || { tail -20 "$dir/term.log"; fail "SIGTERM to fsdpp-mpiexec: exit code $rc, expected 85"; }
line=$(grep -E "preempted: signal 10 received; stopped after step [0-9]+ of 60, saved .*step_[0-9]+\.h5" "$dir/term.log") \
  || fail "SIGTERM: no preemption line"
step=$(echo "$line" | grep -Eo "after step [0-9]+" | grep -Eo "[0-9]+")
saves=$(grep -Ec "checkpoint: saved step $step to" "$dir/term.log")
[ "$saves" = 1 ] || fail "step $step was saved $saves times, expected once"
[ "$(cat "$dir/term-ck/latest")" = "$(printf 'step_%08d.h5' "$step")" ] || fail "latest is not step $step"
"$mpirun" -n 2 "$fsdpp" train "${args[@]}" checkpoint.interval=1 checkpoint.keep_last=3 "checkpoint.dir=$dir/term-ck" \
  "run.output=$dir/term" checkpoint.resume=auto > "$dir/term-resume.log" 2>&1 || { tail -20 "$dir/term-resume.log"; fail "resume"; }
grep -E "resumed from .*at step $step " "$dir/term-resume.log" || fail "did not resume from step $step"
grep -Eq "Loop time of .* for $((60 - step)) steps" "$dir/term-resume.log" || fail "the resumed run did not finish"

# 2. SIGINT to the wrapper's process group (its own session here), as Ctrl-C in a terminal would send it.
# A background job of a script starts with SIGINT ignored; env --default-signal gives the wrapper a normal one.
setsid env --default-signal=INT "$wrapper" -n 2 "$fsdpp" train "${args[@]}" checkpoint.interval=100000 \
  "checkpoint.dir=$dir/int-ck" "run.output=$dir/int" > "$dir/int.log" 2>&1 &
pid=$!
wait_for_steps "$dir/int" || fail "SIGINT run: no steps logged"
kill -INT -- "-$pid"
wait "$pid"; rc=$?
grep -E "fsdpp-mpiexec|preempted" "$dir/int.log"
[ "$rc" = 85 ] || { tail -20 "$dir/int.log"; fail "SIGINT to the process group: exit code $rc, expected 85"; }
grep -Eq "preempted: signal 10 received; stopped after step [0-9]+ of 60, saved .*step_[0-9]+\.h5" "$dir/int.log" \
  || fail "SIGINT: no preemption line"

# 3. SIGUSR1 to rank 1 only (found by its OMPI_COMM_WORLD_RANK among mpiexec's children).
"$mpirun" -n 2 "$fsdpp" train "${args[@]}" checkpoint.interval=100000 "checkpoint.dir=$dir/one-ck" "run.output=$dir/one" \
  > "$dir/one.log" 2>&1 &
pid=$!
wait_for_steps "$dir/one" || fail "rank-1 run: no steps logged"
rank1=""
for child in $(pgrep -P "$pid"); do
  tr '\0' '\n' < "/proc/$child/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" && rank1=$child
done
[ -n "$rank1" ] || { kill -TERM "$pid"; fail "could not find rank 1 among the children of mpiexec ($pid)"; }
kill -USR1 "$rank1"
wait "$pid"; rc=$?
grep -E "preempted" "$dir/one.log"
[ "$rc" = 85 ] || { tail -20 "$dir/one.log"; fail "SIGUSR1 to rank 1: exit code $rc, expected 85"; }
grep -Eq "preempted: signal 10 received; stopped after step" "$dir/one.log" || fail "the log does not name signal 10"
echo "signals: SIGTERM and SIGINT through fsdpp-mpiexec exit 85 (step $step saved once, resumed); rank 1 alone names signal 10"
