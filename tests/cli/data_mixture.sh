#!/usr/bin/env bash
# data.sources end to end: two small corpora (a folder and an index.json, written here as fsdpp tokenize's corpus
# mode lays them out), weights 3 and 1, the tiny-shaped model in reproducible mode. The banner names each source
# with its weight and token count; the log gives each source's share of the tokens drawn, at each evaluation and
# at the end. A run of 6 steps on 2 ranks saves at step 3; resumed from there on 3 ranks, steps 4-6 have the same
# losses, bitwise, as the uninterrupted run, and the end-of-run shares count the whole run. A resume with other
# weights is refused naming the source. fsdpp eval takes the mixture's checkpoint and one corpus.
#   data_mixture.sh FSDPP MPIEXEC WORKDIR
set -u
fsdpp=$1; mpirun=$2; dir=$3
rm -rf "$dir"; mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }

# Two corpora of documents ending in eot 63: "web" (two shards, 12000 tokens) and "code" (one shard, 6000 tokens),
# each from its own seeded Markov-ish rule so that the sources differ.
python3 - "$dir" <<'EOF' || fail "writing the corpora"
import json, os, random, struct, sys
root = sys.argv[1]
def corpus(name, shards, tokens_per_shard, seed, step):
    folder = os.path.join(root, name); os.makedirs(folder)
    rng = random.Random(seed); entries = []
    for s in range(shards):
        toks, t, docs = [], 0, 0
        while len(toks) < tokens_per_shard:
            for _ in range(rng.randint(20, 200)):
                t = (t * step + rng.randint(0, 3)) % 63; toks.append(t)
            toks.append(63); docs += 1
        path = f"shard-{s:05d}.bin"
        with open(os.path.join(folder, path), "wb") as f:
            f.write(struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)))
            f.write(struct.pack(f"<{len(toks)}H", *toks))
        entries.append({"path": path, "source": f"{name}.jsonl", "byte_begin": 0, "byte_end": 1, "documents": docs,
                        "tokens": len(toks), "bytes": len(toks),
                        "skipped": {"invalid_utf8": 0, "malformed_json": 0, "missing_field": 0, "truncated_zstd": 0}})
    index = {"format": "fsdpp-corpus", "version": 1, "tokenizer": "test", "vocab_size": 64, "eot_id": 63,
             "bos_id": None, "token_bytes": 2, "shards": entries}
    with open(os.path.join(folder, "index.json"), "w") as f: json.dump(index, f)
corpus("web", 2, 6000, 1, 5)
corpus("code", 1, 6000, 2, 7)
EOF

deck() {  # deck WEIGHT_OF_CODE
  cat <<EOF
run: {name: mix, seed: 7}
model: {vocab_size: 64, context_length: 16, n_embd: 32, n_layer: 1, n_head: 2}
data:
  sources:
    - {path: $dir/web, weight: 3}
    - {path: $dir/code/index.json, weight: $1}
  val_fraction: 0.1
optim: {lr: 3.0e-3, weight_decay: 0.0}
train: {steps: 6, global_batch: 6, micro_batch: 1, eval_interval: 3, eval_batches: 2, reproducible: true}
log: {interval: 1}
EOF
}
deck 1 > "$dir/mix.yaml"
deck 2 > "$dir/reweighted.yaml"

"$mpirun" -n 2 "$fsdpp" train "$dir/mix.yaml" checkpoint.interval=3 "checkpoint.dir=$dir/ck" "run.output=$dir/whole" \
  > "$dir/whole.log" 2>&1 || { tail -30 "$dir/whole.log"; fail "the uninterrupted run on 2 ranks"; }
