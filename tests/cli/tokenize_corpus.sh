#!/usr/bin/env bash
# tokenize_corpus.sh FSDPP MPIEXEC WORKDIR: `fsdpp tokenize` in corpus mode (many inputs -> shards + index.json).
#   ids      two .jsonl, a .jsonl.zst and two .txt (one split on blank lines), cut into small units, tokenized with a
#            GPT-2-shaped tokenizer (field "text") and a Llama-3-shaped one with a BOS template (field "meta.body",
#            documents tokenized in chunks of 64 bytes):
#            every id equals Python `tokenizers`' encode(document) + end of text (tokenizer_reference.py corpus)
#   ranks    2 ranks write the same shards, records and index.json as 1 rank (diff -r)
#   resume   a run killed (SIGKILL, FSDPP_TOKENIZE_KILL_AFTER_SHARDS) partway into its third shard, rerun, gives the
#            same folder; so does a rerun where one record lacks empty_documents (an older fsdpp's: redone);
#            another command on the folder is refused with what differs
#   counts   every JSON Lines shard accounts for each line of its byte range: documents + empty_documents + skipped
#            (blank lines are empty documents); so do the 2-rank and resumed folders, identical to it
#   compressed  one JSON Lines file as .gz, two gzip members (`cat a.gz b.gz`), two bzip2 streams, two xz streams,
#            .zst, with a UTF-8 byte-order mark and a BOM'd .gz: every shard is byte-identical to the plain file's;
#            empty strings and blank lines are counted in index.json and the summary
#   bad      invalid UTF-8, a malformed JSON line, a missing field, a non-string field, a truncated .zst and a
#            truncated .gz each stop the run (on 2 ranks too) with file:line (and the compressed byte) and the
#            --on-bad hint; --on-bad skip counts them in the summary and in index.json
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
cp in/a1.jsonl plain.jsonl  # for the compressed inputs below
zstd -q in/c.jsonl -o in/c.jsonl.zst && rm in/c.jsonl
# line_counts CORPUS: each JSON Lines shard's documents + empty_documents + skipped equal the lines of its source's
# byte range (the whole decompressed file for a compressed one, whose cut last line counts), and the index's totals
# are the shards' sums.
line_counts() {
  python3 - "$1" <<'PY'
import bz2, json, lzma, os, subprocess, sys, zlib
folder = sys.argv[1]
index = json.load(open(os.path.join(folder, "index.json")))
def text_of(shard):  # the text and whether the file ends early (streams one after another are one text)
    path = shard["source"]
    data = open(path, "rb").read()
    if path.endswith(".zst"):
        run = subprocess.run(["zstd", "-dc", path], capture_output=True)
        return run.stdout, run.returncode != 0
    for ext, decoder in ((".gz", lambda: zlib.decompressobj(31)), (".bz2", bz2.BZ2Decompressor),
                         (".xz", lzma.LZMADecompressor)):
        if path.endswith(ext):
            text = b""
            while data:
                d = decoder()
                text += d.decompress(data)
                if not d.eof:
                    return text, True
                data = d.unused_data
            return text, False
    return data[shard["byte_begin"]:shard["byte_end"]], False
checked = 0
for shard in index["shards"]:
    if ".json" not in shard["source"]:
        continue
    text, cut = text_of(shard)
    lines = text.count(b"\n") + (1 if cut or (text and not text.endswith(b"\n")) else 0)
    accounted = shard["documents"] + shard["empty_documents"] + sum(shard["skipped"].values())
    assert accounted == lines, (folder, shard["path"], shard["source"], accounted, lines)
    checked += 1
for total in ("documents", "empty_documents"):
    assert index[total] == sum(s[total] for s in index["shards"]), (folder, total)
print(f"{folder}: {checked} JSON Lines shards account for every line; {index['empty_documents']} empty documents")
PY
}

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
line_counts gpt2.1  # and by the diffs below, the 2-rank and the resumed folders count the same

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
# A record an earlier fsdpp wrote (without empty_documents) is redone, not summed in with an unknown count.
python3 -c "import json, sys; r = json.load(open(sys.argv[1])); del r['empty_documents']; json.dump(r, open(sys.argv[1], 'w'))" \
  gpt2.k/shard-00000.json
