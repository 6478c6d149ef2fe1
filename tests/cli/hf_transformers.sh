#!/usr/bin/env bash
# hf_transformers.sh FSDPP MPIEXEC ROOT WORK: fsdpp's Hugging Face model folders against transformers itself
# (tests/reference/hf_reference.py; installed by tests/reference/ensure-transformers, or skipped with exit 77).
#   - tiny GPT-2, Llama (grouped-query, untied; and tied), Qwen2, Qwen3 (q/k norms, head_dim), Qwen3-MoE and
#     Mixtral (experts in the Hub's one-tensor-per-expert layout) models, trained by fsdpp so that their choices
#     are clear, exported with ckpt export --hf: from_pretrained gives fsdpp's next-token logits within 1e-5
#     (float32), and greedy generate of 48 tokens gives exactly fsdpp's ids (Mixtral's on 2 ranks too);
#   - a folder written by transformers' save_pretrained in several shards (and transformers 5's config fields)
#     imports (ckpt import, generate, init_from) and trains, with bitwise the logits of the folder it came from;
#   - fsdpp ckpt deck's model section parses back to the model transformers counts the parameters of;
#   - --tokenizer: AutoTokenizer.from_pretrained loads the exported folder, and fsdpp generate uses its tokenizer;
#   - data.document_mask (and reset_positions): fsdpp eval of packed documents equals transformers with the
#     explicit block-diagonal causal mask within 1e-5.
# Importing torch and transformers takes seconds, so every check against them is written to a list first and runs
# in one python process (hf_reference.py batch; each check as its own command would run it); fsdpp runs first.
set -euo pipefail
fsdpp=$1 mpiexec=$2 root=$3 work=$4
ref=$root/tests/reference
py=$("$ref/ensure-transformers") || { echo "$py"; exit 77; }
rm -rf "$work" && mkdir -p "$work"
prompt=5,17,42,8,33,1,60,23,9,14,50,2
common=(train.eval_interval=0 checkpoint.interval=300)
checks=$work/checks.tsv
: >"$checks"
# check TAG COMMAND ARGS...: a check for the batch ("-": must pass; "!": must fail; other: pass, lines prefixed).
check() { (IFS=$'\t'; echo "$*") >>"$checks"; }

# Inputs that need numpy or tokenizers only (no torch: quick): the packed documents, a trained tokenizer.json.
"$py" "$ref/hf_reference.py" packed "$work/packed.u32" 64 7,12,3,9,8
"$py" "$ref/hf_reference.py" tokenizer "$root/tests/data/multilingual.txt" "$work/tokenizer.json"

# name deck [overrides...]: train, export; fsdpp's logits and greedy ids, and ckpt deck's parameter count, to compare
# with transformers.
compare() {
  local name=$1 deck=$2; shift 2
  "$fsdpp" train "$root/input/$deck" "${common[@]}" "checkpoint.dir=$work/$name/ck" "run.output=$work/$name/run" "$@" \
    >"$work/$name.train.log"
  "$fsdpp" ckpt export "$work/$name/ck/step_00000300.h5" "$work/$name/hf" --hf | tail -n 1
  local ids
  ids=$("$fsdpp" generate "$work/$name/hf" --prompt-ids "$prompt" --max-new-tokens 48 --logits "$work/$name/logits.f32" \
        | sed -n 's/^continuation ids: //p')
  check - logits "$work/$name/hf" "$prompt" "$work/$name/logits.f32" 1e-5
  check - generate "$work/$name/hf" "$prompt" 48 "$ids"
  # ckpt deck's section parses back as a deck of the same model.
  { "$fsdpp" ckpt deck "$work/$name/hf"; echo "train: {steps: 1}"; } >"$work/$name/deck.yaml"
  local ours
  ours=$("$fsdpp" train "$work/$name/deck.yaml" --dry-run | sed -n 's/^dry run: \([0-9]*\) parameters.*/\1/p')
  [ -n "$ours" ] || { echo "FAIL: $name: no parameter count from the dry run of ckpt deck's model"; exit 1; }
  check - parameters "$work/$name/hf" "$ours"
}
compare gpt2 tiny.yaml
compare llama-gqa llama-tiny.yaml
compare llama-tied llama-tiny.yaml model.tie_embeddings=true
compare qwen2 qwen2-tiny.yaml
compare qwen3 qwen3-tiny.yaml
compare qwen3-moe qwen3-moe-tiny.yaml
compare mixtral mixtral-tiny.yaml
# Mixtral generated on 2 ranks: tensor parallelism splits attention, every rank runs the experts whole; transformers'
# greedy ids (checked above on 1 rank) exactly.
ids=$("$mpiexec" -n 2 "$fsdpp" generate "$work/mixtral/hf" --prompt-ids "$prompt" --max-new-tokens 48 \
      | sed -n 's/^continuation ids: //p')
