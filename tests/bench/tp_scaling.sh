#!/usr/bin/env bash
# Tensor parallelism against data parallelism on the same ranks, and what it saves per rank.
#   1. A deck (default input/small.yaml) on 2 ranks as dp_shard 2 (mesh.tp 1), as tp 2 and as tp 2 with sequence
#      parallelism (mesh.tp_sequence_parallel): median tokens/s
#      over the steps after the first, the exposed communication per step (all-gathers, reduce-scatters and
#      tensor-parallel all-reduces the compute waited on), and the planned bytes per rank (parameters,
#      gradients, optimizer state, activations) next to the measured peak.
#   2. The same deck on tp 1, 2 and 4 ranks (no data parallelism), without and with sequence parallelism: the
#      planner's activation bytes per rank, its total against the measured peak (must agree within 5%), and the
#      ratio tp 4 / tp 1 of activation bytes.
#   tests/bench/tp_scaling.sh [--fsdpp build/bin/fsdpp] [--deck input/small.yaml] [--steps 6] [--rounds 2]
#                             [overrides...]
# The modes of part 1 run in turn, --rounds times, so that machine noise falls on both alike.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
fsdpp=build/bin/fsdpp deck=input/small.yaml steps=6 rounds=2
# shellcheck source=tests/bench/options.sh
source tests/bench/options.sh "$@"
global=$("$fsdpp" plan "$deck" "${overrides[@]}" --ranks 1 --json |
         python3 -c 'import json, sys; p = json.load(sys.stdin); print(p["micro_batch"] * p["accum_steps"])')

# run <label> <ranks> <tp> <steps> [sp]: trains, appends "label ranks tp measured_MiB plan.json ms,... comm,... tok/s,..."
results="$work/results.txt"
run() {
  local label=$1 n=$2 tp=$3 k=$4 sp=${5:-false}
  local dp=$((n / tp))
  local args=("${overrides[@]}" "mesh.tp=$tp" "mesh.tp_sequence_parallel=$sp" "train.global_batch=$global"
              "train.micro_batch=$((global / dp))")
  local out="$work/run-$label-$RANDOM"
  "$fsdpp" plan "$deck" "${args[@]}" --ranks "$n" --json >"$out.plan.json"
  mpiexec -n "$n" "$fsdpp" train "$deck" "${args[@]}" "train.steps=$k" train.eval_interval=0 schedule.warmup_steps=1 \
    log.interval=1 checkpoint.interval=0 "run.output=$out" >"$out.log" 2>&1 ||
    { tail -20 "$out.log" >&2; echo "error: training $label on $n ranks failed" >&2; exit 1; }
  local measured
  measured=$(grep -E "^[A-Za-z]+ allocations +\|" "$out.log" | awk -F'|' '{gsub(/ /, "", $4); print $4}')
  python3 - "$out/metrics.jsonl" "$label" "$n" "$tp" "$measured" "$out.plan.json" >>"$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])][1:]
print(" ".join(sys.argv[2:7]), *(",".join(str(r[k]) for r in rows) for k in ("ms_per_step", "exposed_comm_ms", "tokens_per_s")))
PY
}
for round in $(seq "$rounds"); do
  run dp2 2 1 "$steps"
  run tp2 2 2 "$steps"
  run tp2_sp 2 2 "$steps" true
done
for tp in 1 2 4; do run "tp$tp-alone" "$tp" "$tp" 2; done
for tp in 2 4; do run "tp$tp-sp-alone" "$tp" "$tp" 2 true; done

python3 - "$results" "$deck" <<'EOF'
import json, statistics, sys
runs = {}
for r in (l.split() for l in open(sys.argv[1])):
    runs.setdefault(r[0], []).append(r)
deck = sys.argv[2]
out = {"bench": "tp_scaling", "deck": deck}
def summary(label):
    rs = runs[label]
    plan = json.load(open(rs[0][4]))["bytes_per_rank"]
    ms = statistics.median([float(x) for r in rs for x in r[5].split(",")])
    comm = statistics.median([float(x) for r in rs for x in r[6].split(",")])
    tps = statistics.median([float(x) for r in rs for x in r[7].split(",")])
    return {"ms_per_step": ms, "exposed_comm_ms": comm, "tokens_per_s": tps, "measured_peak_mib": max(float(r[3]) for r in rs),
            "planned": {k: plan[k] for k in ("parameters", "gradients", "optimizer", "activations", "total")}}
dp2, tp2, tp2_sp = summary("dp2"), summary("tp2"), summary("tp2_sp")
print("part 1: 2 ranks, the same global batch")
print("%-8s %12s %12s %16s %14s %14s %14s %14s" % ("layout", "ms_per_step", "tokens/s", "exposed_comm_ms",
      "params_MiB", "optim_MiB", "activ_MiB", "peak_MiB"))
for label, s in (("dp2", dp2), ("tp2", tp2), ("tp2_sp", tp2_sp)):
    p = s["planned"]
    print("%-8s %12.1f %12.0f %16.2f %14.2f %14.2f %14.2f %14.1f" % (label, s["ms_per_step"], s["tokens_per_s"], s["exposed_comm_ms"],
          p["parameters"] / 2**20, p["optimizer"] / 2**20, p["activations"] / 2**20, s["measured_peak_mib"]))
    out[label] = s
out["tp2_vs_dp2_tokens_per_s"] = round(tp2["tokens_per_s"] / dp2["tokens_per_s"], 3)
out["tp2_sp_vs_dp2_tokens_per_s"] = round(tp2_sp["tokens_per_s"] / dp2["tokens_per_s"], 3)
print("tokens/s tp2 / dp2: %.3f, tp2 with sp / dp2: %.3f (medians; the same tokens per step)"
      % (out["tp2_vs_dp2_tokens_per_s"], out["tp2_sp_vs_dp2_tokens_per_s"]))
print()
print("part 2: tp alone on 1, 2, 4 ranks (sp: with sequence parallelism): planned activation bytes per rank; planned total vs measured peak")
print("%-6s %18s %18s %18s %10s" % ("tp", "activations_MiB", "planned_MiB", "measured_MiB", "error"))
worst = 0.0
for tp in (1, 2, 4, "2-sp", "4-sp"):
    r = runs[f"tp{tp}-alone"][0]
    plan = json.load(open(r[4]))["bytes_per_rank"]
    measured = float(r[3])
    planned = plan["total"] / 2**20
    err = (planned - measured) / measured
    worst = max(worst, abs(err))
    out[f"tp{tp}_alone".replace("-", "_")] = {"activation_bytes": plan["activations"], "planned_peak_mib": round(planned, 1),
                      "measured_peak_mib": measured}
    print("%-6s %18.1f %18.1f %18.1f %9.2f%%" % (tp, plan["activations"] / 2**20, planned, measured, 100 * err))
out["activation_bytes_ratio_tp4_v1"] = round(out["tp4_alone"]["activation_bytes"] / out["tp1_alone"]["activation_bytes"], 3)
out["activation_bytes_ratio_tp4_sp_v1"] = round(out["tp4_sp_alone"]["activation_bytes"] / out["tp1_alone"]["activation_bytes"], 3)
out["plan_vs_measured_worst"] = round(worst, 4)
print("activation bytes tp4 / tp1: %.3f (with sp %.3f); largest plan error %.2f%% (bound 5%%)"
      % (out["activation_bytes_ratio_tp4_v1"], out["activation_bytes_ratio_tp4_sp_v1"], 100 * worst))
print(json.dumps(out))
sys.exit(0 if worst <= 0.05 else 1)
EOF
