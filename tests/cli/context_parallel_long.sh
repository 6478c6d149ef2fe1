#!/usr/bin/env bash
# context_parallel_long.sh FSDPP MPIEXEC ROOT WORK: input/llama-long.yaml, its context shortened from 16384 to 4096
# by an override, trains a step on 2 ranks with cp 2, its measured peak of fsdpp's Views per rank within 1% of
# `fsdpp plan`'s, and its activations per rank (the measured peak less the plan's parameters, gradients, optimizer
# state and batch) at most 0.55 of cp 1's, taken from the plan of cp 1 on 1 rank (cli_plan_vs_measured and the
# context_parallel benchmark hold that plan to its measurement). The deck's model has fused attention (no T^2
# buffers), so every activation scales with T and the ratio does not depend on it (the plan's is 0.544 at every
# T from 1024 to 16384): T 4096 checks the same ring of 4 chunks (r and 3 - r) in about 1/16 of the time a step
# at T 16384 takes (145 s on two busy CPU cores, and running cp 1 there would cost 45 s a step).
set -euo pipefail
fsdpp=$1 mpiexec=$2 root=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
deck=$root/input/llama-long.yaml
T=4096
steps=(train.steps=1 schedule.warmup_steps=0 "model.context_length=$T")
"$fsdpp" plan "$deck" "${steps[@]}" mesh.cp=1 --ranks 1 --json >"$work/cp1.json"
"$fsdpp" plan "$deck" "${steps[@]}" --ranks 2 --json >"$work/cp2.json"
"$mpiexec" -n 2 "$fsdpp" train "$deck" "${steps[@]}" "run.output=$work/run" >"$work/train.log" 2>&1 ||
  { tail -30 "$work/train.log"; echo "FAIL: llama-long on 2 ranks with cp 2"; exit 1; }
python3 - "$work" "$T" <<'PY'
import json, re, sys
work, T = sys.argv[1], sys.argv[2]
cp1 = json.load(open(f"{work}/cp1.json"))["bytes_per_rank"]
cp2 = json.load(open(f"{work}/cp2.json"))["bytes_per_rank"]
log = open(f"{work}/train.log").read()
peak = float(re.search(r"^\w+ allocations\s+\|\s+[\d.]+\s+\|\s+[\d.]+\s+\|\s+([\d.]+)", log, re.M).group(1))
mib = 1048576
planned = cp2["total"] / mib
error = (planned - peak) / peak
activations = peak - (cp2["total"] - cp2["activations"]) / mib
ratio = activations / (cp1["activations"] / mib)
print(f"T {T}, cp 2 on 2 ranks: measured peak {peak:.1f} MiB per rank, planned {planned:.1f} MiB "
      f"({100 * error:+.2f}%); activations {activations:.1f} MiB against cp 1's planned {cp1['activations'] / mib:.1f} "
      f"MiB: {ratio:.3f}")
ok = abs(error) <= 0.01 and ratio <= 0.55
print("context_parallel_long: " + ("plan within 1%, activations per rank at most 0.55 of cp 1's" if ok else "FAIL"))
sys.exit(0 if ok else 1)
PY
