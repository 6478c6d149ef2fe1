#!/usr/bin/env bash
# hf_training_parity.sh FSDPP MPIEXEC ROOT WORK: fsdpp's training against transformers' in float64, step by step
# (tests/reference/hf_reference.py train; skipped with exit 77 without the reference). Each case starts both from
# the deck's initial weights (fsdpp init, exported with ckpt export --hf), trains 10 steps of AdamW with clipping on
# the same sequential batches of a token file, and holds fsdpp's per-step losses (metrics.jsonl; for the
# mixture-of-experts models the cross-entropy plus aux_loss_coef x transformers' load-balancing loss) within 1e-5
# relative of transformers' in float64. The cases: Qwen3, Qwen3-MoE (a dense layer between sparse ones) and
# Mixtral, on 1 to 4 ranks, with expert parallelism (ep 2 and 4, ep x dp_shard_mod_ep, ep inside HSDP replicas, tp 2 x
# ep 2; Qwen3 with tp 2, and with context parallelism cp 2, cp 4 and cp 2 x tp 2; Qwen3-MoE at ep 2 x cp 2),
# accumulation, activation checkpointing, HSDP and the edge cases of routing (every expert for every token; sparse
# layers between dense ones). Runs that differ only in ranks and mesh share one transformers run, and every
# transformers run is done in one python process after fsdpp's (hf_reference.py batch: torch is imported once).
set -euo pipefail
fsdpp=$1 mpiexec=$2 root=$3 work=$4
ref=$root/tests/reference
py=$("$ref/ensure-transformers") || { echo "$py"; exit 77; }
rm -rf "$work" && mkdir -p "$work"
"$py" "$ref/hf_reference.py" corpus "$work/tokens.u32" 64 20000
checks=$work/checks.tsv
: >"$checks"
T=32 lr=1e-3 clip=1.0
train=(train.steps=10 model.context_length=$T data.source=$work/tokens.u32 data.order=sequential data.val_fraction=0
       train.eval_interval=0 checkpoint.interval=0 optim.lr=$lr optim.weight_decay=0 schedule.kind=constant
       schedule.warmup_steps=0 train.grad_clip=$clip log.interval=1)

# run NAME RANKS DECK GLOBAL MICRO [overrides...]: one fsdpp training run. The initial weights depend on the deck's
# model alone, so the seed file of 1 rank starts every rank count and mesh.
run() {
  local name=$1 ranks=$2 deck=$3 global=$4 micro=$5; shift 5
  local dir=$work/$name
  mkdir -p "$dir"
  "$mpiexec" -n "$ranks" "$fsdpp" train "$root/input/$deck" "${train[@]}" train.global_batch=$global \
    train.micro_batch=$micro "$@" "run.output=$dir/run" >"$dir/train.log"
}
# compare NAME...: transformers trains once, from the initial weights of the first run's model (its model.*
# overrides), on the batches every one of the runs took (the same global and micro batches: the balancing loss is
# per micro-batch), and holds each run's losses to it. The runs differ only in ranks and mesh. (Listed here, run
# by the batch at the end.)
compare() {
  local first=$work/$1 deck global micro model=() metrics=()
  read -r _ deck global micro < <(head -n 1 "$first/case")
  mapfile -t model < <(tail -n +2 "$first/case")
  "$fsdpp" init "$root/input/$deck" "${model[@]}" --out "$first/seed.h5" >/dev/null
  "$fsdpp" ckpt export "$first/seed.h5" "$first/hf" --hf --deck "$first/run/deck.resolved.yaml" >/dev/null
  for name in "$@"; do metrics+=("$work/$name/run/metrics.jsonl"); done
  local IFS=$'\t' args=(- train "$first/hf" "$work/tokens.u32" $T $global $micro $lr $clip)
  echo "${args[*]}"$'\t'"$(IFS=,; echo "${metrics[*]}")"$'\t'1e-5 >>"$checks"
}
# case NAME RANKS DECK GLOBAL MICRO [overrides...]: a run, remembered for compare (its model.* overrides).
case_() {
  run "$@"
  local dir=$work/$1
  echo "$1 $3 $4 $5" >"$dir/case"
  shift 5
  for o in "$@"; do [[ $o == model.* ]] && echo "$o" >>"$dir/case"; done
  true
}

