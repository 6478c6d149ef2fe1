#!/usr/bin/env bash
# tests/bench/run moe: a mixture of experts against the dense model with the same active parameters, then one JSON
# line. A Qwen3-MoE of 8 experts (the top 2, each 256 wide) and a Qwen3 whose MLP is 512 wide (the two active
# experts' width): the same attention, the same FLOPs per token but the router's and the dispatch's. Both train
# input/qwen3-moe-tiny.yaml widened (V 4096, T 256, C 256, L 4, NH 8, NKV 2, hs 32, 8 sequences a step) on 1 rank
# and on 2 (data parallel, each rank all 8 experts), and the MoE with expert parallelism ep 2 on 2 ranks (each rank 4
# experts, the routed rows exchanged by all-to-all), 1 BLAS thread each. Reported: tokens/s, ms/step (median of
# the logged intervals, rounds interleaved), the MoE/dense step-time ratio, the busiest expert's rows over the mean
# at the end (metrics.jsonl), and the all-to-all bytes per rank and step over the ep dimension: measured (the log's
# traffic table, every collective the ranks issued on ep) against `fsdpp plan --machine`'s prediction, and the
# exposed all-to-all time per step from a timeline of the ep 2 run (run.trace, fsdpp report --trace).
# Where a virtual cluster can be made (tests/cluster/vcluster, root; --nodes off to skip), ep 2 also runs with one
# rank on each of 2 nodes, the routed rows crossing the link: its tokens/s, the ep all-to-all bytes the traffic table
# counts between hosts per step, and the bytes node1's link carried per step.
# Options: --steps N (default 40), --rounds R (default 3), --nodes auto|off.
set -euo pipefail
steps=40 rounds=3 nodes=auto
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --nodes) nodes=$2; shift 2 ;;
    *) echo "usage: tests/bench/run moe [--steps N] [--rounds R] [--nodes auto|off]" >&2; exit 2 ;;
  esac
done
work=build/bench-moe
rm -rf "$work" && mkdir -p "$work"
shape=(model.vocab_size=4096 model.context_length=256 model.n_embd=256 model.n_layer=4 model.n_head=8
       model.n_kv_head=2 model.head_dim=32 train.global_batch=8 train.micro_batch=4 train.eval_interval=0
       checkpoint.interval=0 "train.steps=$steps" log.interval=5)
moe=(model.moe.num_experts=8 model.moe.top_k=2 model.moe.expert_ffn_hidden=256 "model.moe.dense_layers=[]")
dense_deck=$work/dense.yaml
# The dense twin: the same deck without its model.moe section, as a qwen3 of the active width.
sed -e 's/^  arch: qwen3_moe/  arch: qwen3/' -e '/^  moe:/,/^  [a-z_]*:.*#.*HF mlp_only_layers/d' input/qwen3-moe-tiny.yaml >"$dense_deck"
run() {  # name ranks deck overrides...: ms/step (median over logged intervals after the first) and tokens/s
  local name=$1 n=$2 deck=$3; shift 3
  mpiexec --oversubscribe -n "$n" build/bin/fsdpp train "$deck" "${shape[@]}" "$@" "run.output=$work/$name" >"$work/$name.log" 2>&1 ||
    { tail -20 "$work/$name.log"; echo "error: $name failed" >&2; exit 1; }
  python3 - "$work/$name/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][1:]
print(statistics.median(r["ms_per_step"] for r in rows), statistics.median(r["tokens_per_s"] for r in rows),
      rows[-1].get("expert_load_max_over_mean", 0))
PY
}
declare -A ms tok load
for r in $(seq "$rounds"); do
  for n in 1 2; do
    read -r m t l < <(run "moe-$n-$r" "$n" input/qwen3-moe-tiny.yaml "${moe[@]}"); ms[moe,$n]+="$m "; tok[moe,$n]+="$t "; load[$n]=$l
    read -r m t l < <(run "dense-$n-$r" "$n" "$dense_deck" model.ffn_hidden=512); ms[dense,$n]+="$m "; tok[dense,$n]+="$t "
  done
  read -r m t l < <(run "ep2-$r" 2 input/qwen3-moe-tiny.yaml "${moe[@]}" mesh.ep=2); ms[ep2]+="$m "; tok[ep2]+="$t "
  load[ep2]=$l
