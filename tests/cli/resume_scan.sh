#!/usr/bin/env bash
# Resume never starts over by mistake: with `latest` missing, empty, garbage or binary, resume (auto and true)
# continues from the newest valid step_<N>.h5 and says so, and keep_last deletes none of the earlier run's
# newest checkpoints. A resume at or past train.steps says so. A second run on the same checkpoint.dir stops
# at start naming the first run's host and PID.
set -u
fsdpp=$1; mpirun=$2; dir=$3
rm -rf "$dir"; mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }
ck=$dir/ck
common=(train.eval_interval=0 schedule.warmup_steps=1 checkpoint.interval=2 checkpoint.keep_last=2 "checkpoint.dir=$ck"
        "run.output=$dir/run")
"$mpirun" -n 2 "$fsdpp" train train.steps=4 "${common[@]}" > "$dir/first.log" 2>&1 || { cat "$dir/first.log"; fail "first run"; }

n=0
for latest in missing empty garbage binary; do
  for mode in auto true; do
    n=$((n + 1))
    case $latest in
      missing) rm -f "$ck/latest" ;;
      empty) : > "$ck/latest" ;;
      garbage) echo "checkpoint of tuesday" > "$ck/latest" ;;
      binary) printf '\211HDF\r\n\032\n\000\377' > "$ck/latest" ;;
    esac
    out=$("$mpirun" -n 2 "$fsdpp" train train.steps=6 "checkpoint.resume=$mode" "${common[@]}" 2>&1) \
      || { echo "$out" | tail -20; fail "resume $mode with latest $latest"; }
    echo "$out" | grep -E "scanned '.*' and resuming from the newest valid checkpoint, step_00000004.h5" \
      || { echo "$out" | tail -20; fail "latest $latest, resume $mode: no scan line"; }
    echo "$out" | grep -qE "resumed from .*step_00000004.h5 at step 4" || fail "latest $latest: did not resume from step 4"
    echo "$out" | grep -q "starting fresh" && fail "latest $latest: started fresh"
    [ -f "$ck/step_00000004.h5" ] && [ -f "$ck/step_00000006.h5" ] || fail "keep_last deleted a newest checkpoint: $(ls "$ck")"
    [ "$(cat "$ck/latest")" = step_00000006.h5 ] || fail "latest after the resume is '$(cat "$ck/latest")'"
    rm "$ck/step_00000006.h5"
  done
done
echo "resumed $n times past a broken latest"

# A save that never completed (a crash mid-write) leaves a .partial; the next run, holding the folder's lock,
# removes it and says so.
printf 'half a checkpoint' > "$ck/step_00000099.h5.partial"
out=$("$mpirun" -n 2 "$fsdpp" train train.steps=4 checkpoint.resume=auto "${common[@]}" 2>&1) || { echo "$out"; fail "run after a crash"; }
[ -e "$ck/step_00000099.h5.partial" ] && fail "a stale .partial was left in place"
echo "$out" | grep -q "removed .*step_00000099.h5.partial, left by a save that never completed" || fail "no line for the removed .partial"

# At or past train.steps: said, not silent.
echo step_00000004.h5 > "$ck/latest"
out=$("$mpirun" -n 2 "$fsdpp" train train.steps=3 checkpoint.resume=auto "${common[@]}" 2>&1) || { echo "$out"; fail "resume past the end"; }
echo "$out" | grep -E "warning: .*step_00000004.h5 is at step 4, past train.steps \(3\): there is nothing left to train" \
  || { echo "$out" | tail; fail "no note for a resume past train.steps"; }

# One writer per folder: a second run stops at start, naming the first one's host and PID.
"$mpirun" -n 2 "$fsdpp" train train.steps=100000 log.interval=1 train.eval_interval=0 schedule.warmup_steps=1 \
  checkpoint.interval=100000 "checkpoint.dir=$ck" "run.output=$dir/long" > "$dir/long.log" 2>&1 &
pid=$!
for _ in $(seq 600); do  # until the first run trains (at most 60 s)
  [ -f "$dir/long/metrics.jsonl" ] && [ "$(wc -l < "$dir/long/metrics.jsonl")" -ge 2 ] && break
  sleep 0.1
done
out=$(timeout 60 "$mpirun" -n 2 "$fsdpp" train train.steps=2 "${common[@]}" 2>&1); rc=$?
kill -USR1 "$pid"; wait "$pid"
echo "$out" | grep -E "^error: "
[ "$rc" = 2 ] || fail "the second run gave exit code $rc, expected 2"
[ "$(echo "$out" | grep -cE "^error: checkpoint.dir '$ck' is in use by another run \(host [^ ]+ pid [0-9]+ since")" = 1 ] \
  || fail "the second run's error does not name the holder once"
echo "resume scan, past-the-end note and the folder lock: as expected"