# Dense Qwen3, and with tensor parallelism 2 (each rank half the heads, the q/k norms' gradients summed over tp);
# with context parallelism (each rank 2 of the 2 cp chunks of every sequence, ring attention): cp 2, cp 4 and
# cp 2 x tp 2.
case_ qwen3 1 qwen3-tiny.yaml 8 8
case_ qwen3-tp2 2 qwen3-tiny.yaml 8 8 mesh.tp=2
case_ qwen3-cp2 2 qwen3-tiny.yaml 8 8 mesh.cp=2 model.attention=fused
case_ qwen3-cp4 4 qwen3-tiny.yaml 8 8 mesh.cp=4 model.attention=fused
case_ qwen3-cp2-tp2 4 qwen3-tiny.yaml 8 8 mesh.cp=2 mesh.tp=2 model.attention=fused
compare qwen3 qwen3-tp2 qwen3-cp2 qwen3-cp4 qwen3-cp2-tp2
# Qwen3-MoE (a dense layer before the sparse ones), micro-batches of 4: 1 and 2 ranks, and ep 2 (each rank holds 4
# of the 8 experts and sends its rows to the other's).
case_ qwen3-moe 1 qwen3-moe-tiny.yaml 8 4
case_ qwen3-moe-ranks2 2 qwen3-moe-tiny.yaml 8 4
case_ qwen3-moe-ep2 2 qwen3-moe-tiny.yaml 8 4 mesh.ep=2
compare qwen3-moe qwen3-moe-ranks2 qwen3-moe-ep2
# Micro-batches of 2: activation checkpointing on 4 ranks; ep 2 x dp_shard_mod_ep 2 and ep 4 on 4 ranks; ep 2 with
# accumulation (2 micro-batches per rank), checkpointing and clipping on 2 ranks; tp 2 x ep 2 on 4 ranks; ep 2 x cp 2
# on 4 ranks (the balancing loss of whole sequences split over cp).
case_ qwen3-moe-ranks4-checkpointing 4 qwen3-moe-tiny.yaml 8 2 train.activation_checkpointing=full
case_ qwen3-moe-ep2-dp2 4 qwen3-moe-tiny.yaml 8 2 mesh.ep=2
case_ qwen3-moe-ep4 4 qwen3-moe-tiny.yaml 8 2 mesh.ep=4
case_ qwen3-moe-ep2-accumulation-checkpointing 2 qwen3-moe-tiny.yaml 8 2 mesh.ep=2 train.activation_checkpointing=full
case_ qwen3-moe-tp2-ep2 4 qwen3-moe-tiny.yaml 8 2 mesh.tp=2 mesh.ep=2
case_ qwen3-moe-ep2-cp2 4 qwen3-moe-tiny.yaml 8 2 mesh.ep=2 mesh.cp=2 model.attention=fused
compare qwen3-moe-ranks4-checkpointing qwen3-moe-ep2-dp2 qwen3-moe-ep4 qwen3-moe-ep2-accumulation-checkpointing \
  qwen3-moe-tp2-ep2 qwen3-moe-ep2-cp2
# Mixtral (4 experts): 3 ranks; HSDP, with and without ep 2 inside each replica; ep 4 (one expert per rank); tensor
# parallelism 2 on attention (the experts unsplit) with ep 2 over the data-parallel ranks.
case_ mixtral-ranks3 3 mixtral-tiny.yaml 9 3
compare mixtral-ranks3
case_ mixtral-hsdp 4 mixtral-tiny.yaml 8 2 fsdp.strategy=hybrid_shard mesh.dp_replicate=2
case_ mixtral-hsdp-ep2 4 mixtral-tiny.yaml 8 2 fsdp.strategy=hybrid_shard mesh.dp_replicate=2 mesh.ep=2
case_ mixtral-ep4 4 mixtral-tiny.yaml 8 2 mesh.ep=4
case_ mixtral-tp2-ep2 4 mixtral-tiny.yaml 8 2 mesh.tp=2 mesh.ep=2
compare mixtral-hsdp mixtral-hsdp-ep2 mixtral-ep4 mixtral-tp2-ep2
# Edge cases of routing: every expert for every token; sparse layers every other layer, unnormalised weights.
case_ mixtral-every-expert 2 mixtral-tiny.yaml 8 4 model.moe.top_k=4
compare mixtral-every-expert
case_ qwen3-moe-sparse-step 1 qwen3-moe-tiny.yaml 8 8 model.moe.dense_layers=[] model.moe.sparse_step=2 \
  model.moe.norm_topk_prob=false
compare qwen3-moe-sparse-step

# Every transformers run listed above, in one process; its verdicts (and any failure) shown.
"$py" "$ref/hf_reference.py" batch "$checks" | { grep -E "training steps within|FAIL" || true; } |
  sed "s|^$work/\([^/]*\)/run/metrics.jsonl|\1|"