done
# All-to-all bytes over ep, per rank and step: the traffic table's payload (MiB, all ranks) over steps x 2 ranks,
# and the plan's.
measured=$(awk '$1 == "ep" { printf "%.0f\n", $3 * 1048576 / ('"$steps"' * 2) }' "$work/ep2-1.log")
predicted=$(build/bin/fsdpp plan input/qwen3-moe-tiny.yaml "${shape[@]}" "${moe[@]}" mesh.ep=2 --ranks 2 \
              --machine h100-sxm-8x --json | python3 -c "import json,sys; print(json.load(sys.stdin)['time']['comm_bytes_by_dim']['ep'])")
[ -n "$measured" ] || { echo "error: no ep row in the traffic table of $work/ep2-1.log" >&2; exit 1; }
a2a_error=$(python3 -c "print(f\"{($predicted - $measured) / $measured:.2e}\")")
# The exposed all-to-all time from a timeline (run.trace, steps 8-10 of 12): the ep dimension's waited ms per step,
# against that run's ms/step.
mpiexec --oversubscribe -n 2 build/bin/fsdpp train input/qwen3-moe-tiny.yaml "${shape[@]}" "${moe[@]}" mesh.ep=2 \
  train.steps=12 schedule.warmup_steps=2 log.interval=1 run.trace=8-10 "run.output=$work/ep2-trace" >"$work/ep2-trace.log" 2>&1 ||
  { tail -20 "$work/ep2-trace.log"; echo "error: the traced ep 2 run failed" >&2; exit 1; }
