#!/usr/bin/env bash
# Prints the training and validation losses of every strategy at 1, 2, 3 and 4 ranks, one line per run, each
# loss written with all 17 significant digits (metrics.jsonl). Two builds are bitwise the same when their
# outputs are byte-identical: see compare_losses.sh.
#   tests/regress/loss_matrix.sh path/to/fsdpp > losses.txt
set -euo pipefail
fsdpp=${1:?usage: $0 path/to/fsdpp}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1 FSDPP_ALLOW_GPU_SHARING=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The tiny model with 3 layers, 48 sequences per step in micro-batches of 4 (12, 6, 4 and 3 per rank at 1-4
# ranks); every 64-row matrix is padded at 3 ranks.
common=(train.steps=6 train.global_batch=48 train.micro_batch=4 train.eval_interval=3 train.eval_batches=2
        model.n_layer=3 schedule.warmup_steps=2 log.interval=1)
# Builds with a GEMM precision setting (matmul.*) would compute the bf16 runs' GEMMs in bf16 (matmul.precision
# auto) and, on GPU builds, f32 GEMMs in TF32: pin exact f32 GEMMs so the matrix stays comparable, bit for bit,
# with builds from before that setting (bf16 GEMMs are tested in tests/mpi/test_train_gemm_precision.cpp).
if "$fsdpp" train --help-deck 2>/dev/null | grep -q '^  matmul\.precision '; then
  common+=(matmul.precision=f32 matmul.tf32=false)
fi
# One line of losses: "loss[/val_loss]" per step, repr() keeps every digit.
losses_of() {
  python3 -c 'import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print(" ".join(repr(r["loss"]) + ("/" + repr(r["val_loss"]) if r.get("val_loss") is not None else "") for r in rows))' "$1"
}
configs=(
  "full_shard|"
  "shard_grad_op|fsdp.strategy=shard_grad_op"
  "no_shard|fsdp.strategy=no_shard"
  "bf16|fsdp.param_dtype=bf16 fsdp.reduce_dtype=bf16"
  "unsharded_accumulation|fsdp.accumulate=unsharded"
  "cpu_offload|fsdp.offload=cpu"
  "sgd_no_clip|optim.name=sgd optim.momentum=0.9 train.grad_clip=0"
)
# One run: NAME RANKS OVERRIDES...; prints "NAME np=RANKS: losses".
run() {
  local name=$1 np=$2 out="$work/$1-$2"
  shift 2
  mpiexec -n "$np" "$fsdpp" train "${common[@]}" "$@" run.output="$out" >"$out.log" 2>&1 ||
    { echo "error: $name at $np ranks failed:" >&2; tail -20 "$out.log" >&2; exit 1; }
  echo "$name np=$np: $(losses_of "$out/metrics.jsonl")"
}
for np in 1 2 3 4; do
  for entry in "${configs[@]}"; do
    read -r -a extra <<<"${entry#*|}"
    run "${entry%%|*}" "$np" "${extra[@]}"
  done
done
# HSDP and reshard_after_forward=k need more than one rank in a dimension.
run hsdp_2x1 2 fsdp.strategy=hybrid_shard mesh.dp_replicate=2
run hsdp_2x2 4 fsdp.strategy=hybrid_shard mesh.dp_replicate=2
run reshard_after_forward_2 4 fsdp.reshard_after_forward=2
