#!/usr/bin/env bash
# fsdpp plan against measurement: for input/small.yaml on 1, 2 and 4 ranks (and no_shard on 2, HSDP 2x2 on 4,
# activation checkpointing full and every_2 on 1 and 2 ranks), and for a Llama of small.yaml's size (layouts
# named llama-*: input/llama-tiny.yaml widened, so that activations, not the sgemm peak measurement's 12 MiB of
# matrices, set the peak) on 1 rank, HSDP 2x2 on 4 and with activation checkpointing on 2, a Qwen2 of that size
# (qwen2-*: input/qwen2-tiny.yaml widened alike) with activation checkpointing on 2, and with
# model.attention fused (no B*NH*T^2 buffers), Qwen3-MoE and Mixtral of that size (moe-*, mixtral-*: 8 experts; expert parallelism
# ep 2 on 2 ranks, inside HSDP 2x2 and beside tp 2: the exchange's staging and the received rows' buffers at their worst case), and batched (a workspace) for both, and train.reproducible (units of 1
# with a word accumulator on 2 ranks; HSDP 2x2 with one unit per rank, converted as it arrives), and context
# parallelism (llama-cp2*: cp 2 on 2 ranks, beside tp 2 with sequence parallelism, and inside HSDP 2 x 1 with
# activation checkpointing: the local chunks' rows and the ring's buffers; Qwen3-MoE at ep 2 x cp 2; cp 2 in
# reproducible mode with token chunks: the whole sequences' attention buffers and the chunks' gradient scratch),
# and pipeline stages (pp*: pp 4 and pp 2 x dp_shard 2 under 1f1b, pp 2 under gpipe with activation checkpointing
# and interleaved, zero_bubble at pp 4 (its weight-gradient stashes) and for the Llama beside tp 2 with sequence
# parallelism (also under zero_bubble with every second block recomputing, whose stash copies its inputs too), cp 2
# under zero_bubble (a stash of T/cp rows) and interleaved with document masks (each micro-batch's rows of the
# sequences in its slot), GPT-2 in reproducible mode at pp 2 under zero_bubble (its tied embedding's words summed
# over the two stages), and Qwen3-MoE at pp 2 x ep 2 under zero_bubble (each micro-batch's route in its slot):
# each stage's plan against the measured peaks, the largest and the smallest over the ranks), the planned per-rank
# total must be within 1% of the peak the trainer measures (Views counted by
# MemoryAccounting, largest over ranks). The plan runs fully_shard's own schedule dry, so it should agree to
# the byte but for what MemoryAccounting sees outside FSDP's buffers.
set -u
fsdpp=$1; mpirun=$2; root=$3; dir=$4
rm -rf "$dir"; mkdir -p "$dir"
args=(train.micro_batch=2)  # 8 sequences per step: 4, 2 and 1 micro-batches per rank on 1, 2 and 4 ranks
llama=(model.vocab_size=4096 model.context_length=256 model.n_embd=256 model.n_layer=4 model.n_head=8
       model.n_kv_head=2 train.global_batch=8)