shards=$(ls gpt2.k/shard-*.bin | wc -l)
run gpt2.k | tail -n 1 | grep -q "($((shards - 1)) from an earlier run)" || fail "a record without empty_documents was reused"
diff -r gpt2.1 gpt2.k || fail "the corpus resumed from an older record differs from an uninterrupted run"
if "$fsdpp" tokenize --tokenizer tok/gpt2.json --field meta.body --split-on '\n\n' --files-from list.txt in/*.txt \
     gpt2.k >other.log 2>&1; then fail "another command on the same folder was accepted"; fi
grep -E "error: .*gpt2.k: was written by another tokenize command: its field \(was \"text\", now \"meta.body\"\), shard_bytes" other.log ||
  fail "unexpected refusal: $(cat other.log)"

# compressed: the same JSON Lines as .gz (one member, and two as `cat a.gz b.gz` makes), .bz2 and .xz (two streams
# each, as pbzip2 writes and `cat` makes), .zst, and with a byte-order mark (plain and .gz): shards identical to the plain
# file's. A file of empty strings and blank lines: counted in index.json and in the summary, not tokenized.
mkdir comp
half=$(( $(wc -l < plain.jsonl) / 2 ))
gzip -c plain.jsonl > comp/one.jsonl.gz
for tool in gzip bzip2 xz; do
  ext=$(case $tool in gzip) echo gz;; bzip2) echo bz2;; xz) echo xz;; esac)
  head -n "$half" plain.jsonl | $tool -c > comp/two.jsonl.$ext
  tail -n +"$((half + 1))" plain.jsonl | $tool -c >> comp/two.jsonl.$ext
done
mv comp/two.jsonl.xz comp/two.json.xz  # Dolma's naming, .json for JSON Lines
zstd -q plain.jsonl -o comp/one.jsonl.zst
{ printf '\xef\xbb\xbf'; cat plain.jsonl; } > comp/bom.jsonl
gzip -c comp/bom.jsonl > comp/bom.jsonl.gz
printf '{"text": "a"}\n\n{"text": ""}\n  \n{"text": "b"}\n{"text": ""}' > empty.jsonl
[ "$(gzip -dc comp/two.jsonl.gz | cmp - plain.jsonl && echo same)" = same ] || fail "two gzip members do not decompress to the input"
inputs=(plain.jsonl comp/one.jsonl.gz comp/two.jsonl.gz comp/two.jsonl.bz2 comp/two.json.xz comp/one.jsonl.zst
        comp/bom.jsonl comp/bom.jsonl.gz empty.jsonl)
"$fsdpp" tokenize --tokenizer tok/gpt2.json "${inputs[@]}" compressed | tail -n 1 | tee compressed.log
for i in $(seq 1 $(( ${#inputs[@]} - 2 ))); do
  cmp compressed/shard-00000.bin "compressed/$(printf 'shard-%05d.bin' "$i")" ||
    fail "${inputs[$i]} gave other tokens than plain.jsonl"
done
line_counts compressed
blank=$(grep -c '^$' plain.jsonl)
python3 - compressed/index.json "$(grep -c . plain.jsonl)" "$blank" "${#inputs[@]}" <<'PY'
import json, sys
index = json.load(open(sys.argv[1]))
objects, blank, n = (int(a) for a in sys.argv[2:])
*same, empty = index["shards"]
assert all((s["documents"], s["empty_documents"]) == (objects, blank) for s in same), [(s["documents"], s["empty_documents"]) for s in same]
assert (empty["documents"], empty["empty_documents"], empty["tokens"]) == (2, 4, 4), empty
assert index["empty_documents"] == (n - 1) * blank + 4, index["empty_documents"]
PY
grep -q "wrote $(( (${#inputs[@]} - 1) * $(grep -c . plain.jsonl) + 2 )) documents, .*; $(( (${#inputs[@]} - 1) * blank + 4 )) empty document(s) left out; skipped 0;" compressed.log ||
  fail "the summary does not count the empty documents: $(cat compressed.log)"
echo "compressed: .gz (1 and 2 members), .bz2 and .xz (2 streams), .zst and a byte-order mark: the plain file's tokens"

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
gzip -c cut.jsonl > cut.jsonl.gz && gz_cut=$(( $(stat -c %s cut.jsonl.gz) * 3 / 4 ))
head -c $gz_cut cut.jsonl.gz > bad/cut.jsonl.gz  # the file ends inside the member
whole_lines_gz=$(python3 -c "import sys, zlib; print(zlib.decompressobj(31).decompress(open(sys.argv[1], 'rb').read()).count(b'\n'))" bad/cut.jsonl.gz)
[ "$whole_lines_gz" -gt 1000 ] || fail "the cut .gz should decode to many whole lines, not $whole_lines_gz"
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
expect_stop "bad/cut.jsonl.zst:$((whole_lines + 1)), compressed byte [0-9]+: the file ends inside a zstd frame \(truncated\) \(truncated_compressed\)" bad/cut.jsonl.zst
expect_stop "bad/cut.jsonl.gz:$((whole_lines_gz + 1)), compressed byte $gz_cut: the file ends inside a gzip member \(truncated\) \(truncated_compressed\)" bad/cut.jsonl.gz
"$mpiexec" -n 2 "$fsdpp" tokenize --tokenizer tok/gpt2.json --split-on '\n\n' --on-bad skip bad/* skipped > skip.log
cat skip.log | grep -E "skipped 6 bad document\(s\): 1 invalid_utf8, 1 malformed_json, 2 missing_field, 2 truncated_compressed" ||
  fail "skip counts: $(cat skip.log)"
line_counts skipped
python3 - skipped/index.json "$whole_lines" "$whole_lines_gz" <<'PY'
import json, sys
index = json.load(open(sys.argv[1]))
want = {"invalid_utf8": 1, "malformed_json": 1, "missing_field": 2, "truncated_compressed": 2}
assert index["skipped"] == want, index["skipped"]
# Good documents: 2 of utf8.txt, 2 + 1 + 3 of the JSON files, and the whole lines before the cut of the .zst, .gz.
assert index["documents"] == 8 + int(sys.argv[2]) + int(sys.argv[3]), (index["documents"], sys.argv[2:])
print("index.json skipped:", index["skipped"], "documents:", index["documents"])
PY

# The byte-level tokenizer has no end of text: --eot-id is required, and the vocabulary grows to hold it.
if "$fsdpp" tokenize in/e.txt bytes >noeot.log 2>&1; then fail "byte-level corpus without --eot-id was accepted"; fi
grep -E "error: byte-level .* has no end-of-text token .*pass --eot-id N" noeot.log
"$fsdpp" tokenize --eot-id 256 in/e.txt bytes | grep -E "wrote 1 documents, [0-9]+ tokens \(vocab 257, eot 256, uint16\)"
echo "tokenize corpus: ids identical to the Python reference, 1 = 2 ranks, resume after kill -9, .gz/.bz2/.xz/BOM as" \
  "plain, every line counted, bad input reported"
