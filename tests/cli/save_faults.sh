#!/usr/bin/env bash
# Injected save failures through the app (FSDPP_TEST_SAVE_FAULT, fsdpp/ckpt/save_faults.hpp): a failed write
# on rank 1 and a failed update of `latest` on rank 0, each reported once with the path and the reason;
# `latest` keeps naming the previous checkpoint and a resume continues from it.
set -u
fsdpp=$1; mpirun=$2; dir=$3
rm -rf "$dir"; mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }
for fault in write:2:1 close:2:0 rename:2:0 latest:2:0; do
  ck=$dir/${fault//:/-}
  common=(train.steps=4 train.eval_interval=0 schedule.warmup_steps=1 checkpoint.interval=2 "checkpoint.dir=$ck"
          "run.output=$dir/run")
  out=$(FSDPP_TEST_SAVE_FAULT=$fault timeout 60 "$mpirun" -n 2 "$fsdpp" train "${common[@]}" 2>&1); rc=$?
  echo "$out" | grep -E "^error: "
  [ "$rc" = 2 ] || { echo "$out" | tail -20; fail "$fault: exit code $rc, expected 2"; }
  [ "$(echo "$out" | grep -cE "^error: .*$ck/(step_00000004.h5.partial|latest.tmp).*: No space left on device")" = 1 ] \
    || fail "$fault: the error does not name the path and the reason once"
  [ "$(cat "$ck/latest")" = step_00000002.h5 ] || fail "$fault: latest is '$(cat "$ck/latest")'"
  [ -e "$ck/step_00000004.h5.partial" ] && fail "$fault: a .partial file was left"
  out=$("$mpirun" -n 2 "$fsdpp" train "${common[@]}" checkpoint.resume=auto 2>&1) || { echo "$out" | tail; fail "$fault: resume"; }
  echo "$out" | grep -qE "resumed from .*step_00000002.h5 at step 2" || fail "$fault: did not resume from step 2"
done
echo "save faults: reported with path and reason, latest kept, resumed"