# Mixture-of-experts layouts (moe-*: input/qwen3-moe-tiny.yaml, a dense first layer; mixtral-*: every layer
# sparse) widened alike: 8 experts, the top 2, their routed rows' buffers sized for the worst case.
moe=(model.head_dim=32 model.ffn_hidden=512 model.moe.num_experts=8 model.moe.expert_ffn_hidden=256)
status=0
printf '%-6s %-9s %12s %14s %9s %20s %20s\n' ranks layout plan_MiB measured_MiB error plan_sharded_MiB plan_unsharded_MiB
for spec in "1 fsdp" "2 fsdp" "4 fsdp" "2 no_shard fsdp.strategy=no_shard" \
            "4 hsdp2x2 fsdp.strategy=hybrid_shard mesh.dp_replicate=2" "1 llama-fsdp" \
            "4 llama-hsdp fsdp.strategy=hybrid_shard mesh.dp_replicate=2" \
            "1 ac_full train.activation_checkpointing=full" "2 ac_full train.activation_checkpointing=full" \
            "1 ac_every2 train.activation_checkpointing=every_2" "2 ac_every2 train.activation_checkpointing=every_2" \
            "2 llama-ac_full train.activation_checkpointing=full" "2 qwen2-ac_full train.activation_checkpointing=full" \
            "1 fused model.attention=fused" "1 batched model.attention=batched" \
            "2 llama-fused model.attention=fused" "1 llama-batched model.attention=batched" \
            "2 repro train.reproducible=true" \
            "4 repro_hsdp fsdp.strategy=hybrid_shard mesh.dp_replicate=2 train.reproducible=true train.reproducible_unit=2" \
            "1 moe-fsdp" "2 moe-ac_every2 train.activation_checkpointing=every_2" \
            "4 mixtral-hsdp fsdp.strategy=hybrid_shard mesh.dp_replicate=2" "2 moe-ep2 mesh.ep=2" \
            "4 mixtral-hsdp-ep2 fsdp.strategy=hybrid_shard mesh.dp_replicate=2 mesh.ep=2" \
            "4 mixtral-tp2-ep2 mesh.tp=2 mesh.ep=2" \
            "2 llama-cp2 mesh.cp=2 model.attention=fused" \
            "4 llama-cp2-tp2 mesh.cp=2 mesh.tp=2 mesh.tp_sequence_parallel=true model.attention=fused" \
            "4 llama-cp2-hsdp mesh.cp=2 fsdp.strategy=hybrid_shard mesh.dp_replicate=2 model.attention=fused train.activation_checkpointing=full" \
            "4 moe-ep2-cp2 mesh.ep=2 mesh.cp=2 model.attention=fused" \
            "2 llama-cp2-repro mesh.cp=2 model.attention=fused train.reproducible=true train.reproducible_chunks=4" \
            "4 pp4 mesh.pp=4" "4 pp2-dp2 mesh.pp=2 mesh.dp_shard=2" \
            "2 pp2-gpipe-ac mesh.pp=2 pipeline.schedule=gpipe train.activation_checkpointing=full" \
            "2 pp2-interleaved mesh.pp=2 pipeline.schedule=interleaved_1f1b pipeline.virtual_stages=2" \
            "4 llama-pp2-tp2 mesh.pp=2 mesh.tp=2 mesh.tp_sequence_parallel=true" \
            "4 pp4-zb mesh.pp=4 pipeline.schedule=zero_bubble" \
            "4 llama-pp2-tp2-zb-ac mesh.pp=2 mesh.tp=2 mesh.tp_sequence_parallel=true pipeline.schedule=zero_bubble train.activation_checkpointing=every_2" \
            "4 llama-pp2-cp2-zb mesh.pp=2 mesh.cp=2 model.attention=fused pipeline.schedule=zero_bubble" \
            "4 llama-pp2-cp2-il mesh.pp=2 mesh.cp=2 model.attention=fused pipeline.schedule=interleaved_1f1b pipeline.virtual_stages=2 data.document_mask=true data.eot_id=22" \
            "4 repro-pp2-zb mesh.pp=2 train.reproducible=true pipeline.schedule=zero_bubble" \
            "4 moe-pp2-ep2-zb mesh.pp=2 mesh.ep=2 pipeline.schedule=zero_bubble"; do
  read -r n layout extra <<<"$spec"
  read -r -a more <<<"${extra:-}"
  case "$layout" in
    llama-*) deck="$root/input/llama-tiny.yaml"; more+=("${llama[@]}") ;;
    qwen2-*) deck="$root/input/qwen2-tiny.yaml"; more+=("${llama[@]}") ;;
    moe-*) deck="$root/input/qwen3-moe-tiny.yaml"; more+=("${llama[@]}" "${moe[@]}") ;;
    mixtral-*) deck="$root/input/mixtral-tiny.yaml"; more+=("${llama[@]}" "${moe[@]}") ;;
    *) deck="$root/input/small.yaml" ;;
  esac
  # The plan (one process, no MPI) runs beside the training, on what its ranks leave of the cores.
  plan_json="$dir/plan-$n-$layout.json"
  "$fsdpp" plan "$deck" "${args[@]}" "${more[@]}" --ranks "$n" --json > "$plan_json" 2> "$plan_json.err" &
  plan_pid=$!
  # Two steps: the optimizer state appears in the first, and the second is the steady step (live optimizer state
  # under the activations), the peak every later step repeats.
  "$mpirun" -n "$n" "$fsdpp" train "$deck" "${args[@]}" "${more[@]}" train.steps=2 schedule.warmup_steps=1 train.eval_interval=0 \
    "run.output=$dir/run-$n-$layout" > "$dir/train-$n-$layout.log" 2>&1 || { wait "$plan_pid"; cat "$dir/train-$n-$layout.log"; echo "FAIL: training on $n ranks ($layout)"; exit 1; }
  wait "$plan_pid" || { cat "$plan_json.err"; echo "FAIL: fsdpp plan --ranks $n $extra"; exit 1; }
  json=$(cat "$plan_json")
  field() { echo "$json" | grep -o "\"$1\":[0-9]*" | head -1 | cut -d: -f2; }
  planned=$(field total)
  # A pipeline's stages differ: the plan of each (stages_memory), the largest against the measured largest and the
  # smallest against the measured smallest; the figures below are the largest stage's.
  pipeline=$(echo "$json" | python3 -c 'import json, sys
j = json.load(sys.stdin)
if "stages_memory" in j:
    s = sorted(j["stages_memory"], key=lambda m: m["bytes_per_rank"]["total"])
    b = s[-1]["bytes_per_rank"]
    print(s[-1]["bytes_per_rank"]["total"], s[0]["bytes_per_rank"]["total"], b["parameters"] + b["gradients"] + b["optimizer"],
          b["unsharded_parameters"] + b["unsharded_gradients"] + b["comm_buffers"] + b["pool_cached"])')
  [ -n "$pipeline" ] && read -r planned planned_min sharded_pp unsharded_pp <<<"$pipeline"
  sharded=$(( $(field parameters) + $(field gradients) + $(field optimizer) ))
  unsharded=$(( $(field unsharded_parameters) + $(field unsharded_gradients) + $(field comm_buffers) + $(field pool_cached) ))
  [ -n "$pipeline" ] && sharded=$sharded_pp unsharded=$unsharded_pp
  # "Host allocations | min | avg | max | total" (Cuda allocations on GPU builds), in MiB.
  measured=$(grep -E "^[A-Za-z]+ allocations +\|" "$dir/train-$n-$layout.log" | awk -F'|' '{gsub(/ /, "", $4); print $4}')
  [ -n "$measured" ] || { cat "$dir/train-$n-$layout.log"; echo "FAIL: no measured peak in the log"; exit 1; }
  line=$(awk -v p="$planned" -v m="$measured" -v s="$sharded" -v u="$unsharded" -v n="$n" -v l="$layout" 'BEGIN {
    pm = p / 1048576; e = (pm - m) / m;
    printf "%-6d %-9s %12.1f %14.1f %8.2f%% %20.1f %20.1f %s\n", n, l, pm, m, 100 * e, s / 1048576, u / 1048576, (e < -0.01 || e > 0.01) ? "OUT" : "ok" }')
  echo "$line"
  case "$line" in *OUT) status=1 ;; esac
  if [ -n "$pipeline" ]; then  # the smallest stage too
    measured_min=$(grep -E "^[A-Za-z]+ allocations +\|" "$dir/train-$n-$layout.log" | awk -F'|' '{gsub(/ /, "", $2); print $2}')
    line=$(awk -v p="$planned_min" -v m="$measured_min" -v n="$n" -v l="$layout (smallest stage)" 'BEGIN {
      pm = p / 1048576; e = (pm - m) / m;
      printf "%-6d %-9s %12.1f %14.1f %8.2f%% %s\n", n, l, pm, m, 100 * e, (e < -0.01 || e > 0.01) ? "OUT" : "ok" }')
    echo "$line"
    case "$line" in *OUT) status=1 ;; esac
  fi
done
[ "$status" = 0 ] || { echo "FAIL: fsdpp plan is more than 1% from the measured peak"; exit 1; }
echo "plan_vs_measured: within 1% on 1, 2 and 4 ranks, no_shard, HSDP, GPT-2, Llama, Qwen2, Qwen3-MoE and Mixtral (with expert parallelism), context parallelism (also reproducible, with token chunks), pipeline stages (gpipe, 1f1b, interleaved, zero_bubble; with dp_shard, tp, cp and ep), and activation checkpointing"
