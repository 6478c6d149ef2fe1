#!/usr/bin/env bash
# Pipeline parallelism (mesh.pp, docs/parallelism.md): what its schedules cost. Trains a small.yaml-shaped model of
# 8 blocks (default) as pp p on p ranks (--ranks, default "2 4") under gpipe, 1f1b, interleaved_1f1b (2 virtual
# stages) and zero_bubble at 4, 8 and 16 micro-batches of one sequence, and as dp_shard p on the same batch, and
# prints per layout the median ms/step over the steps after the first and the median measured bubble (the share of
# the micro-batches' time the ranks waited for another stage, mean over ranks) beside the schedule's ideal with equal
# stages (as the run's log gives it: (p-1)/(m+p-1) for gpipe and 1f1b, less interleaved and zero_bubble); at 8
# micro-batches, each pipeline's largest and smallest measured stage peak against `fsdpp plan`'s. Then one JSON line
# with bubble_1f1b_measured and bubble_1f1b_ideal (pp 2, m 8), gpipe_over_1f1b, interleaved_over_1f1b,
# zero_bubble_over_1f1b and pp2_over_dp2 (ms per step, pp 2, m 8), and every layout's figures. Where a virtual
# cluster can be made (tests/cluster/vcluster, root; --nodes off to skip), pp 2 (1f1b) with a stage on each of 2
# nodes runs against dp_shard 2 across them at m 8: ms/step and the bytes the nodes' links carried (`cluster`).
#   tests/bench/pipeline.sh [--fsdpp build/bin/fsdpp] [--deck input/small.yaml] [--steps 4] [--rounds 1]
#                           [--ranks "2 4"] [--nodes auto|off] [overrides...]
# The layouts run in turn, --rounds times, so that machine noise falls on all of them alike. More ranks than cores
# share them (oversubscribed): compare layouts of one pp, not pp 4's times with pp 2's.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
fsdpp=build/bin/fsdpp deck=input/small.yaml steps=4 rounds=1 ranks="2 4" nodes=auto
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) nodes=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
# shellcheck source=tests/bench/options.sh
source tests/bench/options.sh model.n_layer=8 "${args[@]}"

results="$work/results.txt"
for round in $(seq "$rounds"); do
  for p in $ranks; do
    for m in 4 8 16; do
      for layout in dp gpipe 1f1b interleaved zero_bubble; do
        args=("${overrides[@]}" train.micro_batch=1 "train.global_batch=$m")
        case "$layout" in
          dp) args+=("mesh.dp_shard=$p") ;;  # the same batch: m / p micro-batches per rank
          interleaved) args+=("mesh.pp=$p" pipeline.schedule=interleaved_1f1b pipeline.virtual_stages=2) ;;
          *) args+=("mesh.pp=$p" "pipeline.schedule=$layout") ;;
        esac
        out="$work/run-$p-$layout-$m-$round"
        mpiexec -n "$p" "$fsdpp" train "$deck" "${args[@]}" "train.steps=$steps" train.eval_interval=0 \
          schedule.warmup_steps=1 log.interval=1 checkpoint.interval=0 "run.output=$out" >"$out.log" 2>&1 ||
          { tail -20 "$out.log" >&2; echo "error: $layout on $p ranks at $m micro-batches failed" >&2; exit 1; }
        plan=-
        if [ "$layout" != dp ] && [ "$m" = 8 ] && [ "$round" = 1 ]; then  # each stage's planned peak
          plan="$out.plan.json"
          "$fsdpp" plan "$deck" "${args[@]}" --ranks "$p" --json >"$plan"
        fi
        echo "$p $layout $m $round $out $plan" >>"$results"
      done
    done
  done
done
# Across the virtual cluster's 2 nodes, one rank on each: a stage per node against dp_shard over both.
cluster="$work/cluster.txt"
if [ "$nodes" = auto ]; then
  if vcluster_up; then
    for layout in dp pp; do
      args=("${overrides[@]}" train.micro_batch=1 train.global_batch=8)
      if [ "$layout" = pp ]; then args+=(mesh.pp=2); else args+=(mesh.dp_shard=2); fi
      before=$(vcluster_bytes)
      srun --mpi=pmix --nodes=2 --ntasks-per-node=1 --cpus-per-task=1 --partition=vc "$PWD/$fsdpp" train \
        "$PWD/$deck" "${args[@]}" "train.steps=$steps" train.eval_interval=0 schedule.warmup_steps=1 log.interval=1 \
        checkpoint.interval=0 "run.output=$work/cluster-$layout" >"$work/cluster-$layout.log" 2>&1 ||
        { tail -20 "$work/cluster-$layout.log" >&2; echo "error: $layout across the nodes failed" >&2; exit 1; }
      after=$(vcluster_bytes)
      echo "$layout $((after - before)) $work/cluster-$layout" >>"$cluster"
    done
  else
    echo "virtual cluster not run: $(grep -m1 -E "SKIPPED|error|failed" "$work/vcluster.log" || echo "vcluster up failed")"
  fi
