#!/usr/bin/env bash
# fsdpp eval: the validation loss of a checkpoint equals the val_loss training logged for it (every digit), on
# 1 and 2 ranks (each against a training run on as many ranks); --all gives one number on 1, 2 and 4 ranks and
# under tensor parallelism; a weights file needs --deck.
#   eval.sh FSDPP MPIEXEC ROOT WORKDIR
set -euo pipefail
fsdpp=$1 mpiexec=$2 root=$3 work=$4
rm -rf "$work" && mkdir -p "$work" && cd "$work"
"$fsdpp" tokenize "$root/tests/data/generate-corpus.txt" readme.bin >/dev/null  # a pinned text: README edits change no result
common=(data.source=readme.bin model.vocab_size=256 model.context_length=64 train.steps=12 schedule.warmup_steps=2
        train.eval_interval=12 train.eval_batches=3 train.micro_batch=4 checkpoint.interval=12)
field() { python3 -c 'import json, sys; print(repr(json.loads(sys.argv[1])[sys.argv[2]]))' "$1" "$2"; }
for n in 1 2; do
  "$mpiexec" -n "$n" "$fsdpp" train "${common[@]}" run.output="run$n" >/dev/null
  logged=$(field "$(tail -n 1 "run$n/metrics.jsonl")" val_loss)
  evaluated=$(field "$("$mpiexec" -n "$n" "$fsdpp" eval "run$n/checkpoints/step_00000012.h5" readme.bin | tail -n 1)" loss)
  [ "$logged" = "$evaluated" ] || { echo "FAIL: $n rank(s): eval $evaluated, training's val_loss $logged"; exit 1; }
  echo "$n rank(s): val_loss $evaluated, as training logged"
done
all() { field "$("$mpiexec" -n "$1" "$fsdpp" eval run1/checkpoints/step_00000012.h5 readme.bin --all "${@:2}" | tail -n 1)" loss; }
one=$(all 1)
for layout in "2" "4" "2 mesh.tp=2" "4 fsdp.strategy=hybrid_shard mesh.dp_replicate=2"; do
  read -r -a a <<<"$layout"
  got=$(all "${a[@]}")
  python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(abs(a - b) > 1e-6 * abs(b))" "$got" "$one" ||
    { echo "FAIL: --all on $layout: $got, 1 rank $one"; exit 1; }
done
echo "--all: loss $one on 1, 2, 4 ranks, tp 2 and HSDP alike"
"$fsdpp" ckpt consolidate run1/checkpoints/step_00000012.h5 weights.h5 >/dev/null
if "$fsdpp" eval weights.h5 readme.bin >nodeck.txt 2>&1; then echo "FAIL: a weights file without --deck was accepted"; exit 1; fi
grep -E "carries no deck: pass the model's deck with --deck" nodeck.txt
echo "eval: training's validation loss on 1 and 2 ranks, --all alike everywhere"
