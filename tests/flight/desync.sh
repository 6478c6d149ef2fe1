#!/usr/bin/env bash
# A rank skips one collective (test-only switch FSDPP_TEST_SKIP_COLLECTIVE=1:dp_shard:12): the ranks pair up the
# wrong collectives from there on; the job ends within seconds (the watchdog, comm.timeout_s 3, or an MPI error),
# every rank's records are dumped, and `fsdpp debug flight` names dp_shard collective #12 as the first that
# differs between the ranks, with what each issued.
set -u
fsdpp=$1; mpirun=$2; dir=$3
rm -rf "$dir"; mkdir -p "$dir"
# shellcheck source=tests/flight/lib.sh
. "$(dirname "$0")/lib.sh"
start=$(date +%s%N)
FSDPP_TEST_SKIP_COLLECTIVE=1:dp_shard:12 "$mpirun" -n 2 "$fsdpp" train train.steps=40 schedule.warmup_steps=2 \
  train.eval_interval=0 comm.timeout_s=3 "run.output=$dir/run" > "$dir/run.log" 2>&1
rc=$?
ms=$((($(date +%s%N) - start) / 1000000))
grep -E "error|flight recorder" "$dir/run.log"
echo "exit code $rc after $ms ms"
[ "$rc" != 0 ] || fail "the desynchronised job exited 0"
grep -Eq "flight recorder: .*fsdpp debug flight $dir/run/flight" "$dir/run.log" || fail "the log does not point at fsdpp debug flight"
"$fsdpp" debug flight "$dir/run/flight" > "$dir/report.txt" || fail "fsdpp debug flight failed"
cat "$dir/report.txt"
grep -Eq "on dp_shard \(ranks 0 and 1\), collective #12 is not the same collective everywhere: rank 0 on $host issued [a-z_]+ of [0-9]+ f32 \([^)]*\); rank 1 on $host issued [a-z_]+ of [0-9]+ f32" \
  "$dir/report.txt" || fail "the report does not name dp_shard collective #12 and what each rank issued"
echo "desynchronised: fsdpp debug flight names dp_shard collective #12, the one rank 1 skipped"
