#!/usr/bin/env bash
# hf_training_parity.sh FSDPP MPIEXEC ROOT WORK: fsdpp's training against transformers' in float64, step by step
# (tests/reference/hf_reference.py train; skipped with exit 77 without the reference). Each case starts both from
# the deck's initial weights (fsdpp init, exported with ckpt export --hf), trains 10 steps of AdamW with clipping on
# the same sequential batches of a token file, and holds fsdpp's per-step losses (metrics.jsonl; for the
# mixture-of-experts models the cross-entropy plus aux_loss_coef x transformers' load-balancing loss) within 1e-5
# relative of transformers' in float64. The cases: Qwen3, Qwen3-MoE (a dense layer between sparse ones) and
# Mixtral, on 1 to 4 ranks, with accumulation, activation checkpointing, HSDP and the edge cases of routing
# (every expert for every token; a router that sends every token to one expert).
set -euo pipefail
fsdpp=$1 mpiexec=$2 root=$3 work=$4
ref=$root/tests/reference
py=$("$ref/ensure-transformers") || { echo "$py"; exit 77; }
rm -rf "$work" && mkdir -p "$work"
"$py" "$ref/hf_reference.py" corpus "$work/tokens.u32" 64 20000
T=32 lr=1e-3 clip=1.0
train=(train.steps=10 model.context_length=$T data.source=$work/tokens.u32 data.order=sequential data.val_fraction=0
       train.eval_interval=0 checkpoint.interval=0 optim.lr=$lr optim.weight_decay=0 schedule.kind=constant
       schedule.warmup_steps=0 train.grad_clip=$clip log.interval=1)

# name ranks deck global micro [overrides...]: one case. The initial weights depend on the deck's model alone, so
# the seed file of 1 rank starts every rank count.
case_() {
  local name=$1 ranks=$2 deck=$3 global=$4 micro=$5; shift 5
  local dir=$work/$name
  mkdir -p "$dir"
  local model=()
  for o in "$@"; do [[ $o == model.* ]] && model+=("$o"); done
  "$mpiexec" -n "$ranks" "$fsdpp" train "$root/input/$deck" "${train[@]}" train.global_batch=$global \
    train.micro_batch=$micro "$@" "run.output=$dir/run" >"$dir/train.log"
  "$fsdpp" init "$root/input/$deck" "${model[@]}" --out "$dir/seed.h5" >/dev/null
  "$fsdpp" ckpt export "$dir/seed.h5" "$dir/hf" --hf --deck "$dir/run/deck.resolved.yaml" >/dev/null
  "$py" "$ref/hf_reference.py" train "$dir/hf" "$work/tokens.u32" $T $global $micro $lr $clip "$dir/run/metrics.jsonl" 1e-5 |
    tail -n 1 | sed "s|^$dir/hf|$name, $ranks rank(s)|"
}
case_ qwen3 1 qwen3-tiny.yaml 8 8
case_ qwen3-moe 1 qwen3-moe-tiny.yaml 8 4
case_ qwen3-moe-ranks2 2 qwen3-moe-tiny.yaml 8 4
case_ mixtral-ranks3 3 mixtral-tiny.yaml 9 3
case_ qwen3-moe-ranks4-checkpointing 4 qwen3-moe-tiny.yaml 8 2 train.activation_checkpointing=full
case_ mixtral-hsdp 4 mixtral-tiny.yaml 8 2 fsdp.strategy=hybrid_shard mesh.dp_replicate=2
case_ mixtral-every-expert 2 mixtral-tiny.yaml 8 4 model.moe.top_k=4
case_ qwen3-moe-sparse-step 1 qwen3-moe-tiny.yaml 8 8 model.moe.dense_layers=[] model.moe.sparse_step=2 \
  model.moe.norm_topk_prob=false
