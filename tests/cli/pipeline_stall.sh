#!/usr/bin/env bash
# A stalled pipeline stage: rank 1 (stage 1 of mesh.pp 2) sleeps 100 s before step 3 (FSDPP_TEST_STALL); stage 0
# waits there for the gradient of its first micro-batch, which the watchdog (comm.timeout_s 3) ends within seconds,
# naming the stage and world rank it waits on; the flight report carries that reason and the receive it waits in.
set -u
fsdpp=$1; mpirun=$2; dir=$3
rm -rf "$dir"; mkdir -p "$dir"
start=$(date +%s)
FSDPP_TEST_STALL=1:3:100 "$mpirun" -n 2 "$fsdpp" train model.n_layer=4 mesh.pp=2 train.micro_batch=4 train.steps=10 \
  schedule.warmup_steps=0 train.eval_interval=0 comm.timeout_s=3 "run.output=$dir/run" > "$dir/run.log" 2>&1
rc=$?
elapsed=$(( $(date +%s) - start ))
echo "exit code $rc after $elapsed s"
[ "$rc" != 0 ] || { tail -20 "$dir/run.log"; echo "FAIL: the stalled job exited 0"; exit 1; }
[ "$elapsed" -lt 60 ] || { echo "FAIL: the job took $elapsed s to end; the watchdog should end it within seconds"; exit 1; }
expected="collective watchdog: pipeline stage 0 waiting for the output gradient of micro-batch 0 from stage 1 \(world rank 1\) did not finish within 3 s"
n=$(grep -Ec "error: $expected" "$dir/run.log")
[ "$n" = 1 ] || { tail -20 "$dir/run.log"; echo "FAIL: the watchdog message appears $n times, expected once"; exit 1; }
report=$("$fsdpp" debug flight "$dir/run/flight") || { echo "FAIL: fsdpp debug flight"; exit 1; }
echo "$report"
grep -Eq "aborted the job \($expected" <<< "$report" || { echo "FAIL: the flight report does not name the stage"; exit 1; }
# the messages are point to point: the report shows the receive stage 0 waits in, and reads no desync from them
grep -Eq "Messages unfinished: on pp \(messages\) \(ranks 0 and 1\) rank 0 waits in recv #[0-9]+ of [0-9]+ f32 \(step 3\)" <<< "$report" ||
  { echo "FAIL: the flight report does not show the receive stage 0 waits in"; exit 1; }
! grep -q "desynchronised" <<< "$report" || { echo "FAIL: the flight report reads a desync from the messages"; exit 1; }
echo "pipeline stall: the job ended after $elapsed s naming stage 1 (world rank 1) as the one stage 0 waits on"
