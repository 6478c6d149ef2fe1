#!/usr/bin/env bash
# fsdpp report renders a PNG of plausible size from a real run's metrics: a dense model's (three panels), and a
# mixture of experts' trained with expert parallelism (a fourth: the expert load per sparse layer).
set -eu
fsdpp=$1; mpirun=$2; dir=$3
rm -rf "$dir" "$dir-moe"
"$mpirun" -n 2 "$fsdpp" train train.steps=40 train.eval_interval=20 log.interval=5 "run.output=$dir" > /dev/null
"$mpirun" -n 2 "$fsdpp" train "$(dirname "$0")/../../input/qwen3-moe-tiny.yaml" train.steps=20 schedule.warmup_steps=2 train.eval_interval=0 \
  log.interval=5 mesh.ep=2 "run.output=$dir-moe" > /dev/null
check() {
  "$fsdpp" report "$1"
  [ "$(od -An -tx1 -N8 "$1/report.png" | tr -d ' \n')" = 89504e470d0a1a0a ] || { echo "FAIL: not a PNG"; exit 1; }
  read -r w1 w2 w3 w4 h1 h2 h3 h4 < <(od -An -tu1 -j16 -N8 "$1/report.png")
  width=$(( (w1 << 24) | (w2 << 16) | (w3 << 8) | w4 )); height=$(( (h1 << 24) | (h2 << 16) | (h3 << 8) | h4 ))
  echo "$(basename "$1")/report.png: ${width}x${height}, $(wc -c < "$1/report.png") bytes"
  [ "$width" -ge 600 ] && [ "$height" -ge 400 ] && [ "$(wc -c < "$1/report.png")" -gt 10000 ] || { echo "FAIL: implausible PNG"; exit 1; }
}
check "$dir"
check "$dir-moe"
grep -q '"expert_load_per_layer":\[[0-9.]*,[0-9.]*\]' "$dir-moe/metrics.jsonl" || { echo "FAIL: no per-layer load"; exit 1; }
