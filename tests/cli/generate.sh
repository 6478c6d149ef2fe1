#!/usr/bin/env bash
# fsdpp generate end to end: train a small byte-level model on the README and checkpoint it, then continue a
# prompt from the checkpoint on 1 rank and with the model split over 2 tensor-parallel ranks (the same greedy
# text), sample twice with one seed (the same text) and once with another; a Llama and a Qwen2 from weights files
# with --deck and --prompt-ids; a prompt that does not fit is refused, naming it.
#   generate.sh FSDPP MPIEXEC ROOT WORKDIR
set -euo pipefail
fsdpp=$1 mpiexec=$2 root=$3 work=$4
rm -rf "$work" && mkdir -p "$work" && cd "$work"
"$fsdpp" tokenize "$root/README.md" readme.bin >/dev/null
"$fsdpp" train data.source=readme.bin model.vocab_size=256 model.context_length=64 train.steps=30 \
  schedule.warmup_steps=5 train.eval_interval=0 checkpoint.interval=30 run.output=run >/dev/null
ckpt=run/checkpoints/step_00000030.h5
continuation() { sed -n '/^---- continuation/{n;p}' "$1"; }
"$fsdpp" generate "$ckpt" --prompt "fsdpp trains " --max-new-tokens 40 >one.txt
"$mpiexec" -n 2 "$fsdpp" generate "$ckpt" --prompt "fsdpp trains " --max-new-tokens 40 >two.txt
[ -n "$(continuation one.txt)" ] || { cat one.txt; echo "FAIL: no continuation"; exit 1; }
[ "$(continuation one.txt)" = "$(continuation two.txt)" ] ||
  { diff one.txt two.txt; echo "FAIL: tp 2 continued the prompt otherwise than 1 rank"; exit 1; }
grep -E "^prefill 13 tokens in [0-9.]+ s \([0-9.]+ tokens/s\); decode 39 tokens" one.txt
sample() { "$fsdpp" generate "$ckpt" --prompts prompts.txt --max-new-tokens 24 --temperature 1.0 --top-p 0.9 --seed "$1"; }
printf 'The planner\n\nCheckpoints are\n' >prompts.txt
sample 7 | grep -v '^prefill' >s1.txt; sample 7 | grep -v '^prefill' >s2.txt; sample 8 >s3.txt
cmp s1.txt s2.txt >/dev/null || { diff s1.txt s2.txt; echo "FAIL: one seed gave two texts"; exit 1; }
[ "$(grep -c '^---- continuation' s1.txt)" = 2 ] || { cat s1.txt; echo "FAIL: expected 2 prompts (one per line)"; exit 1; }
[ "$(continuation s1.txt)" != "$(continuation s3.txt)" ] || { echo "FAIL: another seed gave the same text"; exit 1; }
# fsdpp plan --generate counts the KV cache generate allocates: 2 prompts of 11 and 15 bytes, 24 new tokens.
kv=$(grep -oE "KV cache [0-9.]+ MiB per rank \(([0-9]+) bytes\)" s3.txt | grep -oE "[0-9]+ bytes" | cut -d' ' -f1)
planned=$(python3 -c 'import json, sys; print(json.loads(sys.stdin.read())["bytes_per_rank"]["kv_cache"])' \
          < <("$fsdpp" plan run/deck.resolved.yaml --ranks 1 --generate --sequences 2 --tokens 39 --json))
[ "$kv" = "$planned" ] || { echo "FAIL: fsdpp plan --generate counts a KV cache of $planned bytes, generate allocated $kv"; exit 1; }
echo "KV cache: $kv bytes, as planned"
for deck in llama-tiny qwen2-tiny; do
  "$fsdpp" init "$root/input/$deck.yaml" --out "$deck.h5" >/dev/null
  "$mpiexec" -n 2 "$fsdpp" generate "$deck.h5" --deck "$root/input/$deck.yaml" --prompt-ids 3,1,4,1,5 --max-new-tokens 8 |
    grep -E "^continuation ids: [0-9]+(,[0-9]+){7}$"
done
if "$fsdpp" generate "$ckpt" --prompt "$(head -c 60 "$root/README.md")" --max-new-tokens 10 >long.txt 2>&1; then
  echo "FAIL: a prompt longer than the context was accepted"; exit 1
fi
grep -E "prompt 1 has 60 tokens; with --max-new-tokens 10 that is 70, more than the model's context of 64" long.txt
echo "generate: 1 and 2 ranks agree, seeds repeat, Llama and Qwen2 generate, long prompts are refused"
