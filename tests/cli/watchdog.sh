#!/usr/bin/env bash
# Collective watchdog: rank 1 sleeps 100 s before step 3 (the app's test hook FSDPP_TEST_STALL); rank 0 waits in
# that step's first all-gather, which times out after comm.timeout_s 3. The job must end within seconds (not
# after the sleep), non-zero, with one message naming the operation, the mesh dimension and the step.
set -u
fsdpp=$1; mpirun=$2; dir=$3
rm -rf "$dir"; mkdir -p "$dir"
start=$(date +%s)
FSDPP_TEST_STALL=1:3:100 "$mpirun" -n 2 "$fsdpp" train train.steps=10 schedule.warmup_steps=0 train.eval_interval=0 \
  comm.timeout_s=3 "run.output=$dir/run" > "$dir/run.log" 2>&1
rc=$?
elapsed=$(( $(date +%s) - start ))
grep -E "watchdog" "$dir/run.log"
echo "exit code $rc after $elapsed s"
[ "$rc" != 0 ] || { tail -20 "$dir/run.log"; echo "FAIL: the stalled job exited 0"; exit 1; }
[ "$elapsed" -lt 60 ] || { echo "FAIL: the job took $elapsed s to end; the watchdog should end it within seconds"; exit 1; }
n=$(grep -Ec "error: collective watchdog: all_gather over dp_shard \(#[0-9]+, .*all-gather\) did not finish within 3 s \(.*at step 3\)" "$dir/run.log")
[ "$n" = 1 ] || { tail -20 "$dir/run.log"; echo "FAIL: the watchdog message appears $n times, expected once"; exit 1; }
grep -Eq "flight recorder: .*fsdpp debug flight $dir/run/flight$" "$dir/run.log" || { echo "FAIL: the log does not point at fsdpp debug flight"; exit 1; }
report=$("$fsdpp" debug flight "$dir/run/flight") || { echo "FAIL: fsdpp debug flight"; exit 1; }
echo "$report"
grep -q "rank 1 on $(hostname) never entered it" <<< "$report" || { echo "FAIL: the flight report does not name rank 1"; exit 1; }
echo "watchdog: the stalled job ended after $elapsed s naming all_gather over dp_shard at step 3"