read -r a2a_exposed_ms a2a_share < <(build/bin/fsdpp report "$work/ep2-trace" --trace --json | python3 -c "
import json, statistics, sys
d = json.load(sys.stdin)
ep = next(r for r in d['by_dim'] if r['mesh dimension'] == 'ep')
per_step = ep['waited_ms'] / (d['steps'][1] - d['steps'][0] + 1)
rows = [json.loads(l) for l in open('$work/ep2-trace/metrics.jsonl') if '\"loss\"' in l]
step_ms = statistics.median(r['ms_per_step'] for r in rows if 8 <= r['step'] <= 10)
print(round(per_step, 3), round(per_step / step_ms, 4))")
median() { python3 -c "import statistics,sys; print(statistics.median(float(x) for x in sys.argv[1:]))" $1; }
printf '%-8s %-6s %12s %12s %14s\n' model ranks ms/step tokens/s max/mean_load
for n in 1 2; do
  printf '%-8s %-6s %12.2f %12.0f %14.2f\n' moe "$n" "$(median "${ms[moe,$n]}")" "$(median "${tok[moe,$n]}")" "${load[$n]}"
  printf '%-8s %-6s %12.2f %12.0f %14s\n' dense "$n" "$(median "${ms[dense,$n]}")" "$(median "${tok[dense,$n]}")" -
done
printf '%-8s %-6s %12.2f %12.0f %14.2f\n' moe-ep2 2 "$(median "${ms[ep2]}")" "$(median "${tok[ep2]}")" "${load[ep2]}"
ratio1=$(python3 -c "print(round($(median "${ms[moe,1]}") / $(median "${ms[dense,1]}"), 3))")
ratio2=$(python3 -c "print(round($(median "${ms[moe,2]}") / $(median "${ms[dense,2]}"), 3))")
# ep 2 across the virtual cluster's 2 nodes, one rank each.
cluster="not run (--nodes off)" cluster_tokens=null cluster_a2a_between=null cluster_link=null
if [ "$nodes" = auto ]; then
  export FSDPP_VCLUSTER_DIR=$PWD/$work/vcluster
  V=tests/cluster/vcluster
  if up=$("$V" up --nodes 2 --cpus 2 2>"$work/vcluster.log"); then
    trap '"$V" down >/dev/null 2>&1' EXIT
    eval "$up"
    export SLURM_CONF FSDPP_DEVICE=host
    before=$("$V" bytes | awk '$1 == "node1" { print $2 }')
    srun --mpi=pmix --nodes=2 --ntasks-per-node=1 --cpus-per-task=1 --partition=vc "$PWD/build/bin/fsdpp" train \
      "$PWD/input/qwen3-moe-tiny.yaml" "${shape[@]}" "${moe[@]}" mesh.ep=2 "run.output=$PWD/$work/ep2-nodes" \
      >"$work/ep2-nodes.log" 2>&1 || { tail -20 "$work/ep2-nodes.log"; echo "error: ep 2 across nodes failed" >&2; exit 1; }
    after=$("$V" bytes | awk '$1 == "node1" { print $2 }')
    read -r cluster_tokens cluster_a2a_between cluster_link < <(python3 - "$work/ep2-nodes" "$steps" "$before" "$after" <<'PY'
import json, re, statistics, sys
run, steps, before, after = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rows = [json.loads(l) for l in open(run + "/metrics.jsonl")][1:]
between = 0
for line in open(run + ".log"):
    m = re.match(r"\s*ep\s+\d+\s+[\d.]+\s+(\d+)", line)
    if m: between = int(m.group(1))
print(round(statistics.median(r["tokens_per_s"] for r in rows)), between // steps, (after - before) // steps)
PY
)
    cluster="2 nodes x 1 rank: $cluster_tokens tokens/s; ep all-to-all between hosts $cluster_a2a_between B/step (both ranks, the traffic table); node1's link sent $cluster_link B/step (every collective and the launcher)"
  else
    cluster="not run: $(grep -m1 -E "SKIPPED|error|failed" "$work/vcluster.log" || echo "vcluster up failed")"
  fi
fi
ratio_ep=$(python3 -c "print(round($(median "${ms[ep2]}") / $(median "${ms[moe,2]}"), 3))")
echo "MoE/dense step time: $ratio1 on 1 rank, $ratio2 on 2 (target <= 1.3 on 1 rank); medians of $rounds rounds"
echo "ep 2 over data parallel on 2 ranks, step time: $ratio_ep"
echo "all-to-all over ep per rank and step: measured $measured B, planned $predicted B, error $a2a_error (target within 2%)"
echo "exposed all-to-all (run.trace, ep dimension's waits): $a2a_exposed_ms ms per step, $a2a_share of the step"
echo "ep 2 on the virtual cluster: $cluster"
printf '{"bench":"moe","moe_over_dense_1rank":%s,"moe_over_dense_2ranks":%s,"moe_tokens_per_s_1rank":%s,"dense_tokens_per_s_1rank":%s,"moe_tokens_per_s_2ranks":%s,"expert_load_max_over_mean":%s,"ep2_tokens_per_s":%s,"ep2_over_dp_2ranks":%s,"alltoall_bytes_measured":%s,"alltoall_bytes_planned":%s,"alltoall_bytes_error":%s,"ep2_exposed_alltoall_ms_per_step":%s,"ep2_exposed_alltoall_share":%s,"ep2_nodes_tokens_per_s":%s,"ep2_nodes_alltoall_bytes_between_hosts_per_step":%s,"ep2_nodes_link_bytes_per_step":%s}\n' \
  "$ratio1" "$ratio2" "$(median "${tok[moe,1]}")" "$(median "${tok[dense,1]}")" "$(median "${tok[moe,2]}")" "${load[1]}" \
  "$(median "${tok[ep2]}")" "$ratio_ep" "$measured" "$predicted" "$a2a_error" "$a2a_exposed_ms" "$a2a_share" \
  "$cluster_tokens" "$cluster_a2a_between" "$cluster_link"
