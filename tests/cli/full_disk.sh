#!/usr/bin/env bash
# A full disk (a small tmpfs, filled after the first checkpoint): the next save fails with the folder and the
# system's reason, printed once, within seconds and without a crash in HDF5; `latest` still names the previous
# checkpoint; checkpoint.on_error: continue trains on with a warning; once space is back, resume works.
# A read-only folder is refused at start with its path and reason. Skips (77) where mount is not permitted.
set -u
fsdpp=$1; mpirun=$2; dir=$3
mnt=$dir/mnt
umount "$mnt" 2>/dev/null; rm -rf "$dir"; mkdir -p "$mnt"
if ! mount -t tmpfs -o size=8m tmpfs "$mnt" 2>"$dir/mount.err"; then
  echo "SKIP: cannot mount a tmpfs here ($(cat "$dir/mount.err")); run as root to test a full disk"; exit 77
fi
trap 'umount "$mnt" 2>/dev/null' EXIT
fail() { echo "FAIL: $*"; exit 1; }
ck=$mnt/ck
common=(train.eval_interval=0 schedule.warmup_steps=1 checkpoint.interval=2 "checkpoint.dir=$ck" "run.output=$dir/run")
"$mpirun" -n 2 "$fsdpp" train train.steps=2 "${common[@]}" > "$dir/first.log" 2>&1 || { cat "$dir/first.log"; fail "first run"; }
[ "$(cat "$ck/latest")" = step_00000002.h5 ] || fail "latest after the first run is '$(cat "$ck/latest")'"
dd if=/dev/zero of="$mnt/fill" bs=64k > /dev/null 2>&1  # until the disk is full

# abort (the default): a clear error naming the folder and the reason, printed once, exit 2 (not a signal).
timeout 60 "$mpirun" -n 2 "$fsdpp" train train.steps=4 checkpoint.resume=auto "${common[@]}" > "$dir/full.log" 2>&1
rc=$?
cat "$dir/full.log" | grep -E "error|warning" || true
[ "$rc" = 2 ] || { tail -30 "$dir/full.log"; fail "a full disk gave exit code $rc, expected 2 (a reported error)"; }
[ "$(grep -c "^error: .*'$ck'.*step_00000004.h5.*No space left on device" "$dir/full.log")" = 1 ] \
  || fail "the error does not name the folder and 'No space left on device' exactly once"
grep -q "Segmentation fault\|signal 11" "$dir/full.log" && fail "a crash in the output"
[ "$(cat "$ck/latest")" = step_00000002.h5 ] || fail "latest after the failed save is '$(cat "$ck/latest")'"
ls "$ck" | grep -q partial && fail "a .partial file was left: $(ls "$ck")"

# continue: the run finishes, says the save failed and that latest still names step 2.
timeout 60 "$mpirun" -n 2 "$fsdpp" train train.steps=4 checkpoint.resume=auto checkpoint.on_error=continue "${common[@]}" \
  > "$dir/continue.log" 2>&1 || { tail -30 "$dir/continue.log"; fail "on_error: continue stopped the run"; }
grep -E "warning: checkpoint: saving step 4 failed: .*No space left on device" "$dir/continue.log" || fail "no warning"
grep -E "training continues \(checkpoint.on_error: continue\); 'latest' still names .*step_00000002.h5" "$dir/continue.log" \
  || fail "the warning does not say what latest names"
grep -qE "Loop time of .* for 2 steps" "$dir/continue.log" || fail "did not train the remaining steps"
[ "$(cat "$ck/latest")" = step_00000002.h5 ] || fail "latest after on_error: continue is '$(cat "$ck/latest")'"

# Space back: resume from step 2 and commit step 4.
rm -f "$mnt/fill"
"$mpirun" -n 2 "$fsdpp" train train.steps=4 checkpoint.resume=auto "${common[@]}" > "$dir/resume.log" 2>&1 \
  || { tail -30 "$dir/resume.log"; fail "resume after freeing space"; }
grep -E "resumed from .*step_00000002.h5 at step 2" "$dir/resume.log" || fail "did not resume from step 2"
[ "$(cat "$ck/latest")" = step_00000004.h5 ] || fail "latest after the resume is '$(cat "$ck/latest")'"

# A read-only folder: refused at start, naming the path and the reason.
mount -o remount,ro "$mnt" || fail "remount read-only"
timeout 60 "$mpirun" -n 2 "$fsdpp" train train.steps=6 checkpoint.resume=auto "${common[@]}" > "$dir/ro.log" 2>&1
rc=$?
grep -E "^error: " "$dir/ro.log" || true
[ "$rc" = 2 ] || fail "a read-only folder gave exit code $rc, expected 2"
grep -qE "^error: .*$ck/.lock.*Read-only file system" "$dir/ro.log" || fail "the error does not name the folder and the reason"
echo "full disk: reported once with path and reason, latest kept, continue trained on, resume worked"
