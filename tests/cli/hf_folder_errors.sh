#!/usr/bin/env bash
# hf_folder_errors.sh FSDPP MPIEXEC ROOT WORK: Hugging Face model folders fsdpp must refuse, each with an error that
# names the file and the field (or shard, or tensor), and nothing written half: no out.h5 (nor .partial), no
# export folder. The folders are fsdpp's own exports, edited the way a broken download or a hand edit would be.
set -euo pipefail
fsdpp=$1 mpiexec=$2 root=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
"$fsdpp" init "$root/input/llama-tiny.yaml" --out "$work/llama.h5" >/dev/null
"$fsdpp" init "$root/input/qwen2-tiny.yaml" --out "$work/qwen2.h5" >/dev/null
"$fsdpp" init "$root/input/tiny.yaml" --out "$work/gpt2.h5" >/dev/null
"$fsdpp" ckpt export "$work/llama.h5" "$work/llama" --hf --deck "$root/input/llama-tiny.yaml" --max-shard-size 100KB >/dev/null
"$fsdpp" ckpt export "$work/qwen2.h5" "$work/qwen2" --hf --deck "$root/input/qwen2-tiny.yaml" >/dev/null
"$fsdpp" ckpt export "$work/gpt2.h5" "$work/gpt2" --hf --deck "$root/input/tiny.yaml" >/dev/null
out=$work/out.h5
refused=0

# refuse WHAT REGEX -- command...: the command fails, its output matches REGEX, and it left nothing behind.
refuse() {
  local what=$1 re=$2
  shift 3
  if "$@" >"$work/last.log" 2>&1; then echo "FAIL: $what: accepted"; exit 1; fi
  grep -Eq -- "$re" "$work/last.log" || { echo "FAIL: $what: the error lacks /$re/:"; cat "$work/last.log"; exit 1; }
  for left in "$out" "$out.partial" "$work/export" "$work/export.partial"; do
    [ ! -e "$left" ] || { echo "FAIL: $what: left $left behind"; exit 1; }
  done
  echo "refused: $what: $(grep -Em1 -- "$re" "$work/last.log" | sed 's/^[^:]*[Ee]rror: //')"
  refused=$((refused + 1))
}
# variant NAME FROM: a copy of folder FROM to edit
variant() { rm -rf "$work/$1"; cp -r "$work/$2" "$work/$1"; }
# set_field FOLDER FIELD JSON: config.json's FIELD set to JSON (added after the opening brace when absent)
set_field() {
  local c=$1/config.json
  if grep -q "^  \"$2\":" "$c"; then sed -i "s|^  \"$2\": .*|  \"$2\": $3,|" "$c"; else sed -i "1a\\  \"$2\": $3," "$c"; fi
}

# The config contradicts the weights: one layer more than the shards hold.
variant layers llama && set_field "$work/layers" num_hidden_layers 3
refuse "config.json says 3 layers, the weights hold 2" \
  "missing from .*/layers: model\\.layers\\.2\\..*|config\\.json and the weights beside it must describe one model" \
  -- "$fsdpp" ckpt import "$work/layers" "$out"
variant tied llama && set_field "$work/tied" tie_word_embeddings true
refuse "tie_word_embeddings true, but the weights hold their own lm_head" "lm_head\\.weight: the file's model has its own LM head" \
  -- "$fsdpp" ckpt import "$work/tied" "$out"
# A deck that contradicts the folder it names, and a run whose deck contradicts the folder it starts from.
printf 'model:\n  from_hf: %s\n  n_embd: 32\ntrain: {steps: 1}\n' "$work/llama" >"$work/contradicts.yaml"
refuse "the deck's model.n_embd contradicts config.json's hidden_size" \
  "contradicts\\.yaml:3:11: model\\.n_embd is 32, but .*/llama/config\\.json says hidden_size 64" \
  -- "$fsdpp" ckpt import "$work/llama" "$out" --deck "$work/contradicts.yaml"
refuse "init_from a folder whose rms_norm_eps is not the deck's norm_eps" \
  "config\\.json describes another model than the deck's:.*|model\\.norm_eps is 1e-06, but rms_norm_eps is 1e-05" \
  -- "$fsdpp" train "$root/input/llama-tiny.yaml" "checkpoint.init_from=$work/llama" model.norm_eps=1e-6 train.steps=1 schedule.warmup_steps=0 \
     "run.output=$work/run"

# Shards and the index.
variant missing llama && rm "$work/missing/model-00002-of-00005.safetensors"
refuse "a shard the index names is missing" \
  "model\\.safetensors\\.index\\.json: names shard 'model-00002-of-00005\\.safetensors' .* does not exist" \
  -- "$fsdpp" ckpt import "$work/missing" "$out"
