#!/usr/bin/env bash
# A rank stopped with SIGSTOP mid-step (np ranks, the stopped one: np - 1 ... chosen as rank np/2): the others
# wait in a collective; the watchdog (comm.timeout_s 3) ends the job within seconds, the aborting rank's log
# line names the stopped rank and its host as not answering, and `fsdpp debug flight` names it: it never
# entered the collective the others wait in, left no dump, or entered it and was too late to answer.
set -u
fsdpp=$1; mpirun=$2; np=$3; dir=$4
rm -rf "$dir"; mkdir -p "$dir"
# shellcheck source=tests/flight/lib.sh
. "$(dirname "$0")/lib.sh"
stopped=$((np / 2))
"$mpirun" -n "$np" "$fsdpp" train train.steps=500 schedule.warmup_steps=2 train.micro_batch=4 train.eval_interval=0 log.interval=1 \
  comm.timeout_s=3 "run.output=$dir/run" > "$dir/run.log" 2>&1 &
launcher=$!
wait_for_steps "$dir/run" 4 || { kill "$launcher"; fail "no steps logged"; }
pid=$(rank_pid "$launcher" "$stopped") || { kill "$launcher"; fail "rank $stopped not found among mpiexec's children"; }
t0=$(date +%s%N)
kill -STOP "$pid"
wait "$launcher"; rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
gone=$(wait_gone "$pid" 15 "$t0") || { kill -9 "$pid"; fail "the stopped rank $stopped (pid $pid) outlived the job"; }
grep -E "collective watchdog|flight recorder" "$dir/run.log"
echo "exit code $rc, $ms ms after rank $stopped was stopped (its process gone after $gone ms)"
[ "$rc" != 0 ] || fail "the job exited 0"
[ "$ms" -lt 18000 ] || fail "the job took $ms ms to end (comm.timeout_s 3)"
grep -Eq "^\[rank [0-9]+\] flight recorder: .*rank $stopped on $host did not answer a request to dump" "$dir/run.log" \
  || fail "no rank's log line names rank $stopped on $host as not answering"
"$fsdpp" debug flight "$dir/run/flight" > "$dir/report.txt" || fail "fsdpp debug flight failed"
cat "$dir/report.txt"
grep -Eq "The job hangs in .* collective #[0-9]+, " "$dir/report.txt" || fail "the report names no collective"
grep -Eq "found rank $stopped on $host not answering" "$dir/report.txt" || fail "the report does not name rank $stopped on $host"
grep -Eq "rank $stopped on $host (never entered it|left no dump|entered it too but did not answer)" "$dir/report.txt" \
  || fail "the report does not say where rank $stopped on $host stands in the collective the others wait in"
echo "stopped rank: the job ended after $ms ms; the log and fsdpp debug flight name rank $stopped on $host"
