#!/usr/bin/env bash
# Every multi-node template across the nodes of a vcluster (2 nodes x 2 tasks, FSDPP_DEVICE=host), each to
# completion, under a real Slurm:
#  - gpu-multi-node.sbatch (full_shard over 4 ranks): each rank's node-local rank and GPU (Slurm's fake GPUs,
#    CUDA_VISIBLE_DEVICES) come from its own node; the bytes the nodes' links carried match what fsdpp's own
#    per-dimension counters predict for flat rings (FSDPP_MPI_ALLGATHER=ring) within 5%;
#  - the same deck on 1 node x 4 gives the same losses (fp32 tolerance), with next to nothing on the links
#    (shared memory inside a node);
#  - hsdp-multi-node.sbatch: dp_shard inside a node (no bytes predicted between nodes), dp_replicate across;
#    measured within 5% of predicted;
#  - tp-multi-node.sbatch: tp inside a node, dp_shard across; measured within 5% of predicted;
#  - requeue.sbatch on 2 nodes x 2 tasks, with checkpoints, to completion; measured within 5% of predicted;
#  - pp-multi-node.sbatch: one pipeline stage per node, dp_shard inside it (no dp_shard bytes predicted between
#    nodes), the same losses as full_shard over the 4 ranks; the activations between the stages are point-to-point
#    messages, which fsdpp's collective counters do not predict, so the links' bytes are reported, not compared.
set -u
root=$1; fsdpp=$2; work=$3
rm -rf "$work"; mkdir -p "$work"
# shellcheck source=tests/cluster/lib.sh
. "$root/tests/cluster/lib.sh"
cluster_up 2
cd "$work" || exit 1
export DECK=$root/input/tiny.yaml FSDPP_DEVICE=host FSDPP_MPI_ALLGATHER=ring
short=(train.steps=12 schedule.warmup_steps=2 train.micro_batch=4 train.eval_interval=0 log.interval=1)
two_by_two=(--nodes=2 --ntasks-per-node=2 --cpus-per-task=1)
summary=()

# run NAME TEMPLATE SBATCH-OPTIONS... -- OVERRIDES...: the job to its end, and the bytes the links carried meanwhile.
run() {
  local name=$1 template=$2 before after
  shift 2
  local options=()
  while [ "$1" != -- ]; do options+=("$1"); shift; done
  shift
  local tries=0 t0
  while :; do
    before=$(bytes_sent)
    t0=$SECONDS
    run_job --output="$work/$name.out" "${options[@]}" "$root/jobs/$template" "${short[@]}" "$@" "run.output=$work/$name" \
      && break
    tail -40 "$work/$name.out"
    if crashed_at_launch "$work/$name.out" && [ $((tries += 1)) = 1 ]; then
      echo "$template ($name): a task crashed at launch, before fsdpp printed anything (MPI/PMIx start-up); retrying once"
      summary+=("$name: retried once after a crash at launch")
      continue
    fi
    fail "$template ($name) failed"
  done
  after=$(bytes_sent)
  echo "$name: $((SECONDS - t0)) s"
  measured=$((after - before))
  grep -Eq "Loop time of [0-9.]+ on [0-9]+ procs for 12 steps" "$work/$name.out" || { tail -20 "$work/$name.out"; fail "$name did not train 12 steps"; }
}

# check_bytes NAME: measured (set by run) within 5% of the job's own prediction.
check_bytes() {
  local predicted
  predicted=$(predicted_bytes "$work/$1.out")
  [ -n "$predicted" ] || { tail -20 "$work/$1.out"; fail "$1: no predicted bytes in its log"; }
  echo "$1: bytes between nodes: predicted $predicted, measured $measured"
  summary+=("$1: predicted $predicted B, measured $measured B")
  within_5_percent "$measured" "$predicted" || fail "$1: measured $measured bytes on the links, predicted $predicted (more than 5% apart)"
}

# crossing NAME DIMENSION: the bytes the job's traffic table predicts between hosts for that mesh dimension.
crossing() { awk -v d="$2" '$1 == d && NF == 4 {print $4}' "$work/$1.out" | tail -1; }

# 1. gpu-multi-node.sbatch: full_shard over 2 nodes x 2, every rank's placement logged.
FSDPP_LOG_ALL_RANKS=1 run multi "gpu-multi-node.sbatch" "${two_by_two[@]}" --
for r in 0 1 2 3; do
  node=node$((r / 2 + 1)) localrank=$((r % 2))
  line=$(grep -E "^placement: rank $r on $node: node-local rank $localrank of 2, device host \(CUDA_VISIBLE_DEVICES=[0-9]+\)$" multi.out) \
    || { grep placement multi.out; fail "rank $r: expected node-local rank $localrank on $node"; }
  echo "$line"
