#!/usr/bin/env bash
# Activation checkpointing: what it saves and what it costs. Trains a deck (default input/small.yaml) on 1 and
# 2 ranks with train.activation_checkpointing none, every_2 and full, and prints per rank count and mode the
# measured peak (fsdpp's Views, largest over ranks), the planned peak (fsdpp plan), the median ms/step over the
# steps after the first, and the ratios full/none of peak memory and of time; then one JSON line.
#   tests/bench/activation_checkpointing.sh [--fsdpp build/bin/fsdpp] [--deck input/small.yaml] [--steps 6]
#                                           [--rounds 2] [--ranks "1 2"] [overrides...]
# The modes run in turn, --rounds times, so that machine noise falls on all of them alike; the time is the
# median over every timed step of every round.
# The global batch is the deck's, one micro-batch per rank (no accumulation), so each rank count compares the
# three modes on the same work. Extra arguments are deck overrides (e.g. another model shape).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
fsdpp=build/bin/fsdpp deck=input/small.yaml steps=6 rounds=2 ranks="1 2"
# shellcheck source=tests/bench/options.sh
source tests/bench/options.sh "$@"
global=$("$fsdpp" plan "$deck" "${overrides[@]}" --ranks 1 --json |
         python3 -c 'import json, sys; p = json.load(sys.stdin); print(p["micro_batch"] * p["accum_steps"])')

results="$work/results.txt"
for n in $ranks; do
  for round in $(seq "$rounds"); do
    for mode in none every_2 full; do
      args=("${overrides[@]}" "train.global_batch=$global" "train.micro_batch=$((global / n))"
            "train.activation_checkpointing=$mode")
      planned=$("$fsdpp" plan "$deck" "${args[@]}" --ranks "$n" --json | grep -o '"total":[0-9]*' | head -1 | cut -d: -f2)
      out="$work/run-$n-$mode-$round"
      mpiexec -n "$n" "$fsdpp" train "$deck" "${args[@]}" "train.steps=$steps" train.eval_interval=0 \
        schedule.warmup_steps=1 log.interval=1 checkpoint.interval=0 "run.output=$out" >"$out.log" 2>&1 ||
        { tail -20 "$out.log" >&2; echo "error: training on $n ranks with $mode failed" >&2; exit 1; }
      measured=$(grep -E "^[A-Za-z]+ allocations +\|" "$out.log" | awk -F'|' '{gsub(/ /, "", $4); print $4}')
      ms=$(python3 -c 'import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(",".join(str(r["ms_per_step"]) for r in rows[1:]))' "$out/metrics.jsonl")
      echo "$n $mode $measured $planned $ms" >>"$results"
    done
  done
done
python3 - "$results" "$deck" "$steps" <<'EOF'
import json, sys
import statistics
runs = {}
for r in (l.split() for l in open(sys.argv[1])):
    runs.setdefault((int(r[0]), r[1]), []).append((float(r[2]), float(r[3]) / 1048576, [float(x) for x in r[4].split(",")]))
# Peaks are the same every round (the largest is kept); times are pooled over rounds.
by = {k: (max(v[0] for v in vs), max(v[1] for v in vs), statistics.median([t for v in vs for t in v[2]]))
      for k, vs in runs.items()}
out = {"bench": "activation_checkpointing", "deck": sys.argv[2], "timed_steps_per_mode": len(runs[next(iter(runs))]) * (int(sys.argv[3]) - 1)}
print("%-6s %-9s %16s %16s %9s %12s" % ("ranks", "mode", "measured_MiB", "planned_MiB", "error", "ms_per_step"))
for (n, m), (meas, plan, ms) in sorted(by.items(), key=lambda kv: (kv[0][0], ["none", "every_2", "full"].index(kv[0][1]))):
    print("%-6d %-9s %16.1f %16.1f %8.2f%% %12.1f" % (n, m, meas, plan, 100 * (plan - meas) / meas, ms))
print()
print("%-6s %24s %20s %26s" % ("ranks", "peak full/none", "time full/none", "peak every_2/none"))
for n in sorted({k[0] for k in by}):
    none, full, every = by[(n, "none")], by[(n, "full")], by[(n, "every_2")]
    out[f"{n}rank"] = {m: {"measured_peak_mib": round(v[0], 1), "planned_peak_mib": round(v[1], 1), "ms_per_step": round(v[2], 1)}
                       for m, v in (("none", none), ("every_2", every), ("full", full))}
    out[f"{n}rank"]["peak_ratio_full_none"] = round(full[0] / none[0], 3)
    out[f"{n}rank"]["time_ratio_full_none"] = round(full[2] / none[2], 3)
    out[f"{n}rank"]["peak_ratio_every2_none"] = round(every[0] / none[0], 3)
    print("%-6d %24.3f %20.3f %26.3f" % (n, full[0] / none[0], full[2] / none[2], every[0] / none[0]))
print(json.dumps(out))
EOF
