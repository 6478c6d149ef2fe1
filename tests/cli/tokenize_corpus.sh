#!/usr/bin/env bash
# tokenize_corpus.sh FSDPP MPIEXEC WORKDIR: `fsdpp tokenize` in corpus mode (many inputs -> shards + index.json).
#   ids      two .jsonl, a .jsonl.zst and two .txt (one split on blank lines), cut into small units, tokenized with a
#            GPT-2-shaped tokenizer (field "text") and a Llama-3-shaped one with a BOS template (field "meta.body",
#            documents tokenized in chunks of 64 bytes):
#            every id equals Python `tokenizers`' encode(document) + end of text (tokenizer_reference.py corpus)
#   ranks    2 ranks write the same shards, records and index.json as 1 rank (diff -r)
#   resume   a run killed (SIGKILL, FSDPP_TOKENIZE_KILL_AFTER_SHARDS) partway into its third shard, rerun, gives the
#            same folder; another command on the folder is refused with what differs
#   bad      invalid UTF-8, a malformed JSON line, a missing field, a non-string field and a truncated .zst each stop
#            the run (on 2 ranks too) with file:line and the --on-bad hint; --on-bad skip counts them in the summary
#            and in index.json
# The trained tokenizers need Python `tokenizers` (pip-installed when missing; else exit 77, skipped).
set -euo pipefail
fsdpp=$1 mpiexec=$2 work=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ref=$here/tokenizer_reference.py
rm -rf "$work" && mkdir -p "$work" && cd "$work"
fail() { echo "FAIL: $*"; exit 1; }
if ! python3 -c "import tokenizers, sentencepiece" 2>/dev/null; then
  pip install --break-system-packages -q tokenizers "sentencepiece<0.2" >pip.log 2>&1 || true
  python3 -c "import tokenizers, sentencepiece" 2>/dev/null ||
    { echo "SKIP: needs Python 'tokenizers' and pip could not install it: $(tail -n 1 pip.log)"; exit 77; }
fi
python3 "$ref" build tok "$here/../data/multilingual.txt" >build.log 2>&1 || { cat build.log; exit 1; }
python3 "$ref" corpusfiles "$here/../data/multilingual.txt" in
zstd -q in/c.jsonl -o in/c.jsonl.zst && rm in/c.jsonl

