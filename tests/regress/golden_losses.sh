#!/usr/bin/env bash
# Bitwise loss regression against committed data: a fixed set of short runs (GPT-2, Llama and Qwen2; every
# sharding strategy, HSDP, tensor and sequence parallelism, activation checkpointing, bf16, CPU offload, the
# attention kernels), each step's loss, validation loss and gradient norm written with every digit. `check`
# compares them with `==` (byte-identical lines) against tests/regress/golden_losses.txt, which `record` writes.
#   tests/regress/golden_losses.sh check  path/to/fsdpp    # exit 0 only when every line is identical
#   tests/regress/golden_losses.sh record path/to/fsdpp    # rewrite the file (after a change meant to alter losses)
# OpenBLAS picks its kernels by processor, and differently-blocked GEMMs round differently: the runs pin the
# Haswell kernels (AVX2 + FMA, present on every x86-64 machine we build on), so the bits do not depend on which
# processor CI lands on.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mode=${1:?usage: $0 check|record path/to/fsdpp [NAME-FILTER]}
fsdpp=${2:?usage: $0 check|record path/to/fsdpp [NAME-FILTER]}
filter=${3:-}
golden="$here/golden_losses.txt"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1 OPENBLAS_CORETYPE=Haswell FSDPP_ALLOW_GPU_SHARING=1 FSDPP_MEMORY_CHECK=0
decks="$here/../../input"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# 4 steps of 16 sequences in micro-batches of 2 (8, 4, 2 micro-batches per rank at 1, 2, 4 ranks), an evaluation
# after step 2 and 4, exact f32 GEMMs unless a run asks for bf16 ones.
common=(train.steps=4 train.global_batch=16 train.micro_batch=2 train.eval_interval=2 train.eval_batches=1
        schedule.warmup_steps=1 log.interval=1 matmul.precision=f32 matmul.tf32=false model.context_length=32)
# NAME|RANKS|DECK|OVERRIDES
runs=(
  "gpt2_full_shard|1|tiny.yaml|"
  "gpt2_full_shard|2|tiny.yaml|"
  "gpt2_full_shard_3layers|3|tiny.yaml|model.n_layer=3 train.global_batch=18"
  "gpt2_shard_grad_op|2|tiny.yaml|fsdp.strategy=shard_grad_op"
  "gpt2_no_shard|2|tiny.yaml|fsdp.strategy=no_shard"
  "gpt2_hsdp_2x2|4|tiny.yaml|fsdp.strategy=hybrid_shard mesh.dp_replicate=2"
  "gpt2_reshard_2|4|tiny.yaml|fsdp.reshard_after_forward=2"
  "gpt2_unsharded_accumulation|2|tiny.yaml|fsdp.accumulate=unsharded"
  "gpt2_untied_sgd|2|tiny.yaml|model.tie_embeddings=false optim.name=sgd train.grad_clip=0"
  "gpt2_bf16|2|tiny.yaml|fsdp.param_dtype=bf16 fsdp.reduce_dtype=bf16 matmul.precision=auto"
  "gpt2_cpu_offload|2|tiny.yaml|fsdp.offload=cpu"
  "gpt2_ac_full|2|tiny.yaml|train.activation_checkpointing=full"
  "gpt2_ac_every_2|1|tiny.yaml|train.activation_checkpointing=every_2 model.n_layer=4"
  "gpt2_attention_fused|1|tiny.yaml|model.attention=fused"
  "gpt2_attention_batched|2|tiny.yaml|model.attention=batched"
  "gpt2_tp2|2|tiny.yaml|mesh.tp=2"
  "gpt2_tp2_sp_ac|2|tiny.yaml|mesh.tp=2 mesh.tp_sequence_parallel=true train.activation_checkpointing=full"
  "gpt2_dp2_tp2_sp_untied|4|tiny.yaml|mesh.tp=2 mesh.tp_sequence_parallel=true model.tie_embeddings=false"
  "llama_full_shard|1|llama-tiny.yaml|"
  "llama_full_shard|2|llama-tiny.yaml|"
  "llama_hsdp_2x2|4|llama-tiny.yaml|fsdp.strategy=hybrid_shard mesh.dp_replicate=2"
  "llama_tied_shard_grad_op|2|llama-tiny.yaml|model.tie_embeddings=true fsdp.strategy=shard_grad_op"
  "llama_bf16_offload|2|llama-tiny.yaml|fsdp.param_dtype=bf16 matmul.precision=auto fsdp.offload=cpu"
  "llama_ac_fused|2|llama-tiny.yaml|train.activation_checkpointing=full model.attention=fused"
  "llama_rope_scaling|1|llama-tiny.yaml|model.rope_scaling_factor=8 model.rope_original_context=16"
  "llama_tp2_sp|2|llama-tiny.yaml|mesh.tp=2 mesh.tp_sequence_parallel=true"
  "llama_dp2_tp2_ac|4|llama-tiny.yaml|mesh.tp=2 train.activation_checkpointing=every_2"
)
if [ -f "$decks/qwen2-tiny.yaml" ]; then
  runs+=(
    "qwen2_full_shard|2|qwen2-tiny.yaml|"
    "qwen2_hsdp_2x2_ac|4|qwen2-tiny.yaml|fsdp.strategy=hybrid_shard mesh.dp_replicate=2 train.activation_checkpointing=full"
    "qwen2_tp2_sp_untied|2|qwen2-tiny.yaml|mesh.tp=2 mesh.tp_sequence_parallel=true model.tie_embeddings=false"
  )
