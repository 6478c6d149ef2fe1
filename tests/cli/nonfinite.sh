#!/usr/bin/env bash
# A run that diverges (optim.lr 1e30: step 1 moves the weights to ~1e30, step 2 overflows) with a checkpoint
# every step. train.on_nonfinite abort: exit 2, the error printed once naming the step and a parameter, and no
# checkpoint written after the divergence (`latest` names the last finite one). skip: the skipped steps are
# logged, the weights stay finite (so checkpoints go on), and the run stops after train.max_skipped_steps in a
# row.
set -u
fsdpp=$1; mpirun=$2; dir=$3
rm -rf "$dir"; mkdir -p "$dir"
args=(optim.lr=1e30 schedule.warmup_steps=0 train.steps=8 train.eval_interval=0 checkpoint.interval=1 log.interval=1)
fail() { echo "FAIL: $*"; exit 1; }

"$mpirun" -n 2 "$fsdpp" train "${args[@]}" "checkpoint.dir=$dir/abort-ck" "run.output=$dir/abort" > "$dir/abort.log" 2>&1
rc=$?
grep -E "error|step [0-9]+:" "$dir/abort.log"
[ "$rc" = 2 ] || { tail -20 "$dir/abort.log"; fail "abort: exit code $rc, expected 2"; }
n=$(grep -Ec "error: step [0-9]+: loss [-a-z]+, gradient norm [-a-z]+, first non-finite gradient '[a-z0-9_.]+' \(train.on_nonfinite: abort\)" "$dir/abort.log")
[ "$n" = 1 ] || fail "abort: the error naming the step and the parameter appears $n times, expected once"
bad=$(grep -Eo "error: step [0-9]+" "$dir/abort.log" | grep -Eo "[0-9]+$")
last=$(printf 'step_%08d.h5' $((bad - 1)))
[ "$(cat "$dir/abort-ck/latest")" = "$last" ] || fail "abort: latest is '$(cat "$dir/abort-ck/latest")', expected $last"
[ ! -e "$dir/abort-ck/$(printf 'step_%08d.h5' "$bad")" ] || fail "abort: a checkpoint of step $bad was written"
"$fsdpp" ckpt verify "$dir/abort-ck/$last" > /dev/null || fail "abort: $last does not verify"

"$mpirun" -n 2 "$fsdpp" train "${args[@]}" train.on_nonfinite=skip train.max_skipped_steps=3 \
  "checkpoint.dir=$dir/skip-ck" "run.output=$dir/skip" > "$dir/skip.log" 2>&1
rc=$?
grep -E "error|warning" "$dir/skip.log"
[ "$rc" = 2 ] || { tail -20 "$dir/skip.log"; fail "skip: exit code $rc, expected 2"; }
n=$(grep -Ec "^warning: step [0-9]+: .*first non-finite gradient '.*'; skipped the optimizer update \([123] in a row, at most 3\)" "$dir/skip.log")
[ "$n" = 3 ] || fail "skip: $n skipped steps logged, expected 3"
grep -Eq "error: step [0-9]+: .*; 3 steps in a row were skipped already \(train.max_skipped_steps 3\)" "$dir/skip.log" \
  || fail "skip: no error after 3 skipped steps"
for f in "$dir"/skip-ck/step_*.h5; do "$fsdpp" ckpt verify "$f" > /dev/null || fail "skip: $f does not verify"; done
echo "non-finite guard: abort names step $bad, latest is $last; skip logged 3 steps, then stopped"
