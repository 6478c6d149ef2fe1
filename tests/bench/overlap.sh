#!/usr/bin/env bash
# Communication hidden behind compute: each layout trained with comm.overlap=false (every reduce-scatter, replica
# all-reduce and tensor-parallel collective blocks, as before overlap; all-gathers are prefetched either way) and
# with comm.overlap=true, the steps after the first traced (run.trace) and read back by `fsdpp report --trace`:
#   ms/step and tokens/s (median over the timed steps of every round), the communication time per step (each
#   collective from its start to its completion, summed over the communicators; mean over ranks) and the part
#   of it the compute waited on (the wait and blocking spans of the compute track), and their ratio: the exposed
#   fraction.
# Layouts, each for input/small.yaml and input/llama-tiny.yaml:
#   local   full_shard (dp_shard 2) and tp 2 on 2 ranks; HSDP (dp_replicate 2 x dp_shard 2) on 4 ranks
#   nodes   where a virtual cluster can be made (tests/cluster/vcluster, root): 2 nodes x 1 rank, full_shard and
#           tp 2 across the nodes, and HSDP 2 nodes x 2 ranks (replicas across), with the links shaped so that
#           the communication of full_shard takes about as long as its compute: the rate is calibrated from an
#           unshaped run (bytes each node sends per step / compute seconds per step).
#   tests/bench/overlap.sh [--fsdpp build/bin/fsdpp] [--steps 6] [--rounds 2] [--decks "input/small.yaml ..."]
#                          [--nodes auto|off] [overrides...]
# Modes alternate within each round so that machine noise falls on both. The last line is one JSON object with
# exposed_fraction_before/after (the worst of the configurations whose communication is at most its compute),
# speedup (median over configurations of ms/step before / after) and every configuration's figures.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
fsdpp=build/bin/fsdpp deck=input/small.yaml steps=6 rounds=2 decks="input/small.yaml input/llama-tiny.yaml" nodes=auto
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --decks) decks=$2; shift 2 ;;
    --nodes) nodes=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
# shellcheck source=tests/bench/options.sh
source tests/bench/options.sh "${args[@]+"${args[@]}"}"
fsdpp=$(realpath "$fsdpp")
results="$work/results.txt"
: >"$results"

# train LABEL MODE LAUNCH... -- DECK OVERRIDES...: one run traced from step 2; appends one result line.
train() {
  local label=$1 mode=$2; shift 2
  local launch=()
  while [ "$1" != -- ]; do launch+=("$1"); shift; done
  shift
  local d=$1; shift
  local out="$work/run-${label//\//-}-$mode-$RANDOM"
  "${launch[@]}" "$fsdpp" train "$d" "${overrides[@]+"${overrides[@]}"}" "$@" "comm.overlap=$mode" \
    "train.steps=$steps" "run.trace=2-$steps" train.eval_interval=0 schedule.warmup_steps=1 log.interval=1 \
    checkpoint.interval=0 "run.output=$out" >"$out.log" 2>&1 ||
    { tail -20 "$out.log" >&2; echo "error: $label with comm.overlap=$mode failed" >&2; exit 1; }
  "$fsdpp" report "$out" --trace --json >"$out.trace.json" 2>"$out.report.log" ||
    { cat "$out.report.log" >&2; echo "error: fsdpp report --trace failed for $label" >&2; exit 1; }
  echo "$label $mode $out" >>"$results"
}

# Per-rank batch as in the deck: the global batch follows the number of data-parallel ranks.
local_runs() {
  local d=$1 name
  name=$(basename "$d" .yaml)
  local mb
  mb=$("$fsdpp" plan "$d" "${overrides[@]+"${overrides[@]}"}" --ranks 1 --json |
       python3 -c 'import json, sys; print(json.load(sys.stdin)["micro_batch"])')
  for mode in false true; do
    train "$name/full_shard/2-ranks" "$mode" mpiexec -n 2 -- "$d" "train.micro_batch=$mb" "train.global_batch=$((2 * mb))"
    train "$name/tp2/2-ranks" "$mode" mpiexec -n 2 -- "$d" mesh.tp=2 "train.micro_batch=$mb" "train.global_batch=$mb"
    train "$name/hsdp-2x2/4-ranks" "$mode" mpiexec -n 4 -- "$d" fsdp.strategy=hybrid_shard mesh.dp_replicate=2 \
      mesh.dp_shard=2 "train.micro_batch=$mb" "train.global_batch=$((4 * mb))"
  done
}

