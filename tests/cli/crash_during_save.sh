#!/usr/bin/env bash
# A rank dies in the middle of writing the second checkpoint (fault seam FSDPP_TEST_SAVE_FAULT=write:2:1:crash,
# fsdpp/ckpt/save_faults.hpp: rank 1 dies as it starts writing its shards of save 2): the first
# checkpoint must stay valid, `latest` must still name it, and resume: auto must continue from it.
set -u
fsdpp=$1; mpirun=$2; dir=$3
rm -rf "$dir"
common=(train.steps=4 schedule.warmup_steps=1 train.eval_interval=0 checkpoint.interval=2 "checkpoint.dir=$dir" "run.output=$dir/run")
FSDPP_TEST_SAVE_FAULT=write:2:1:crash "$mpirun" -n 2 "$fsdpp" train "${common[@]}" > "$dir.crash.log" 2>&1
rc=$?
[ "$rc" != 0 ] || { echo "FAIL: the crashing run exited 0"; exit 1; }
grep -q "test fault: dying at save point 'write' of save 2" "$dir.crash.log" || { cat "$dir.crash.log"; echo "FAIL: the fault did not fire"; exit 1; }
[ "$(cat "$dir/latest")" = step_00000002.h5 ] || { echo "FAIL: latest is '$(cat "$dir/latest")'"; exit 1; }
[ ! -e "$dir/step_00000004.h5" ] || { echo "FAIL: the interrupted checkpoint was committed"; exit 1; }
ls "$dir"
"$fsdpp" ckpt verify "$dir/step_00000002.h5" || { echo "FAIL: the previous checkpoint does not verify"; exit 1; }
out=$("$mpirun" -n 2 "$fsdpp" train "${common[@]}" checkpoint.resume=auto 2>&1) || { echo "$out"; echo "FAIL: resume"; exit 1; }
echo "$out" | grep -E "resumed from .*step_00000002.h5 at step 2" || { echo "$out"; echo "FAIL: did not resume from step 2"; exit 1; }
echo "$out" | grep -E "Loop time of .* for 2 steps" || { echo "FAIL: did not train the remaining 2 steps"; exit 1; }
[ "$(cat "$dir/latest")" = step_00000004.h5 ] || { echo "FAIL: latest after resume is '$(cat "$dir/latest")'"; exit 1; }
echo "crash during save: previous checkpoint intact, resumed, completed"
