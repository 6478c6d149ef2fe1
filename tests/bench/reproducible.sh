#!/usr/bin/env bash
# Reproducible mode (train.reproducible, docs/reproducible.md): what it costs. Trains a deck (default
# input/small.yaml) on 1 and 2 ranks in the default mode and in reproducible mode with units of 1 sequence (the
# default: any layout) and of global_batch / 2 sequences (one unit per rank on 2 ranks), and prints per rank
# count and mode the median tokens/s over the steps after the first, the measured peak of fsdpp's Views (largest
# over ranks), the bytes rank 0's collectives moved in one step (from run.trace), and whether the reproducible
# runs' losses and gradient norms are bitwise those of the 1-rank run of the same unit; then one JSON line with
# slowdown_2ranks (reproducible unit 1 / default, ms per step), memory_ratio_2ranks and bitwise_configs.
#   tests/bench/reproducible.sh [--fsdpp build/bin/fsdpp] [--deck input/small.yaml] [--steps 5] [--rounds 1]
#                               [--ranks "1 2"] [overrides...]
# The modes run in turn, --rounds times, so that machine noise falls on all of them alike.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
fsdpp=build/bin/fsdpp deck=input/small.yaml steps=5 rounds=1 ranks="1 2"
# shellcheck source=tests/bench/options.sh
source tests/bench/options.sh "$@"
global=$("$fsdpp" plan "$deck" "${overrides[@]}" --ranks 1 --json |
         python3 -c 'import json, sys; p = json.load(sys.stdin); print(p["micro_batch"] * p["accum_steps"])')
half=$((global / 2))

results="$work/results.txt"
for n in $ranks; do
  for round in $(seq "$rounds"); do
    for mode in default unit1 "unit$half"; do
      args=("${overrides[@]}" "train.global_batch=$global" "train.micro_batch=$((global / n))")
      case "$mode" in
        default) ;;
        *) args+=(train.reproducible=true "train.reproducible_unit=${mode#unit}") ;;
      esac
      out="$work/run-$n-$mode-$round"
      mpiexec -n "$n" "$fsdpp" train "$deck" "${args[@]}" "train.steps=$steps" train.eval_interval=0 \
        schedule.warmup_steps=1 log.interval=1 checkpoint.interval=0 run.trace=2 "run.output=$out" >"$out.log" 2>&1 ||
        { tail -20 "$out.log" >&2; echo "error: training on $n ranks in mode $mode failed" >&2; exit 1; }
      measured=$(grep -E "^[A-Za-z]+ allocations +\|" "$out.log" | awk -F'|' '{gsub(/ /, "", $4); print $4}')
      echo "$n $mode $round $measured $out" >>"$results"
    done
  done
done
python3 - "$results" "$deck" "$global" <<'EOF'
import json, statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
runs = {}
for n, mode, rnd, peak, out in rows:
    steps = [json.loads(l) for l in open(out + "/metrics.jsonl")]
    trace = json.load(open(out + "/trace/rank0.json"))
    sent = sum(e["args"]["bytes"] for e in trace["traceEvents"] if "bytes" in e.get("args", {}))
    r = runs.setdefault((int(n), mode), {"ms": [], "tokens_per_s": [], "peak": 0.0, "bytes": sent, "series": None})
    r["ms"] += [s["ms_per_step"] for s in steps[1:]]
    r["tokens_per_s"] += [s["tokens_per_s"] for s in steps[1:]]
    r["peak"] = max(r["peak"], float(peak))
    r["series"] = [(s["loss"], s["grad_norm"]) for s in steps]
modes = sorted({m for _, m in runs}, key=lambda m: (m != "default", len(m), m))
print("%-6s %-9s %12s %12s %14s %16s %9s" % ("ranks", "mode", "tokens/s", "ms/step", "peak_MiB", "bytes/step(r0)", "bitwise"))
bitwise, compared = 0, 0
for (n, m), r in sorted(runs.items(), key=lambda kv: (kv[0][0], modes.index(kv[0][1]))):
    same = ""
    if m != "default" and n != 1 and (1, m) in runs:
        compared += 1
        ok = r["series"] == runs[(1, m)]["series"]
        bitwise += ok
        same = "yes" if ok else "NO"
    print("%-6d %-9s %12.0f %12.1f %14.1f %16d %9s" % (n, m, statistics.median(r["tokens_per_s"]),
          statistics.median(r["ms"]), r["peak"], r["bytes"], same))
out = {"bench": "reproducible", "deck": sys.argv[2], "global_batch": int(sys.argv[3])}
for (n, m), r in runs.items():
    out[f"{n}rank_{m}"] = {"tokens_per_s": round(statistics.median(r["tokens_per_s"]), 1),
                           "ms_per_step": round(statistics.median(r["ms"]), 1), "peak_mib": r["peak"],
                           "bytes_per_step_rank0": r["bytes"]}
if (2, "default") in runs:
    base = runs[(2, "default")]
    for m in modes[1:]:
        if (2, m) in runs:
            key = "" if m == "unit1" else "_" + m
            out["slowdown_2ranks" + key] = round(statistics.median(runs[(2, m)]["ms"]) / statistics.median(base["ms"]), 3)
            out["memory_ratio_2ranks" + key] = round(runs[(2, m)]["peak"] / base["peak"], 3)
            out["bytes_ratio_2ranks" + key] = round(runs[(2, m)]["bytes"] / base["bytes"], 3)
out["bitwise_configs"] = f"{bitwise}/{compared}"
print()
print("slowdown and memory on 2 ranks, reproducible / default: " +
      ", ".join(f"{m}: {out.get('slowdown_2ranks' + ('' if m == 'unit1' else '_' + m))}x time, "
                f"{out.get('memory_ratio_2ranks' + ('' if m == 'unit1' else '_' + m))}x memory" for m in modes[1:]))
print(json.dumps(out))
EOF
