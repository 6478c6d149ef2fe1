#!/usr/bin/env bash
# moe_balance.sh FSDPP MPIEXEC ROOT WORK: model.moe.balance: bias (DeepSeek-V3's aux-loss-free balancing) on
# input/qwen3-moe-tiny.yaml, 2 ranks with expert parallelism ep 2, 200 steps. Over steps 101-200 the busiest
# expert's tokens over the mean (metrics.jsonl, averaged over the sparse layers' worst) must fall below 0.9 x that
# of balance: none on the same run, and the routing bias must survive a checkpoint: resumed from step 100 (on 1
# rank, ep 1: the bias reshards with the model), steps 101-110 give the uninterrupted run's expert loads exactly and
# its losses within 1e-6 (another mesh sums in another order).
set -euo pipefail
fsdpp=$1 mpiexec=$2 root=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
common=(train.steps=200 schedule.warmup_steps=10 log.interval=1 train.eval_interval=0 model.moe.aux_loss_coef=0)
"$mpiexec" -n 2 "$fsdpp" train "$root/input/qwen3-moe-tiny.yaml" "${common[@]}" model.moe.balance=none mesh.ep=2 \
  "run.output=$work/none" >"$work/none.log"
"$mpiexec" -n 2 "$fsdpp" train "$root/input/qwen3-moe-tiny.yaml" "${common[@]}" model.moe.balance=bias mesh.ep=2 \
  checkpoint.interval=100 "run.output=$work/bias" >"$work/bias.log"
mkdir -p "$work/resume-from"
cp "$work/bias/checkpoints/step_00000100.h5" "$work/resume-from/" && echo step_00000100.h5 >"$work/resume-from/latest"
"$mpiexec" -n 1 "$fsdpp" train "$root/input/qwen3-moe-tiny.yaml" "${common[@]}" model.moe.balance=bias \
  checkpoint.resume=true "checkpoint.dir=$work/resume-from" "run.output=$work/resumed" >"$work/resumed.log"
python3 - "$work" <<'PY'
import json, statistics, sys
work = sys.argv[1]
def rows(name):
    return {r["step"]: r for r in (json.loads(l) for l in open(f"{work}/{name}/metrics.jsonl")) if "loss" in r}
none, bias, resumed = rows("none"), rows("bias"), rows("resumed")
def late_load(run):
    return statistics.mean(run[s]["expert_load_max_over_mean"] for s in range(101, 201))
a, b = late_load(none), late_load(bias)
print(f"steps 101-200, busiest expert's tokens over the mean: balance none {a:.3f}, bias {b:.3f} ({b / a:.3f}x)")
if not b < 0.9 * a:
    sys.exit(f"FAIL: balance: bias did not even out the load ({b:.3f} vs none's {a:.3f})")
worst = 0.0
for s in range(101, 111):
    if resumed[s]["expert_load_per_layer"] != bias[s]["expert_load_per_layer"]:
        sys.exit(f"FAIL: step {s} resumed routes otherwise: {resumed[s]['expert_load_per_layer']} vs {bias[s]['expert_load_per_layer']}")
    worst = max(worst, abs(resumed[s]["loss"] - bias[s]["loss"]) / bias[s]["loss"])
print(f"resumed at step 100 on 1 rank (ep 1): steps 101-110 route as the uninterrupted run, losses within {worst:.1e}")
if worst > 1e-6:
    sys.exit(f"FAIL: resumed losses differ by {worst:.1e}")
PY
