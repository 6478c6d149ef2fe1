#!/usr/bin/env bash
# SIGUSR2 to mpiexec while training: every rank dumps its flight records and says so, the run goes on and ends
# normally with exactly the final loss of the same run without the signal (a dump changes nothing), and
# `fsdpp debug flight` finds no rank aborted.
set -u
fsdpp=$1; mpirun=$2; dir=$3
rm -rf "$dir"; mkdir -p "$dir"
# shellcheck source=tests/flight/lib.sh
. "$(dirname "$0")/lib.sh"
args=(train.steps=40 schedule.warmup_steps=2 train.eval_interval=0 log.interval=1)
"$mpirun" -n 2 "$fsdpp" train "${args[@]}" "run.output=$dir/ref" > "$dir/ref.log" 2>&1 || fail "reference run"
"$mpirun" -n 2 "$fsdpp" train "${args[@]}" "run.output=$dir/run" > "$dir/run.log" 2>&1 &
launcher=$!
wait_for_steps "$dir/run" 5 || { kill "$launcher"; fail "no steps logged"; }
kill -USR2 "$launcher"
wait "$launcher"; rc=$?
grep -E "flight recorder|Loop time" "$dir/run.log"
[ "$rc" = 0 ] || { tail -20 "$dir/run.log"; fail "the run exited $rc after SIGUSR2"; }
for r in 0 1; do
  grep -Eq "^\[rank $r\] flight recorder: SIGUSR2: wrote the last [1-9][0-9]* collectives to $dir/run/flight/rank$r.json; the run goes on" \
    "$dir/run.log" || fail "rank $r did not report its dump"
  grep -q '"reason": "SIGUSR2' "$dir/run/flight/rank$r.json" || fail "rank$r.json is not a SIGUSR2 dump"
done
grep -Eq "Loop time of [0-9.]+ on 2 procs for 40 steps" "$dir/run.log" || fail "the run did not train its 40 steps"
want=$(grep '"step":40,' "$dir/ref/metrics.jsonl" | grep -o '"loss":[^,]*')
got=$(grep '"step":40,' "$dir/run/metrics.jsonl" | grep -o '"loss":[^,]*')
echo "final loss without the signal $want, with it $got"
[ -n "$want" ] && [ "$want" = "$got" ] || fail "the dump changed the final loss"
"$fsdpp" debug flight "$dir/run/flight" | tee "$dir/report.txt" | grep -q "No rank aborted" || { cat "$dir/report.txt"; fail "fsdpp debug flight"; }
echo "live dump: both ranks dumped on SIGUSR2, the run finished with the same final loss"