check "2 ranks (mesh.tp 2): " generate "$work/mixtral/hf" "$prompt" 48 "$ids"

# Document masks: packed documents (each ended by id 63) through fsdpp eval --all with data.document_mask, against
# transformers with the explicit block-diagonal causal 4D mask and per-document position_ids, in float64. The loss
# without the mask must miss the masked reference (the check can fail: tag "!").
eval_loss() { "$fsdpp" eval "$work/$1/hf" "$work/packed.u32" --all "${@:2}" | sed -n 's/.*"loss": \([^,]*\),.*/\1/p'; }
for name in llama-gqa qwen2; do
  for reset in 0 1; do
    check - masked_loss "$work/$name/hf" "$work/packed.u32" 63 $reset \
      "$(eval_loss "$name" data.document_mask=true data.eot_id=63 "data.reset_positions=$([ $reset = 1 ] && echo true || echo false)")" 1e-5
  done
  unmasked=$(eval_loss "$name" data.document_mask=false)
  [ -n "$unmasked" ] || { echo "FAIL: $name: no loss from fsdpp eval without the mask"; exit 1; }
  check ! masked_loss "$work/$name/hf" "$work/packed.u32" 63 0 "$unmasked" 1e-5
done

# transformers' own folders, in shards (written by the batch, read below).
for name in llama-gqa qwen2 qwen3-moe mixtral; do
  check - shard "$work/$name/hf" "$work/$name/sharded" 100KB
done

# A tokenizer travels with the folder: AutoTokenizer reads it (in the batch), and fsdpp generate uses it by default.
"$fsdpp" train "$root/input/tiny.yaml" model.vocab_size=320 train.steps=2 checkpoint.interval=2 \
  "checkpoint.dir=$work/tok/ck" "run.output=$work/tok/run" train.eval_interval=0 schedule.warmup_steps=0 >/dev/null
"$fsdpp" ckpt export "$work/tok/ck/step_00000002.h5" "$work/tok/hf" --hf --tokenizer "$work/tokenizer.json" | tail -n 1
check - tokenize "$work/tok/hf" "$work/tokenizer.json" "Hello, wörld: 12345 tokens"
"$fsdpp" generate "$work/tok/hf" --prompt "Hello" --max-new-tokens 4 | grep -E "^---- continuation \(4 tokens\)"

# Every check against transformers, in one process.
echo "$(wc -l <"$checks") checks against transformers in one process:"
"$py" "$ref/hf_reference.py" batch "$checks"

# transformers' sharded folders: import, generate (bitwise the logits of the folder they came from), start a 2-rank
# run from them.
for name in llama-gqa qwen2 qwen3-moe mixtral; do
  "$fsdpp" ckpt import "$work/$name/sharded" "$work/$name/imported.h5"
  "$fsdpp" generate "$work/$name/sharded" --prompt-ids "$prompt" --max-new-tokens 1 --logits "$work/$name/sharded.f32" >/dev/null
  cmp "$work/$name/logits.f32" "$work/$name/sharded.f32" ||
    { echo "FAIL: $name: transformers' sharded folder gives other logits than the folder it saved"; exit 1; }
  echo "$name: transformers' sharded folder imports, and generates bitwise the logits of the folder it came from"
  cat >"$work/$name/finetune.yaml" <<EOF
model:
  from_hf: $work/$name/sharded
train: {steps: 2, global_batch: 4, micro_batch: 2, eval_interval: 0}
checkpoint: {init_from: $work/$name/sharded}
run: {output: $work/$name/run2}
EOF
  "$mpiexec" -n 2 "$fsdpp" train "$work/$name/finetune.yaml" | grep -E "weights initialized from|Loop time of"
done
echo "hf_transformers: GPT-2, Llama (GQA untied, tied), Qwen2, Qwen3, Qwen3-MoE and Mixtral folders agree with transformers"
