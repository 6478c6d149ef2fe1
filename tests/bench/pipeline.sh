#!/usr/bin/env bash
# Pipeline parallelism (mesh.pp, docs/parallelism.md): what its schedules cost on 2 ranks. Trains a small.yaml-shaped
# model of 8 blocks (default) as pp 2 under gpipe, 1f1b and interleaved_1f1b (2 virtual stages: 4 stages of 2
# blocks) at 4, 8 and 16 micro-batches of one sequence, and as dp_shard 2 on the same batch, and prints per layout
# the median ms/step over the steps after the first and the median measured bubble (the share of the micro-batches'
# time the ranks waited for another stage, mean over ranks) beside the schedule's ideal with equal stages
# ((p-1)/(m+p-1) for gpipe and 1f1b, (p-1)/(v m+p-1) interleaved); then one JSON line with bubble_1f1b_measured and
# bubble_1f1b_ideal (m 8), gpipe_over_1f1b, interleaved_over_1f1b and pp2_over_dp2 (ms per step, m 8), and
# zero_bubble_over_1f1b (null until that schedule trains).
#   tests/bench/pipeline.sh [--fsdpp build/bin/fsdpp] [--deck input/small.yaml] [--steps 4] [--rounds 1]
#                           [overrides...]
# The layouts run in turn, --rounds times, so that machine noise falls on all of them alike.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
fsdpp=build/bin/fsdpp deck=input/small.yaml steps=4 rounds=1 ranks=2
# shellcheck source=tests/bench/options.sh
source tests/bench/options.sh model.n_layer=8 "$@"

results="$work/results.txt"
for round in $(seq "$rounds"); do
  for m in 4 8 16; do
    for layout in dp2 gpipe 1f1b interleaved; do
      args=("${overrides[@]}" train.micro_batch=1)
      case "$layout" in
        dp2) args+=(mesh.dp_shard=2 "train.global_batch=$m") ;;  # the same batch: m / 2 micro-batches per rank
        interleaved) args+=(mesh.pp=2 pipeline.schedule=interleaved_1f1b pipeline.virtual_stages=2
                            "train.global_batch=$m") ;;
        *) args+=(mesh.pp=2 "pipeline.schedule=$layout" "train.global_batch=$m") ;;
      esac
      out="$work/run-$layout-$m-$round"
      mpiexec -n 2 "$fsdpp" train "$deck" "${args[@]}" "train.steps=$steps" train.eval_interval=0 \
        schedule.warmup_steps=1 log.interval=1 checkpoint.interval=0 "run.output=$out" >"$out.log" 2>&1 ||
        { tail -20 "$out.log" >&2; echo "error: $layout at $m micro-batches failed" >&2; exit 1; }
      echo "$layout $m $round $out" >>"$results"
    done
  done
done
python3 - "$results" "$deck" <<'PY'
import json, statistics, sys
runs = {}
for layout, m, rnd, out in (l.split() for l in open(sys.argv[1])):
    steps = [json.loads(l) for l in open(out + "/metrics.jsonl")][1:]
    r = runs.setdefault((layout, int(m)), {"ms": [], "bubble": []})
    r["ms"] += [s["ms_per_step"] for s in steps]
    r["bubble"] += [s["pipeline_bubble"] for s in steps if "pipeline_bubble" in s]
ideal = lambda p, m, v=1: (p - 1) / (v * m + p - 1)
layouts = ["dp2", "gpipe", "1f1b", "interleaved"]
ms = lambda layout, m: statistics.median(runs[(layout, m)]["ms"])
bubble = lambda layout, m: statistics.median(runs[(layout, m)]["bubble"]) if runs[(layout, m)]["bubble"] else None
print("%-12s %6s %10s %12s %12s %14s" % ("layout", "m", "ms/step", "bubble_%", "ideal_%", "ms_vs_dp2"))
for (layout, m) in sorted(runs, key=lambda k: (k[1], layouts.index(k[0]))):
    b = bubble(layout, m)
    print("%-12s %6d %10.1f %12s %12s %14.2f" % (layout, m, ms(layout, m), "-" if b is None else "%.1f" % (100 * b),
          "-" if layout == "dp2" else "%.1f" % (100 * ideal(2, m, 2 if layout == "interleaved" else 1)),
          ms(layout, m) / ms("dp2", m)))
out = {"bench": "pipeline", "deck": sys.argv[2], "ranks": 2, "pp": 2,
       "bubble_1f1b_measured": round(bubble("1f1b", 8), 4), "bubble_1f1b_ideal": round(ideal(2, 8), 4),
       "gpipe_over_1f1b": round(ms("gpipe", 8) / ms("1f1b", 8), 3), "pp2_over_dp2": round(ms("1f1b", 8) / ms("dp2", 8), 3),
       "interleaved_over_1f1b": round(ms("interleaved", 8) / ms("1f1b", 8), 3), "zero_bubble_over_1f1b": None,
       "bubble_interleaved_measured": round(bubble("interleaved", 8), 4), "bubble_interleaved_ideal": round(ideal(2, 8, 2), 4)}
for m in (4, 8, 16):
    out[f"m{m}"] = {l: {"ms_per_step": round(ms(l, m), 1), "bubble": bubble(l, m)} for l in layouts}
print()
print(json.dumps(out))
PY
