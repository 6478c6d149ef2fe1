#!/usr/bin/env bash
# fsdpp report renders a PNG of plausible size from a real run's metrics.
set -eu
fsdpp=$1; mpirun=$2; dir=$3
rm -rf "$dir"
"$mpirun" -n 2 "$fsdpp" train train.steps=40 train.eval_interval=20 log.interval=5 "run.output=$dir" > /dev/null
"$fsdpp" report "$dir"
[ "$(od -An -tx1 -N8 "$dir/report.png" | tr -d ' \n')" = 89504e470d0a1a0a ] || { echo "FAIL: not a PNG"; exit 1; }
read -r w1 w2 w3 w4 h1 h2 h3 h4 < <(od -An -tu1 -j16 -N8 "$dir/report.png")
width=$(( (w1 << 24) | (w2 << 16) | (w3 << 8) | w4 )); height=$(( (h1 << 24) | (h2 << 16) | (h3 << 8) | h4 ))
echo "report.png: ${width}x${height}, $(wc -c < "$dir/report.png") bytes"
[ "$width" -ge 600 ] && [ "$height" -ge 400 ] && [ "$(wc -c < "$dir/report.png")" -gt 10000 ] || { echo "FAIL: implausible PNG"; exit 1; }