cluster_runs() {
  local d=$1 name mb
  name=$(basename "$d" .yaml)
  mb=$("$fsdpp" plan "$d" "${overrides[@]+"${overrides[@]}"}" --ranks 1 --json |
       python3 -c 'import json, sys; print(json.load(sys.stdin)["micro_batch"])')
  for mode in false true; do
    train "$name/full_shard/2-nodes" "$mode" "${job_1x2[@]}" -- "$d" "train.micro_batch=$mb" "train.global_batch=$((2 * mb))"
    train "$name/tp2/2-nodes" "$mode" "${job_1x2[@]}" -- "$d" mesh.tp=2 "train.micro_batch=$mb" "train.global_batch=$mb"
    train "$name/hsdp-2x2/2-nodes" "$mode" "${job_2x2[@]}" -- "$d" fsdp.strategy=hybrid_shard mesh.dp_replicate=2 \
      mesh.dp_shard=2 "train.micro_batch=$mb" "train.global_batch=$((4 * mb))"
  done
}

for round in $(seq "$rounds"); do
  for d in $decks; do local_runs "$d"; done
done

# The virtual cluster: 2 nodes; the bench's jobs run with srun from an allocation made by salloc.
cluster_note="not run (--nodes off)"
if [ "$nodes" = auto ]; then
  if vcluster_up; then
    job_1x2=(srun --mpi=pmix --nodes=2 --ntasks-per-node=1 --cpus-per-task=1 --partition=vc)
    job_2x2=(srun --mpi=pmix --nodes=2 --ntasks-per-node=2 --cpus-per-task=1 --partition=vc)
    # Calibration: full_shard of the first deck, blocking, links unshaped: bytes one node sends per step and
    # the compute seconds per step (ms/step minus the communication waited on).
    d0=${decks%% *}
    before=$(vcluster_bytes)
    mb0=$("$fsdpp" plan "$d0" "${overrides[@]+"${overrides[@]}"}" --ranks 1 --json |
          python3 -c 'import json, sys; print(json.load(sys.stdin)["micro_batch"])')
    train calibrate false "${job_1x2[@]}" -- "$d0" "train.micro_batch=$mb0" "train.global_batch=$((2 * mb0))"
    after=$(vcluster_bytes)
    calib=$(awk '{print $3}' "$results" | tail -1)
    sed -i '$d' "$results"
    rate=$(python3 - "$calib" "$((after - before))" "$steps" <<'PY'
import json, statistics, sys
out, sent, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = [json.loads(l) for l in open(out + "/metrics.jsonl")][1:]
ms = statistics.median(r["ms_per_step"] for r in rows)
t = json.load(open(out + ".trace.json"))
steps_traced = t["steps"][1] - t["steps"][0] + 1
compute_s = (ms - t["total"]["waited_ms"] / steps_traced) / 1000
per_node_per_step = sent / 2 / steps
print(max(1, int(per_node_per_step * 8 / compute_s / 1e6)))
PY
)
    "$V" shape "${rate}mbit" 2>>"$work/vcluster.log"
    cluster_note="2 nodes, links shaped to ${rate} Mbit/s (the full_shard communication of $(basename "$d0") about equal to its compute)"
    for round in $(seq "$rounds"); do
      for d in $decks; do cluster_runs "$d"; done
    done
  else
    cluster_note="not run: $(grep -m1 -E "SKIPPED|error|failed" "$work/vcluster.log" || echo "vcluster up failed")"
  fi
fi

# What tracing costs: off, the timing case's ns per TimelineScope (a Kokkos region push/pop and one atomic load)
# times the compute spans a step records, against a step; on, a traced run against an untraced one.
scope_ns=$(build/bin/fsdpp_unit_tests -tc="*TimelineScope timing*" 2>/dev/null | sed -n 's/.*tracing off: \([0-9.]*\) ns.*/\1/p')
d0=${decks%% *}
mb0=$("$fsdpp" plan "$d0" "${overrides[@]+"${overrides[@]}"}" --ranks 1 --json |
      python3 -c 'import json, sys; print(json.load(sys.stdin)["micro_batch"])')
for round in $(seq "$rounds"); do
  for traced in yes no; do
    out="$work/tracecost-$traced-$round"
    trace_arg="run.trace=2-$steps"; [ $traced = yes ] || trace_arg=run.trace=none
    mpiexec -n 2 "$fsdpp" train "$d0" "${overrides[@]+"${overrides[@]}"}" "train.micro_batch=$mb0" \
      "train.global_batch=$((2 * mb0))" "train.steps=$steps" "$trace_arg" train.eval_interval=0 schedule.warmup_steps=1 \
      log.interval=1 checkpoint.interval=0 "run.output=$out" >"$out.log" 2>&1 || { tail -20 "$out.log" >&2; exit 1; }
    echo "$traced $out" >>"$work/tracecost.txt"
  done
done

