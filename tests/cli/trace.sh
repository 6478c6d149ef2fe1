#!/usr/bin/env bash
# run.trace and `fsdpp report --trace --json` (docs/trace.md): a 2-rank run (full_shard) and 4-rank runs
# (dp_shard 2 x tp 2; HSDP 2 x 2 with activation checkpointing) record steps 2-3; tests/cli/trace_check.py checks
# the files, the merge and the report.
# Usage: trace.sh <fsdpp> <mpiexec> <tiny.yaml> <work dir>
set -eu
fsdpp=$1; mpirun=$2; deck=$3; work=$4
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work"
mkdir -p "$work"
common="train.steps=3 schedule.warmup_steps=1 train.eval_interval=0 run.trace=2-3"
run() {  # <name> <ranks> [overrides...]
  local name=$1 np=$2
  shift 2
  "$mpirun" -n "$np" "$fsdpp" train "$deck" $common "run.output=$work/$name" "$@" > "$work/$name.log" 2>&1 ||
    { echo "FAIL: fsdpp train ($name) failed:"; tail -20 "$work/$name.log"; exit 1; }
  "$fsdpp" report "$work/$name" --trace --json > "$work/$name.report.json" 2> "$work/$name.report.log" ||
    { echo "FAIL: fsdpp report --trace ($name) failed:"; cat "$work/$name.report.log"; exit 1; }
  [ -s "$work/$name/trace/trace.png" ] || { echo "FAIL: no trace.png ($name)"; exit 1; }
}
run full_shard 2
python3 "$here/trace_check.py" "$work/full_shard" 2 "$work/full_shard.report.json" dp_shard
run tp2 4 mesh.tp=2
python3 "$here/trace_check.py" "$work/tp2" 4 "$work/tp2.report.json" dp_shard tp
# HSDP 2 x 2 with activation checkpointing: the replicas' all-reduces, and each block's recompute span.
run hsdp 4 fsdp.strategy=hybrid_shard mesh.dp_replicate=2 train.micro_batch=4 train.activation_checkpointing=full
python3 "$here/trace_check.py" "$work/hsdp" 4 "$work/hsdp.report.json" dp_shard dp_replicate \
  --span "fsdpp::recompute h.0" --span "fsdpp::recompute h.1"
# The text form names the units and says where it wrote.
"$fsdpp" report "$work/tp2" --trace > "$work/tp2.report.txt" 2>&1
grep -q "^  h\.0 " "$work/tp2.report.txt" && grep -q "wrote .*merged.json" "$work/tp2.report.txt" ||
  { echo "FAIL: report --trace text:"; cat "$work/tp2.report.txt"; exit 1; }
echo "cli_trace OK"