for outside in ../x.safetensors /etc/x.safetensors sub/model.safetensors; do
  variant outside llama
  sed -i "0,/\"model-00001-of-00005.safetensors\"/s||\"$outside\"|" "$work/outside/model.safetensors.index.json"
  refuse "the index names $outside" "index\\.json: weight_map\\['[^']+'\\] is '${outside//./\\.}', which is not a file of the model folder" \
    -- "$fsdpp" ckpt import "$work/outside" "$out"
done
variant moved llama
sed -i '0,/"model-00001-of-00005.safetensors"/s//"model-00002-of-00005.safetensors"/' "$work/moved/model.safetensors.index.json"
refuse "the index places a tensor in a shard that does not hold it" \
  "the index places '[^']+' in .*model-00002-of-00005\\.safetensors, which does not hold it" \
  -- "$fsdpp" ckpt import "$work/moved" "$out"
variant pickles llama && rm "$work/pickles"/model* && touch "$work/pickles/pytorch_model.bin"
refuse "PyTorch pickles only" "the weights are PyTorch pickles \\(pytorch_model\\.bin\\); fsdpp reads safetensors only" \
  -- "$fsdpp" generate "$work/pickles" --prompt-ids 1,2
variant noconfig gpt2 && rm "$work/noconfig/config.json"
refuse "no config.json" "noconfig/config\\.json: cannot read the model folder's config\\.json" \
  -- "$fsdpp" ckpt import "$work/noconfig" "$out"

# Config fields fsdpp does not compute, each refused by name.
check_field() {  # FOLDER FIELD JSON REGEX
  variant field "$1" && set_field "$work/field" "$2" "$3"
  refuse "$1 with $2 $3" "$4" -- "$fsdpp" ckpt import "$work/field" "$out"
}
check_field llama rope_scaling '{"rope_type": "yarn", "factor": 4.0}' "rope_scaling': rope_type 'yarn' is not implemented"
check_field llama rope_scaling '{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "beta": 1}' \
  "field 'rope_scaling': field 'beta' \\(1\\) is not implemented by fsdpp's llama3 RoPE scaling"
check_field llama attention_bias true "field 'attention_bias' is true, which fsdpp does not implement"
check_field llama mlp_bias true "field 'mlp_bias' is true, which fsdpp does not implement"
check_field llama hidden_act '"gelu"' "field 'hidden_act' is \"gelu\", which fsdpp does not implement: it computes SwiGLU's SiLU"
check_field llama head_dim 32 "field 'head_dim' is 32, which fsdpp does not implement"
check_field llama qk_norm true "config\\.json: field 'qk_norm' \\(true\\) is not implemented by fsdpp's Llama"
check_field qwen2 use_sliding_window true "field 'use_sliding_window' is true, which fsdpp does not implement"
check_field qwen2 layer_types '["full_attention", "sliding_attention"]' "field 'layer_types' holds 'sliding_attention'"
check_field gpt2 activation_function '"relu"' "field 'activation_function' is \"relu\", which fsdpp does not implement"
check_field gpt2 layer_norm_epsilon 1e-6 "field 'layer_norm_epsilon' is 1e-06, which fsdpp does not implement"
check_field gpt2 model_type '"mistral"' "model_type 'mistral' is not a model fsdpp implements"
check_field gpt2 n_head '"4"' "field 'n_head' is \"4\"; expected an integer"

# Exports that cannot be written whole write nothing.
mkdir -p "$work/full" && touch "$work/full/keep"
refuse "export into a folder that is not empty" "full: the folder exists and is not empty" \
  -- "$fsdpp" ckpt export "$work/llama.h5" "$work/full" --hf --deck "$root/input/llama-tiny.yaml"
[ -f "$work/full/keep" ] || { echo "FAIL: the folder's file is gone"; exit 1; }
refuse "a shard size transformers would not write" "--max-shard-size '5 gigs': expected a size" \
  -- "$fsdpp" ckpt export "$work/llama.h5" "$work/export" --hf --deck "$root/input/llama-tiny.yaml" --max-shard-size "5 gigs"
refuse "a weights file without its deck" "holds no deck|carries no deck|--deck" \
  -- "$fsdpp" ckpt export "$work/llama.h5" "$work/export" --hf
mkdir -p "$work/bigtok" && cp "$work/llama/config.json" "$work/bigtok/" && echo '{}' >"$work/bigtok/tokenizer.json"
echo '{"eos_token_id": 50256}' >"$work/bigtok/generation_config.json"
refuse "a tokenizer whose eos is outside the vocabulary" "special token id 50256 is outside the model's vocabulary of 64" \
  -- "$fsdpp" ckpt export "$work/llama.h5" "$work/export" --hf --deck "$root/input/llama-tiny.yaml" --tokenizer "$work/bigtok"
echo "hf_folder_errors: $refused refusals, each naming its file and field; nothing written half"