python3 - "$results" "$cluster_note" "$work/tracecost.txt" "${scope_ns:-0}" <<'EOF'
import json, statistics, sys
runs = {}
for label, mode, out in (l.split() for l in open(sys.argv[1])):
    rows = [json.loads(l) for l in open(out + "/metrics.jsonl")][1:]
    t = json.load(open(out + ".trace.json"))  # fsdpp report --trace --json: per rank, summed over the traced steps
    steps_traced = t["steps"][1] - t["steps"][0] + 1
    r = runs.setdefault(label, {}).setdefault(mode, {"ms": [], "tps": [], "comm": [], "waited": []})
    r["ms"] += [x["ms_per_step"] for x in rows]
    r["tps"] += [x["tokens_per_s"] for x in rows]
    r["comm"].append(t["total"]["comm_ms"] / steps_traced)
    r["waited"].append(t["total"]["waited_ms"] / steps_traced)
med = statistics.median
configs = []
print("communication hidden behind compute (medians; comm: collectives from start to completion per step;")
print("exposed: the part the compute waited on); nodes: " + sys.argv[2])
print("%-30s %10s %10s %10s %10s %10s %10s %9s %9s %8s" % ("config", "ms before", "ms after", "comm ms", "exp before",
      "exp after", "frac bef", "frac aft", "comm/cmp", "speedup"))
for label, m in runs.items():
    b, a = m["false"], m["true"]
    ms_b, ms_a = med(b["ms"]), med(a["ms"])
    comm_b, comm_a = med(b["comm"]), med(a["comm"])
    exp_b, exp_a = med(b["waited"]), med(a["waited"])
    compute = max(ms_b - exp_b, 1e-9)
    c = {"config": label, "ms_per_step_before": round(ms_b, 2), "ms_per_step_after": round(ms_a, 2),
         "comm_ms_before": round(comm_b, 2), "comm_ms_after": round(comm_a, 2),
         "exposed_ms_before": round(exp_b, 2), "exposed_ms_after": round(exp_a, 2),
         "exposed_fraction_before": round(exp_b / comm_b, 3) if comm_b else 0,
         "exposed_fraction_after": round(exp_a / comm_a, 3) if comm_a else 0,
         "comm_over_compute": round(comm_b / compute, 3), "speedup": round(ms_b / ms_a, 3),
         "tokens_per_s_before": round(med(b["tps"]), 1), "tokens_per_s_after": round(med(a["tps"]), 1)}
    configs.append(c)
    print("%-30s %10.1f %10.1f %10.1f %10.1f %10.1f %10.3f %9.3f %9.2f %8.3f" % (label, ms_b, ms_a, comm_a, exp_b, exp_a,
          c["exposed_fraction_before"], c["exposed_fraction_after"], c["comm_over_compute"], c["speedup"]))
bounded = [c for c in configs if c["comm_over_compute"] <= 1.0] or configs
out = {"bench": "overlap",
       "exposed_fraction_before": max(c["exposed_fraction_before"] for c in bounded),
       "exposed_fraction_after": max(c["exposed_fraction_after"] for c in bounded),
       "speedup": round(med([c["speedup"] for c in configs]), 3),
       "tokens_per_s_ratio_min": round(min(c["tokens_per_s_after"] / c["tokens_per_s_before"] for c in configs), 3),
       "nodes": sys.argv[2], "configs": configs}
cost = {"yes": [], "no": []}
spans = []
for traced, run in (l.split() for l in open(sys.argv[3])):
    cost[traced] += [json.loads(l)["ms_per_step"] for l in open(run + "/metrics.jsonl")][1:]
    if traced == "yes":
        t = json.load(open(run + "/trace/rank0.json"))
        steps = t["otherData"]["steps"]
        compute = [e for e in t["traceEvents"] if e.get("ph") == "X" and e.get("tid") == 0 and e.get("cat") not in ("wait", "blocking")]
        spans.append(len(compute) / (steps[1] - steps[0] + 1))
scope_ns = float(sys.argv[4])
ms_untraced = med(cost["no"])
out["trace_on_overhead"] = round(med(cost["yes"]) / ms_untraced - 1, 4)
out["trace_off_scope_ns"] = scope_ns
out["trace_off_overhead"] = scope_ns * med(spans) / (ms_untraced * 1e6)
print("tracing: on costs %+.1f%% ms/step (median, traced vs untraced run); off, %.1f ns per scope x %.0f scopes per step = %.1e of a step"
      % (100 * out["trace_on_overhead"], scope_ns, med(spans), out["trace_off_overhead"]))
print("exposed fraction (worst config with comm <= compute): before %.3f, after %.3f; speedup (median) %.3f; "
      "tokens/s after / before, lowest: %.3f" % (out["exposed_fraction_before"], out["exposed_fraction_after"],
      out["speedup"], out["tokens_per_s_ratio_min"]))
print(json.dumps(out))
EOF