fi

# "loss/val_loss|grad_norm" per step; repr() keeps every digit.
losses_of() {
  python3 -c 'import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print(" ".join(repr(r["loss"]) + ("/" + repr(r["val_loss"]) if r.get("val_loss") is not None else "")
               + "|" + repr(r["grad_norm"]) for r in rows))' "$1"
}

out="$work/losses.txt"
: >"$out"
for entry in "${runs[@]}"; do
  IFS='|' read -r name np deck extra <<<"$entry"
  [ -z "$filter" ] || [[ "$name" == *$filter* ]] || continue
  read -r -a overrides <<<"$extra"
  dir="$work/$name-$np"
  mpiexec -n "$np" "$fsdpp" train "$decks/$deck" "${common[@]}" "${overrides[@]}" run.output="$dir" \
    >"$dir.log" 2>&1 || { echo "error: $name at $np ranks failed:" >&2; tail -20 "$dir.log" >&2; exit 1; }
  echo "$name np=$np: $(losses_of "$dir/metrics.jsonl")" >>"$out"
done

case "$mode" in
  record)
    [ -z "$filter" ] || { echo "error: record takes no filter (it rewrites the whole file)" >&2; exit 2; }
    {
      echo "# Per-step loss[/validation loss]|gradient norm of tests/regress/golden_losses.sh's runs, every digit."
      echo "# Written by: tests/regress/golden_losses.sh record build/bin/fsdpp ($(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown))"
      cat "$out"
    } >"$golden"
    echo "recorded $(wc -l <"$out") runs in $golden" ;;
  check)
    expected="$work/expected.txt"
    grep -v '^#' "$golden" >"$expected"
    if [ -n "$filter" ]; then
      grep -F -f <(cut -d: -f1 "$out") "$expected" >"$expected.filtered" || true
      mv "$expected.filtered" "$expected"
    fi
    missing=$(comm -23 <(cut -d: -f1 "$out" | sort) <(cut -d: -f1 "$expected" | sort))
    [ -z "$missing" ] || { echo "error: no golden losses for: $missing (record them)" >&2; exit 1; }
    if diff -u "$expected" "$out"; then
      echo "golden losses: $(wc -l <"$out") runs bitwise identical"
    else
      echo "error: losses differ from $golden (diff above: - golden, + this build)" >&2
      exit 1
    fi ;;
  *) echo "usage: $0 check|record path/to/fsdpp [NAME-FILTER]" >&2; exit 2 ;;
esac
