#!/usr/bin/env bash
# run.trace and `fsdpp report --trace --json` (docs/trace.md): a 2-rank run (full_shard), 4-rank runs
# (dp_shard 2 x tp 2; HSDP 2 x 2 with activation checkpointing) and a 2-stage 1F1B pipeline (x dp_shard 2) record steps 2-3; tests/cli/trace_check.py checks
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
# A 1F1B pipeline (pp 2 x dp_shard 2, 4 micro-batches): each rank's action spans ran in 1F1B's order
# (PipeDream-flush, written out here independently of parallel/pipeline_schedule.cpp), and the report draws them,
# a row per rank.
run pipeline 4 mesh.pp=2 mesh.dp_shard=2 model.n_layer=4 train.micro_batch=2
python3 "$here/trace_check.py" "$work/pipeline" 4 "$work/pipeline.report.json" dp_shard --span "fsdpp::pipeline_receive"
python3 - "$work/pipeline.report.json" <<'PY' || exit 1
import json, sys
p, m, world = 2, 4, 4
want = []
for rank in range(world):
    r = rank // (world // p)  # the rank's stage: consecutive ranks form one
    warm = min(p - 1 - r, m)
    order = [f"F{i}@s{r}" for i in range(warm)]
    for i in range(m - warm):
        order += [f"F{i + warm}@s{r}", f"B{i}@s{r}"]
    order += [f"B{i}@s{r}" for i in range(m - warm, m)]
    want.append(order + order)  # two traced steps
got = json.load(open(sys.argv[1]))["pipeline"]
if got["order"] != want:
    print("FAIL: pipeline order as traced", got["order"], "want", want); sys.exit(1)
rows = got["picture"].splitlines()
if len(rows) != world or not all(row.startswith(f"rank {r} |") for r, row in enumerate(rows)) or \
        not all(str(i) in rows[r] and chr(ord("a") + i) in rows[r] for r in range(world) for i in range(m)):
    print("FAIL: pipeline picture", got["picture"]); sys.exit(1)
# a stage keeps its blocks whole from its first forward to its last backward: one all-gather per unit and step
# (2 blocks and the root per stage, 2 traced steps), where resharding after each backward would gather 4 times
import os
run = os.path.dirname(sys.argv[1]) + "/pipeline"
for rank in range(world):
    counters = json.load(open(f"{run}/trace/rank{rank}.json"))["otherData"]["counters"]
    if counters["fsdp_all_gathers"] != 3 * 2:
        print(f"FAIL: rank {rank}: {counters['fsdp_all_gathers']} all-gathers in 2 steps, want 6 (3 units x 2 steps)")
        sys.exit(1)
print("pipeline trace OK:", got["unit_ms"], "ms per character\n" + got["picture"])
PY
# The text form names the units and says where it wrote.
"$fsdpp" report "$work/tp2" --trace > "$work/tp2.report.txt" 2>&1
grep -q "^  h\.0 " "$work/tp2.report.txt" && grep -q "wrote .*merged.json" "$work/tp2.report.txt" ||
  { echo "FAIL: report --trace text:"; cat "$work/tp2.report.txt"; exit 1; }
echo "cli_trace OK"
