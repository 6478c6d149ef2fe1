#!/usr/bin/env bash
# corpus_end_to_end.sh FSDPP MPIEXEC ROOT WORK: the README's path from JSON Lines shards to training, offline.
#   1. share/scripts/make-demo-corpus writes two sources of JSON Lines shards, some .zst (licence texts and
#      package copyright files, which every Debian machine ships);
#   2. fsdpp tokenize (corpus mode, 2 ranks, byte-level ids with end-of-text 256) makes a folder of shards and an
#      index per source;
#   3. fsdpp train input/corpus-demo.yaml mixes them 3:1 with data.sources, document masks and reset positions on a
#      small Llama, on 2 ranks: the banner names both corpora, the shares are logged, the loss falls;
#   4. fsdpp eval --all of the checkpoint reads a corpus folder whole;
#   5. a deck whose data.eot_id is not the corpus's is refused, naming the corpus and the id to use.
set -euo pipefail
fsdpp=$1 mpiexec=$2 root=$3 work=$4
rm -rf "$work" && mkdir -p "$work" && cd "$work"  # the README's commands, from the folder that holds corpus/
fail() { echo "FAIL: $*"; exit 1; }

"$root/share/scripts/make-demo-corpus" raw --max-mb 0.5
for source in licenses copyright; do
  "$mpiexec" -n 2 "$fsdpp" tokenize --eot-id 256 --shard-bytes 200000 "raw/$source/*.jsonl*" "corpus/$source" \
    > "$work/tokenize-$source.log" 2>&1 || { cat "$work/tokenize-$source.log"; fail "tokenize $source"; }
  grep -E "^.*wrote [0-9]+ documents" "$work/tokenize-$source.log" | sed 's/^.*wrote/wrote/'
  [ -f "$work/corpus/$source/index.json" ] || fail "no index for $source"
done
# Every document of the raw shards is in the corpus, each ended by the end-of-text id.
python3 - "$work" <<'PY' || fail "documents and separators"
import json, glob, subprocess, struct, sys
work = sys.argv[1]
for source in ("licenses", "copyright"):
    docs = []
    for path in sorted(glob.glob(f"{work}/raw/{source}/*.jsonl*")):
        raw = subprocess.run(["zstd", "-dc", path], capture_output=True, check=True).stdout if path.endswith(".zst") \
              else open(path, "rb").read()
        docs += [json.loads(line)["text"] for line in raw.decode().splitlines() if line.strip()]
    index = json.load(open(f"{work}/corpus/{source}/index.json"))
    ids = []
    for shard in index["shards"]:
        data = open(f"{work}/corpus/{source}/{shard['path']}", "rb").read()
        count = struct.unpack_from("<3i", data)[2]
        ids += struct.unpack_from(f"<{count}H", data, 1024)
    want = []
    for d in docs:
        want += list(d.encode()) + [256]
    assert index["eot_id"] == 256 and index["documents"] == len(docs), (index["documents"], len(docs))
    assert ids == want, f"{source}: the shards' ids are not the documents' bytes plus end-of-text"
    print(f"{source}: {len(docs)} documents, {len(ids)} ids, each document's bytes then 256")
PY

# input/corpus-demo.yaml, as the README runs it, for 12 steps.
"$mpiexec" -n 2 "$fsdpp" train "$root/input/corpus-demo.yaml" train.steps=12 train.eval_interval=6 log.interval=3 \
  model.context_length=128 "run.output=$work/run" checkpoint.interval=12 "checkpoint.dir=$work/ck" \
  > "$work/train.log" 2>&1 || { tail -30 "$work/train.log"; fail "training on the corpus"; }
grep -qE "corpus/copyright \(weight 3, 75\.0%\): [0-9]+ tokens" "$work/train.log" || { cat "$work/train.log"; fail "no banner for copyright"; }
grep -q "data: tokens drawn by source over 12288 training tokens" "$work/train.log" || { cat "$work/train.log"; fail "no shares at the end"; }
grep -A2 "over 12288 training tokens" "$work/train.log"
python3 - "$work/run/metrics.jsonl" <<'PY' || fail "the loss did not fall"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
first, last = rows[0]["loss"], rows[-1]["loss"]
print(f"loss: step {rows[0]['step']} {first:.4f}, step {rows[-1]['step']} {last:.4f}")
assert last < first - 0.5, (first, last)
PY

# fsdpp eval --all reads a corpus folder too: every token of it once, under the checkpoint's document masks.
"$fsdpp" eval "$work/ck/step_00000012.h5" corpus/licenses --all > "$work/eval.log" 2>&1 || { cat "$work/eval.log"; fail "eval --all on a corpus"; }
grep -q "eval: all $((237334 - 1)) predicted tokens of corpus/licenses" "$work/eval.log" || { cat "$work/eval.log"; fail "eval --all did not read the whole corpus"; }
grep "^loss" "$work/eval.log"

"$fsdpp" train "$root/input/corpus-demo.yaml" data.eot_id=10 "run.output=$work/wrong" > "$work/wrong.log" 2>&1 &&
  fail "a wrong data.eot_id trained"
grep -q "the corpus ends each document with token 256, but data.eot_id is 10: set data.eot_id: 256" "$work/wrong.log" \
  || { cat "$work/wrong.log"; fail "no message for the wrong data.eot_id"; }
echo "corpus end to end: JSON Lines and .zst shards tokenized on 2 ranks, mixed 3:1 with document masks, trained"