grep -q "data: a mixture of 2 sources" "$dir/whole.log" || { cat "$dir/whole.log"; fail "no mixture banner"; }
web_tokens=$(grep -oE "$dir/web \(weight 3, 75\.0%\): [0-9]+ tokens" "$dir/whole.log") || fail "no banner line for web"
grep -qE "$dir/code/index.json \(weight 1, 25\.0%\): [0-9]+ tokens" "$dir/whole.log" || fail "no banner line for code"
echo "banner: $web_tokens"
# Shares: after step 3 (18 sequences, 288 tokens) at the evaluation, and after step 6 (576 tokens) at the end.
grep -q "data: tokens drawn by source over 288 training tokens" "$dir/whole.log" || { cat "$dir/whole.log"; fail "no shares at step 3"; }
grep -q "data: tokens drawn by source over 576 training tokens" "$dir/whole.log" || fail "no shares at the end"
grep -A2 "over 576 training tokens" "$dir/whole.log"

"$mpirun" -n 3 "$fsdpp" train "$dir/mix.yaml" "checkpoint.resume=$dir/ck/step_00000003.h5" \
  "checkpoint.dir=$dir/ck3" "run.output=$dir/resumed" > "$dir/resumed.log" 2>&1 \
  || { tail -30 "$dir/resumed.log"; fail "the resume on 3 ranks"; }
grep -qE "resumed from .*step_00000003.h5 at step 3" "$dir/resumed.log" || { tail -30 "$dir/resumed.log"; fail "did not resume at step 3"; }
for step in 4 5 6; do
  want=$(grep "\"step\":$step," "$dir/whole/metrics.jsonl" | grep -o '"loss":[^,}]*')
  got=$(grep "\"step\":$step," "$dir/resumed/metrics.jsonl" | grep -o '"loss":[^,}]*')
  echo "step $step: 2 ranks $want, resumed on 3 ranks $got"
  [ -n "$want" ] && [ "$want" = "$got" ] || fail "step $step: the resumed run's loss differs"
done
# The shares of the whole run, the same lines as the uninterrupted run's.
[ "$(grep -A2 "over 576 training tokens" "$dir/resumed.log")" = "$(grep -A2 "over 576 training tokens" "$dir/whole.log")" ] \
  || { grep -A2 "training tokens" "$dir/resumed.log"; fail "the resumed run's end-of-run shares differ"; }

"$mpirun" -n 2 "$fsdpp" train "$dir/reweighted.yaml" "checkpoint.resume=$dir/ck/step_00000003.h5" \
  "checkpoint.dir=$dir/ck4" "run.output=$dir/reweighted" > "$dir/reweighted.log" 2>&1 && fail "a resume with other weights ran"
grep -q "data source 1 ($dir/web) has [0-9]* tokens and weight 0.6, but the checkpoint trained on it with [0-9]* tokens and weight 0.75" \
  "$dir/reweighted.log" || { tail -20 "$dir/reweighted.log"; fail "no refusal naming the source"; }
# A source whose path does not exist is refused as such, at its entry's deck line and column (not as a token file
# with an unknown extension).
sed "s|$dir/code/index.json|$dir/nope|" "$dir/mix.yaml" > "$dir/missing.yaml"
"$fsdpp" train "$dir/missing.yaml" "run.output=$dir/missing" > "$dir/missing.log" 2>&1 && fail "a missing source ran"
grep -q "missing.yaml:6:14: data.sources entry 2 path: $dir/nope does not exist: give a token file" "$dir/missing.log" \
  || { tail -5 "$dir/missing.log"; fail "no refusal of the missing path at its deck line and column"; }
# fsdpp eval of the mixture's checkpoint on one corpus: the override of data.source replaces the saved deck's mixture.
"$fsdpp" eval "$dir/ck/step_00000006.h5" "$dir/code" > "$dir/eval.log" 2>&1 || { tail "$dir/eval.log"; fail "eval of the mixture's checkpoint"; }
grep -q "eval: the validation split of $dir/code " "$dir/eval.log" || { cat "$dir/eval.log"; fail "eval did not read the corpus"; }
echo "data.sources: banner, shares, a resume on 3 ranks with the same losses, other weights refused, a missing path refused at its line, eval on a corpus"
