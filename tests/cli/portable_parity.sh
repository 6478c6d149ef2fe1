#!/usr/bin/env bash
# Training on the portable (GPU-shaped team) kernels against the tuned host kernels (lib/fsdpp/nn/kernels/
# team.hpp): the same short runs with FSDPP_KERNELS=tuned and =portable must log the same training and
# validation losses within 1e-6 relative, for GPT-2 (the default tiny deck) and llama-tiny, on 1 and 2 ranks.
# Usage: portable_parity.sh <fsdpp> <mpiexec> <llama-tiny deck> <work dir>
set -u
fsdpp=$1; mpirun=$2; llama=$3; work=$4
rm -rf "$work"; mkdir -p "$work"
common=(train.steps=4 train.global_batch=8 train.micro_batch=2 train.eval_interval=2 train.eval_batches=1
        schedule.warmup_steps=1 log.interval=1)
status=0
for model in gpt2 llama; do
  deck=(); [ "$model" = llama ] && deck=("$llama")
  for np in 1 2; do
    for path in tuned portable; do
      out="$work/$model-np$np-$path"
      if ! FSDPP_KERNELS=$path "$mpirun" -n "$np" "$fsdpp" train "${deck[@]}" "${common[@]}" "run.output=$out" \
          > "$out.log" 2>&1; then
        echo "FAIL: $model on $np rank(s), $path kernels, did not train:"; tail -20 "$out.log"; exit 1
      fi
    done
    python3 - "$work/$model-np$np-tuned/metrics.jsonl" "$work/$model-np$np-portable/metrics.jsonl" \
        "$model np=$np" <<'PY' || status=1
import json, sys
tuned = [json.loads(l) for l in open(sys.argv[1])]
portable = [json.loads(l) for l in open(sys.argv[2])]
if len(tuned) != len(portable) or not tuned:
    sys.exit(f"FAIL: {sys.argv[3]}: {len(tuned)} tuned against {len(portable)} portable metric lines")
worst = 0.0
for t, p in zip(tuned, portable):
    for key in ("loss", "val_loss"):
        if t.get(key) is None:
            continue
        worst = max(worst, abs(p[key] - t[key]) / abs(t[key]))
print(f"{sys.argv[3]}: {len(tuned)} steps, largest relative loss difference portable/tuned {worst:.2e}")
if worst > 1e-6:
    sys.exit(f"FAIL: {sys.argv[3]}: losses differ by {worst:.2e} relative (> 1e-6)")
PY
  done
done
exit $status
