#!/usr/bin/env bash
# fsdpp generate end to end: train a small byte-level model on a text and checkpoint it (its samples while
# training, on 1 and 2 ranks, are generate's text from the same step's checkpoint), then continue a prompt from
# the checkpoint on 1 rank and with the model split over 2 tensor-parallel ranks (the same greedy text), sample
# twice with one seed (the same text) and once with another; a Llama and a Qwen2 from weights files with --deck
# and --prompt-ids; a prompt that does not fit is refused, naming it, in generate and in training's samples.
#   generate.sh FSDPP MPIEXEC ROOT WORKDIR
set -euo pipefail
fsdpp=$1 mpiexec=$2 root=$3 work=$4
rm -rf "$work" && mkdir -p "$work" && cd "$work"
# A pinned text (the README of an earlier release), not the README itself: the checks below depend on what one
# step of training on it gives, which an edit of the README would change.
"$fsdpp" tokenize "$root/tests/data/generate-corpus.txt" readme.bin >/dev/null
"$fsdpp" train data.source=readme.bin model.vocab_size=256 model.context_length=64 train.steps=30 \
  schedule.warmup_steps=5 train.eval_interval=0 checkpoint.interval=30 run.output=run >/dev/null
ckpt=run/checkpoints/step_00000030.h5
continuation() { sed -n '/^---- continuation/{n;p}' "$1"; }
"$fsdpp" generate "$ckpt" --prompt "fsdpp trains " --max-new-tokens 40 >one.txt
# Samples while training (train.sample_interval) are, byte for byte, what generate gives from that step's
# checkpoint, on 1 rank, under fully_shard on 2 ranks (the forwards gather the shards) and through a pipeline of 2
# stages (mesh.pp 2: each decode forward's rows go from stage to stage, the last stage's logits back to all).
# After one step of a Llama (untied head): its continuations are varied bytes, where a trained tiny model
# continues with blanks that would agree whatever ran.
train=("$root/input/llama-tiny.yaml" data.source=readme.bin model.vocab_size=256 model.context_length=64
       schedule.warmup_steps=1 train.eval_interval=0 'train.sample_prompt=fsdpp trains ' train.sample_tokens=40)
text_after() {  # FILE HEADING END: the bytes between the line HEADING and END, in hex
  python3 -c 'import sys; d = open(sys.argv[1], "rb").read(); h = sys.argv[2].encode() + b"\n"; i = d.index(h) + len(h)
print(d[i:d.index(sys.argv[3].encode(), i)].hex())' "$@"
}
for layout in 1 2 "2 mesh.pp=2"; do
  read -r ranks mesh <<<"$layout"
  name=$ranks${mesh:+-pp}
  "$mpiexec" -n $ranks "$fsdpp" train "${train[@]}" $mesh train.steps=1 checkpoint.interval=1 train.sample_interval=1 \
    run.output=samples$name >samples$name.txt
  "$fsdpp" generate samples$name/checkpoints/step_00000001.h5 --prompt "fsdpp trains " --max-new-tokens 40 \
    >from-checkpoint$name.txt
  sampled=$(text_after samples$name.txt '---- sample at step 1: 40 tokens after "fsdpp trains " (greedy) ----' \
            $'\n---- end of sample ----') || { cat samples$name.txt; echo "FAIL: no sample at step 1"; exit 1; }
  generated=$(text_after from-checkpoint$name.txt '---- continuation (40 tokens) ----' $'\nprefill ')
  [ "$(fold -w 2 <<<"$generated" | sort -u | wc -l)" -ge 3 ] ||
    { cat from-checkpoint$name.txt; echo "FAIL: the continuation is not varied enough to compare"; exit 1; }
  [ "$sampled" = "$generated" ] ||
    { echo "sample $sampled"; echo "generate $generated"
      echo "FAIL: on $ranks rank(s) ${mesh:-} the sample at step 1 is not generate's text from step 1's checkpoint"; exit 1; }
done
if "$fsdpp" train data.source=readme.bin model.vocab_size=256 model.context_length=64 train.steps=2 \
  schedule.warmup_steps=1 train.sample_interval=1 'train.sample_prompt=fsdpp trains ' train.sample_tokens=60 \
  run.output=run3 >long_sample.txt 2>&1; then
  echo "FAIL: a sample longer than the context was accepted"; exit 1
fi
grep -F "train.sample_prompt is 13 tokens (byte-level" long_sample.txt
grep -F "with train.sample_tokens 60 that is 73, more than model.context_length 64" long_sample.txt
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
if "$fsdpp" generate "$ckpt" --prompt "$(head -c 60 "$root/tests/data/generate-corpus.txt")" --max-new-tokens 10 >long.txt 2>&1; then
  echo "FAIL: a prompt longer than the context was accepted"; exit 1
fi
grep -E "prompt 1 has 60 tokens; with --max-new-tokens 10 that is 70, more than the model's context of 64" long.txt
echo "generate: 1 and 2 ranks agree, seeds repeat, Llama and Qwen2 generate, long prompts are refused"
