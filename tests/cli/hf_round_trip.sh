#!/usr/bin/env bash
# The interchange commands of docs/checkpoints.md, end to end: train and checkpoint, export to Hugging Face safetensors,
# import it back for the same deck, and fine-tune from it; also write a seed checkpoint and start from it.
set -eu
fsdpp=$1; mpirun=$2; deck=$3; dir=$4
rm -rf "$dir"; mkdir -p "$dir"
common=(schedule.warmup_steps=1 train.eval_interval=0 "run.output=$dir/run")
"$mpirun" -n 2 "$fsdpp" train "$deck" train.steps=3 checkpoint.interval=3 "checkpoint.dir=$dir/ck" "${common[@]}" > /dev/null
"$fsdpp" ckpt export "$dir/ck/step_00000003.h5" "$dir/model.safetensors" --dtype F32
"$fsdpp" ckpt import "$dir/model.safetensors" "$dir/imported.h5" --deck "$deck"
"$mpirun" -n 2 "$fsdpp" train "$deck" train.steps=2 "checkpoint.init_from=$dir/imported.h5" "${common[@]}"
"$mpirun" -n 2 "$fsdpp" init "$deck" --out "$dir/seed.h5"
"$mpirun" -n 2 "$fsdpp" train "$deck" train.steps=2 "checkpoint.init_from=$dir/model.safetensors" "${common[@]}"
h5dump -H "$dir/seed.h5" | grep -c DATASET
