#!/usr/bin/env bash
# A rank held at the end of a step, where the host-side collectives (peak memory, the preemption check) run:
# gdb stops rank 1 at a breakpoint in peak_host_memory_bytes, just before its all-reduce. Rank 0 must not wait
# forever: the watchdog (comm.timeout_s 15) ends the job and names the world all-reduce. Before the fix that
# all-reduce was a plain MPI call the watchdog did not see, and flight_stopped_rank hung now and then.
set -u
fsdpp=$1; mpirun=$2; dir=$3
rm -rf "$dir"; mkdir -p "$dir"
# shellcheck source=tests/flight/lib.sh
. "$(dirname "$0")/lib.sh"
command -v gdb >/dev/null || fail "gdb is not installed (share/scripts/quickstart test installs it)"
"$mpirun" -n 2 "$fsdpp" train train.steps=500 schedule.warmup_steps=2 train.micro_batch=4 train.eval_interval=0 \
  log.interval=1 comm.timeout_s=15 "run.output=$dir/run" > "$dir/run.log" 2>&1 &
launcher=$!
wait_for_steps "$dir/run" 3 || { kill "$launcher"; fail "no steps logged"; }
pid=$(rank_pid "$launcher" 1) || { kill "$launcher"; fail "rank 1 not found among mpiexec's children"; }
# gdb holds rank 1 at the breakpoint for 90 s, far past the timeout, then detaches.
timeout 120 gdb -p "$pid" -batch -ex 'break fsdpp::peak_host_memory_bytes' -ex continue \
  -ex 'shell date +%s%N > '"$dir/hit" -ex 'shell sleep 90' > "$dir/gdb.log" 2>&1 &
holder=$!
wait "$launcher"; rc=$?
end=$(date +%s%N)
kill "$holder" 2>/dev/null; wait "$holder" 2>/dev/null; kill -9 "$pid" 2>/dev/null
[ -s "$dir/hit" ] || fail "gdb never reached the breakpoint (the job ended first; see $dir/gdb.log and $dir/run.log)"
ms=$(((end - $(cat "$dir/hit")) / 1000000))
grep -E "collective watchdog|flight recorder" "$dir/run.log"
[ "$rc" != 0 ] || fail "the job exited 0"
[ "$ms" -lt 30000 ] || fail "the job took $ms ms to end after rank 1 was held at the step's end (comm.timeout_s 15)"
grep -Eq "collective watchdog: all_reduce over the job's ranks" "$dir/run.log" \
  || fail "the watchdog did not name the world all-reduce rank 0 waits in"
echo "held at the step's end: the job ended $ms ms after rank 1 stopped; the watchdog named the world all-reduce"