done
for node in node1 node2; do
  gpus=$(grep -E "^placement: rank [0-9]+ on $node:" multi.out | grep -Eo "CUDA_VISIBLE_DEVICES=[0-9]+" | sort -u | wc -l)
  [ "$gpus" = 2 ] || fail "the two ranks on $node did not get two different GPUs of their node"
done
grep -q "fully_shard over dp_shard=4 (4 ranks, mpi)" multi.out || fail "gpu-multi-node.sbatch: not full_shard over 4 ranks"
check_bytes multi
multi_measured=$measured

# 2. The same deck on one node x 4: the same losses, and (shared memory) next to nothing on the links.
run one_node "gpu-multi-node.sbatch" --nodes=1 --ntasks-per-node=4 --cpus-per-task=1 --nodelist=node1 --
same_losses "$work/multi/metrics.jsonl" "$work/one_node/metrics.jsonl" 12 || fail "1 node x 4 and 2 nodes x 2 train to different losses"
[ "$(predicted_bytes one_node.out)" = 0 ] || fail "one node: bytes between hosts predicted"
echo "one node x 4: $measured bytes on the links (2 nodes x 2: $multi_measured)"
[ "$measured" -lt $((multi_measured / 50)) ] || fail "one node x 4 sent $measured bytes over its link: ranks of one node should use shared memory"
summary+=("1 node x 4: same losses as 2 x 2, $measured B on the links")

# 3. HSDP: dp_shard stays inside a node, dp_replicate crosses.
run hsdp "hsdp-multi-node.sbatch" "${two_by_two[@]}" --
grep -q "fully_shard over dp_replicate=2 x dp_shard=2 " hsdp.out || fail "hsdp-multi-node.sbatch: wrong mesh"
[ "$(crossing hsdp dp_shard)" = 0 ] || fail "HSDP: dp_shard traffic predicted between nodes"
[ "$(crossing hsdp dp_replicate)" -gt 0 ] || fail "HSDP: no dp_replicate traffic between nodes"
check_bytes hsdp

# 4. Tensor parallelism inside a node, FSDP across.
run tp "tp-multi-node.sbatch" "${two_by_two[@]}" --
grep -q "fully_shard over dp_shard=2 x tp=2 " tp.out || fail "tp-multi-node.sbatch: wrong mesh"
[ "$(crossing tp tp)" = 0 ] || fail "tp traffic predicted between nodes"
[ "$(crossing tp dp_shard)" -gt 0 ] || fail "tensor parallelism: no dp_shard traffic between nodes"
check_bytes tp

# 5. requeue.sbatch across nodes, with checkpoints, to completion.
run requeue "requeue.sbatch" "${two_by_two[@]}" --ntasks=4 -- checkpoint.interval=6 "checkpoint.dir=$work/requeue-ck"
grep -q "checkpoint: saved step 12" requeue.out || fail "requeue.sbatch: no checkpoint at step 12"
grep -Eq "Loop time of [0-9.]+ on 4 procs" requeue.out || fail "requeue.sbatch: not 4 ranks"
check_bytes requeue

# 6. Pipeline parallelism: a stage per node, FSDP inside it.
run pp "pp-multi-node.sbatch" "${two_by_two[@]}" --
grep -q "fully_shard over dp_shard=2 " pp.out || fail "pp-multi-node.sbatch: not dp_shard 2 inside a stage"
grep -Eq "^pipeline 1f1b, pp 2 x [0-9]+ micro-batches" pp.out || fail "pp-multi-node.sbatch: no pipeline summary"
[ "$(crossing pp dp_shard)" = 0 ] || fail "pipeline: dp_shard traffic predicted between nodes"
summary+=("pp: $measured B between nodes (activations and gradients point to point, not predicted)")
same_losses "$work/multi/metrics.jsonl" "$work/pp/metrics.jsonl" 12 || fail "pp-multi-node.sbatch: losses differ from full_shard over 4 ranks"

printf '%s\n' "${summary[@]}"
echo "templates: gpu-multi-node, hsdp-multi-node, tp-multi-node, requeue and pp-multi-node ran on 2 nodes x 2; placement per node;" \
     "bytes between nodes within 5% of fsdpp's prediction; 1 x 4 and 2 x 2 give the same losses"