# ids: equal to Python's, document by document (inputs named, then those of the --files-from list; globs sorted).
printf '%s\n' in/a1.jsonl in/a2.jsonl in/c.jsonl.zst > list.txt
run() { "$fsdpp" tokenize --tokenizer tok/gpt2.json --shard-bytes 8000 --split-on '\n\n' --files-from list.txt \
          in/*.txt "$@"; }
run gpt2.1 | tail -n 1
python3 "$ref" corpus tok/gpt2.json gpt2.1 text '\n\n' in/d.txt in/e.txt in/a1.jsonl in/a2.jsonl in/c.jsonl.zst
[ "$(ls gpt2.1/shard-*.bin | wc -l)" -ge 8 ] || fail "expected the .jsonl inputs cut into several shards"
"$fsdpp" tokenize --tokenizer tok/llama3_bos.json --field meta.body --shard-bytes 8000 --chunk-bytes 64 --split-on '\n\n' \
  'in/*.jsonl*' in/d.txt in/e.txt llama3 | tail -n 1
python3 "$ref" corpus tok/llama3_bos.json llama3 meta.body '\n\n' in/a1.jsonl in/a2.jsonl in/c.jsonl.zst in/d.txt in/e.txt
grep -q '"bos_id": 128004' llama3/index.json || fail "llama3 index has no bos_id 128004"

# ranks: 2 ranks write what 1 rank writes.
run gpt2.2 --progress-seconds 0.000001 >np1-progress.log
grep -qE "^tokenize: [0-9.]+ of [0-9.]+ MB of input \([0-9]+%\), [0-9.]+ MB/s of text, ETA [0-9]+ s" np1-progress.log ||
  fail "no progress line: $(cat np1-progress.log)"
rm -rf gpt2.2
"$mpiexec" -n 2 "$fsdpp" tokenize --tokenizer tok/gpt2.json --shard-bytes 8000 --split-on '\n\n' \
  --files-from list.txt in/*.txt gpt2.2 | tail -n 1
diff -r gpt2.1 gpt2.2 || fail "2 ranks wrote another corpus than 1 rank"
echo "ranks: 1 and 2 ranks wrote identical shards and index.json"

# resume: killed partway into the third shard, then the same command finishes it identically.
set +e
FSDPP_TOKENIZE_KILL_AFTER_SHARDS=2 run gpt2.k >killed.log 2>&1
status=$?
set -e
[ $status -ne 0 ] || fail "the test hook did not kill the run"
[ -f gpt2.k/shard-00001.json ] && [ ! -f gpt2.k/shard-00002.json ] && [ -f gpt2.k/shard-00002.bin.tmp ] ||
  fail "expected 2 complete shards and a partial third: $(ls gpt2.k)"
[ ! -f gpt2.k/index.json ] || fail "a killed run left an index.json"
run gpt2.k | tail -n 1 | tee resumed.log
grep -q "(2 from an earlier run)" resumed.log || fail "the rerun did not reuse the 2 complete shards"
diff -r gpt2.1 gpt2.k || fail "the resumed corpus differs from an uninterrupted run"
if "$fsdpp" tokenize --tokenizer tok/gpt2.json --field meta.body --split-on '\n\n' --files-from list.txt in/*.txt \
     gpt2.k >other.log 2>&1; then fail "another command on the same folder was accepted"; fi
grep -E "error: .*gpt2.k: was written by another tokenize command: its field \(was \"text\", now \"meta.body\"\), shard_bytes" other.log ||
  fail "unexpected refusal: $(cat other.log)"

# bad input: each stops the run with file:line and the hint; --on-bad skip counts them.
mkdir bad
printf 'good one\n\nnot \xff UTF-8\n\nfine\n' > bad/utf8.txt
printf '{"text": "a"}\n{"text": "b"}\n{"text": oops}\n' > bad/json.jsonl
printf '{"text": "a"}\n{"body": "b"}\n' > bad/missing.jsonl
printf '{"text": "a"}\n{"text": "b"}\n{"text": "c"}\n{"text": 42}\n' > bad/number.jsonl
python3 -c "
import json, random
r = random.Random(7)
for i in range(6000): print(json.dumps({'text': ' '.join('%x' % r.getrandbits(40) for _ in range(8))}))" > cut.jsonl
zstd -q cut.jsonl -o cut.jsonl.zst && head -c $(( $(stat -c %s cut.jsonl.zst) * 3 / 4 )) cut.jsonl.zst > bad/cut.jsonl.zst
whole_lines=$( (zstd -dc bad/cut.jsonl.zst 2>/dev/null || true) | wc -l)
[ "$whole_lines" -gt 1000 ] || fail "the cut .zst should decode to many whole lines, not $whole_lines"
expect_stop() {  # expect_stop PATTERN INPUT [MPI...]
  local pattern=$1 input=$2 out
  shift 2
  rm -rf badout
  if out=$("$@" "$fsdpp" tokenize --tokenizer tok/gpt2.json --split-on '\n\n' "$input" badout 2>&1); then
    fail "$input was accepted"
  fi
  echo "$out" | grep -E "error: .*$pattern.*use --on-bad skip|error: .*$pattern.*pass --on-bad skip" | head -n 1 ||
    fail "$input: no error matching '$pattern': $out"
}
expect_stop "bad/utf8.txt:3: the text is not UTF-8 \(byte [0-9]+ of the file\) \(invalid_utf8\)" bad/utf8.txt
expect_stop "bad/json.jsonl:3: the line is not JSON: .*\(malformed_json\)" bad/json.jsonl "$mpiexec" -n 2
expect_stop "bad/missing.jsonl:2: the object has no field \"text\" .*\(missing_field\)" bad/missing.jsonl
expect_stop "bad/number.jsonl:4: the field \"text\" is not a string \(missing_field\)" bad/number.jsonl
expect_stop "bad/cut.jsonl.zst:$((whole_lines + 1)), compressed byte [0-9]+: the file ends inside a zstd frame \(truncated\) \(truncated_zstd\)" bad/cut.jsonl.zst
"$mpiexec" -n 2 "$fsdpp" tokenize --tokenizer tok/gpt2.json --split-on '\n\n' --on-bad skip bad/* skipped > skip.log
cat skip.log | grep -E "skipped 5 bad document\(s\): 1 invalid_utf8, 1 malformed_json, 2 missing_field, 1 truncated_zstd" ||
  fail "skip counts: $(cat skip.log)"
python3 - skipped/index.json "$whole_lines" <<'PY'
import json, sys
index = json.load(open(sys.argv[1]))
want = {"invalid_utf8": 1, "malformed_json": 1, "missing_field": 2, "truncated_zstd": 1}
assert index["skipped"] == want, index["skipped"]
# Good documents: 2 of utf8.txt, 2 + 1 + 3 of the JSON files, and the whole lines before the cut of the .zst.
assert index["documents"] == 8 + int(sys.argv[2]), (index["documents"], sys.argv[2])
print("index.json skipped:", index["skipped"], "documents:", index["documents"])
PY

# The byte-level tokenizer has no end of text: --eot-id is required, and the vocabulary grows to hold it.
if "$fsdpp" tokenize in/e.txt bytes >noeot.log 2>&1; then fail "byte-level corpus without --eot-id was accepted"; fi
grep -E "error: byte-level .* has no end-of-text token .*pass --eot-id N" noeot.log
"$fsdpp" tokenize --eot-id 256 in/e.txt bytes | grep -E "wrote 1 documents, [0-9]+ tokens \(vocab 257, eot 256, uint16\)"
echo "tokenize corpus: ids identical to the Python reference, 1 = 2 ranks, resume after kill -9, bad input reported"