fi
python3 - "$results" "$deck" "$cluster" <<'PY'
import json, os, re, statistics, sys
runs = {}
for p, layout, m, rnd, out, plan in (l.split() for l in open(sys.argv[1])):
    steps = [json.loads(l) for l in open(out + "/metrics.jsonl")][1:]
    r = runs.setdefault((int(p), layout, int(m)), {"ms": [], "bubble": [], "ideal": None, "peak": None})
    r["ms"] += [s["ms_per_step"] for s in steps]
    r["bubble"] += [s["pipeline_bubble"] for s in steps if "pipeline_bubble" in s]
    log = open(out + ".log").read()
    ideal = re.search(r"the schedule's ideal \(equal stages\) ([0-9.]+) %", log)
    if ideal: r["ideal"] = round(float(ideal.group(1)) / 100, 4)
    if plan != "-":  # "Host allocations | min | avg | max | total" in MiB: the stages' smallest and largest
        measured = re.search(r"^\w+ allocations +\|\s*([0-9.]+)\s*\|\s*([0-9.]+)\s*\|\s*([0-9.]+)", log, re.M)
        totals = sorted(s["bytes_per_rank"]["total"] / 2**20 for s in json.load(open(plan))["stages_memory"])
        r["peak"] = {"measured_max_mib": float(measured.group(3)), "plan_max_mib": round(totals[-1], 1),
                     "measured_min_mib": float(measured.group(1)), "plan_min_mib": round(totals[0], 1)}
layouts = ["dp", "gpipe", "1f1b", "interleaved", "zero_bubble"]
ms = lambda p, layout, m: statistics.median(runs[(p, layout, m)]["ms"])
bubble = lambda p, layout, m: statistics.median(runs[(p, layout, m)]["bubble"]) if runs[(p, layout, m)]["bubble"] else None
err = lambda plan, measured: 100 * (plan - measured) / measured
print("%-3s %-12s %4s %9s %9s %8s %9s %22s %22s" % ("pp", "layout", "m", "ms/step", "bubble_%", "ideal_%", "ms_vs_dp",
      "peak_max_MiB(plan,err)", "peak_min_MiB(plan,err)"))
for (p, layout, m) in sorted(runs, key=lambda k: (k[0], k[2], layouts.index(k[1]))):
    r, b = runs[(p, layout, m)], bubble(p, layout, m)
    peak = r["peak"]
    cell = lambda hi: "-" if not peak else "%.1f (%.1f, %+.2f%%)" % (peak[f"measured_{hi}_mib"], peak[f"plan_{hi}_mib"],
                                                                     err(peak[f"plan_{hi}_mib"], peak[f"measured_{hi}_mib"]))
    print("%-3d %-12s %4d %9.1f %9s %8s %9.2f %22s %22s" % (p, layout, m, ms(p, layout, m),
          "-" if b is None else "%.1f" % (100 * b), "-" if r["ideal"] is None else "%.1f" % (100 * r["ideal"]),
          ms(p, layout, m) / ms(p, "dp", m), cell("max"), cell("min")))
pps = sorted({k[0] for k in runs})
p0 = 2 if 2 in pps else pps[0]
out = {"bench": "pipeline", "deck": sys.argv[2], "ranks": pps, "pp": p0,
       "bubble_1f1b_measured": round(bubble(p0, "1f1b", 8), 4), "bubble_1f1b_ideal": runs[(p0, "1f1b", 8)]["ideal"],
       "gpipe_over_1f1b": round(ms(p0, "gpipe", 8) / ms(p0, "1f1b", 8), 3),
       "pp2_over_dp2" if p0 == 2 else f"pp{p0}_over_dp{p0}": round(ms(p0, "1f1b", 8) / ms(p0, "dp", 8), 3),
       "interleaved_over_1f1b": round(ms(p0, "interleaved", 8) / ms(p0, "1f1b", 8), 3),
       "zero_bubble_over_1f1b": round(ms(p0, "zero_bubble", 8) / ms(p0, "1f1b", 8), 3),
       "bubble_interleaved_measured": round(bubble(p0, "interleaved", 8), 4),
       "bubble_interleaved_ideal": runs[(p0, "interleaved", 8)]["ideal"],
       "bubble_zero_bubble_measured": round(bubble(p0, "zero_bubble", 8), 4),
       "bubble_zero_bubble_ideal": runs[(p0, "zero_bubble", 8)]["ideal"],
       "plan_peak_error_max_pct": round(max(abs(err(r["peak"][f"plan_{h}_mib"], r["peak"][f"measured_{h}_mib"]))
                                            for r in runs.values() if r["peak"] for h in ("max", "min")), 2)}
for p in pps:
    for m in (4, 8, 16):
        out[f"pp{p}_m{m}"] = {l: {"ms_per_step": round(ms(p, l, m), 1), "bubble": bubble(p, l, m),
                                  "ideal": runs[(p, l, m)]["ideal"], "peak": runs[(p, l, m)]["peak"]} for l in layouts}
if os.path.exists(sys.argv[3]):  # the virtual cluster's two nodes
    nodes = {}
    for layout, sent, folder in (l.split() for l in open(sys.argv[3])):
        steps = [json.loads(l) for l in open(folder + "/metrics.jsonl")][1:]
        nodes[layout] = {"ms_per_step": round(statistics.median(s["ms_per_step"] for s in steps), 1),
                         "link_bytes": int(sent)}
    print()
    print("across 2 virtual-cluster nodes, 1 rank each, 8 micro-batches of one sequence (median of %d timed steps):" % len(steps))
    for layout, label in (("pp", "pp 2 (1f1b), a stage per node"), ("dp", "dp_shard 2 across the nodes")):
        print("  %-34s %9.1f ms/step %12d bytes on the links" % (label, nodes[layout]["ms_per_step"], nodes[layout]["link_bytes"]))
    out["cluster"] = {**nodes, "pp_bytes_over_dp": round(nodes["pp"]["link_bytes"] / max(1, nodes["dp"]["link_bytes"]), 3),
                      "pp_ms_over_dp": round(nodes["pp"]["ms_per_step"] / nodes["dp"]["ms_per_step"], 3)}
else:
    out["cluster"] = None
print()
print(json.dumps(out))
PY
