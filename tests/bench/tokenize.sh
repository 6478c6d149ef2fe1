#!/usr/bin/env bash
# tests/bench/tokenize.sh [MB]: `fsdpp tokenize` throughput against the Python `tokenizers` package on the same
# tokenizer.json and the same text: MB (default 8) of text generated deterministically from the committed
# tests/data/multilingual.txt, and tokenizers trained on it (GPT-2 and Llama 3 shapes; tests/cli/tokenizer_reference.py).
# Python runs encode_batch with its default thread pool and with RAYON_NUM_THREADS=1, and encode on the whole
# text (whose ids must equal fsdpp's). Corpus mode: the same text as documents (its paragraphs) in 4 zstd-compressed
# JSON Lines files, tokenized by `fsdpp tokenize` into a corpus folder on 1 and 2 ranks (MB/s of document text,
# after decompression and JSON decoding) against encode_batch on the same documents, with the ids checked against
# Python's per document. Prints a table, then one JSON line.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
mb=${1:-8}
work=build/bench-tokenize
ref=tests/cli/tokenizer_reference.py
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMPI_MCA_rmaps_base_oversubscribe=1
if ! python3 -c "import tokenizers, sentencepiece" 2>/dev/null; then
  pip install --break-system-packages -q tokenizers "sentencepiece<0.2" >/dev/null 2>&1 ||
    { echo "error: the benchmark needs Python 'tokenizers' and 'sentencepiece' and pip could not install them" >&2; exit 1; }
fi
mkdir -p "$work"
python3 "$ref" build "$work/tok" tests/data/multilingual.txt >"$work/build.log" 2>&1
python3 "$ref" bigtext tests/data/multilingual.txt "$mb" "$work/text.txt"

fsdpp_mbps() {  # the MB/s of fsdpp's last log line
  sed -n 's/.* s (\([0-9.]*\) MB\/s on .*/\1/p' "$1" | tail -n 1
}
json_field() { python3 -c "import json,sys; print(round(json.loads(open(sys.argv[1]).read())[sys.argv[2]], 2))" "$1" "$2"; }

declare -A r
for shape in gpt2 llama3; do
  tok=$work/tok/$shape.json
  build/bin/fsdpp tokenize --tokenizer "$tok" "$work/text.txt" "$work/$shape.bin" >"$work/$shape.fsdpp1.log"
  mpiexec -n 2 build/bin/fsdpp tokenize --tokenizer "$tok" "$work/text.txt" "$work/$shape.np2.bin" >"$work/$shape.fsdpp2.log"
  cmp -s "$work/$shape.bin" "$work/$shape.np2.bin" || { echo "error: $shape: 2 ranks wrote another file" >&2; exit 1; }
  python3 "$ref" bench "$tok" "$work/text.txt" "$work/$shape.bin" >"$work/$shape.py.json"
  RAYON_NUM_THREADS=1 python3 "$ref" bench "$tok" "$work/text.txt" >"$work/$shape.py1.json"
  r[$shape.f1]=$(fsdpp_mbps "$work/$shape.fsdpp1.log")
  r[$shape.f2]=$(fsdpp_mbps "$work/$shape.fsdpp2.log")
  r[$shape.batch]=$(json_field "$work/$shape.py.json" batch_mb_per_s)
  r[$shape.batch1]=$(json_field "$work/$shape.py1.json" batch_mb_per_s)
  r[$shape.encode]=$(json_field "$work/$shape.py.json" encode_mb_per_s)
  r[$shape.same]=$(python3 -c "import json,sys; print(str(json.load(open(sys.argv[1]))['fsdpp_ids_identical']).lower())" "$work/$shape.py.json")
done
# Corpus mode: JSON Lines + zstd (GPT-2 shape).
rm -rf "$work/jsonl" "$work/corpus1" "$work/corpus2"
python3 "$ref" jsonlfiles "$work/text.txt" 4 "$work/jsonl"
for f in "$work"/jsonl/*.jsonl; do zstd -q -f "$f" -o "$f.zst"; done
tok=$work/tok/gpt2.json
build/bin/fsdpp tokenize --tokenizer "$tok" "$work"/jsonl/'*.jsonl.zst' "$work/corpus1" >"$work/corpus.fsdpp1.log"
mpiexec -n 2 build/bin/fsdpp tokenize --tokenizer "$tok" "$work"/jsonl/'*.jsonl.zst' "$work/corpus2" >"$work/corpus.fsdpp2.log"
diff -r "$work/corpus1" "$work/corpus2" >/dev/null || { echo "error: corpus: 2 ranks wrote another corpus" >&2; exit 1; }
python3 "$ref" corpus "$tok" "$work/corpus1" text "" "$work"/jsonl/*.jsonl.zst >"$work/corpus.check.log" &&
  r[jsonl.same]=true || r[jsonl.same]=false
python3 "$ref" benchdocs "$tok" "$work"/jsonl/*.jsonl >"$work/corpus.py.json"
r[jsonl.f1]=$(fsdpp_mbps "$work/corpus.fsdpp1.log")
r[jsonl.f2]=$(fsdpp_mbps "$work/corpus.fsdpp2.log")
r[jsonl.batch]=$(json_field "$work/corpus.py.json" batch_mb_per_s)

bytes=$(stat -c %s "$work/text.txt")
threads=$(nproc)
printf 'tokenize throughput, MB/s, on %.1f MB of generated multilingual text (%s cores here)\n' "$(echo "$bytes / 1000000" | bc -l)" "$threads"
printf '%-52s %10s %10s\n' "" "GPT-2" "Llama 3"
printf '%-52s %10s %10s\n' "fsdpp tokenize, 1 rank" "${r[gpt2.f1]}" "${r[llama3.f1]}"
printf '%-52s %10s %10s\n' "fsdpp tokenize, 2 ranks (same file)" "${r[gpt2.f2]}" "${r[llama3.f2]}"
printf '%-52s %10s %10s\n' "python tokenizers encode_batch (default threads)" "${r[gpt2.batch]}" "${r[llama3.batch]}"
printf '%-52s %10s %10s\n' "python tokenizers encode_batch (RAYON_NUM_THREADS=1)" "${r[gpt2.batch1]}" "${r[llama3.batch1]}"
printf '%-52s %10s %10s\n' "python tokenizers encode, whole text" "${r[gpt2.encode]}" "${r[llama3.encode]}"
printf '%-52s %10s %10s\n' "fsdpp ids identical to python's" "${r[gpt2.same]}" "${r[llama3.same]}"
printf '%-52s %10s\n' "corpus: 4 x .jsonl.zst, fsdpp tokenize, 1 rank" "${r[jsonl.f1]}"
printf '%-52s %10s\n' "corpus: 4 x .jsonl.zst, fsdpp tokenize, 2 ranks" "${r[jsonl.f2]}"
printf '%-52s %10s\n' "corpus: python encode_batch on the documents" "${r[jsonl.batch]}"
printf '%-52s %10s\n' "corpus: ids identical to python's (+ end of text)" "${r[jsonl.same]}"
printf '{"bench":"tokenize","bytes":%s,"tokenize_mb_per_s":%s,"tokenize_2rank_mb_per_s":%s,"python_tokenizers_mb_per_s":%s,"python_tokenizers_1thread_mb_per_s":%s,"python_tokenizers_encode_mb_per_s":%s,"llama3_tokenize_mb_per_s":%s,"llama3_python_tokenizers_mb_per_s":%s,"llama3_python_tokenizers_1thread_mb_per_s":%s,"jsonl_zst_mb_per_s":%s,"jsonl_zst_2rank_mb_per_s":%s,"jsonl_python_encode_batch_mb_per_s":%s,"ids_identical":%s}\n' \
  "$bytes" "${r[gpt2.f1]}" "${r[gpt2.f2]}" "${r[gpt2.batch]}" "${r[gpt2.batch1]}" "${r[gpt2.encode]}" \
  "${r[llama3.f1]}" "${r[llama3.batch]}" "${r[llama3.batch1]}" "${r[jsonl.f1]}" "${r[jsonl.f2]}" "${r[jsonl.batch]}" \
  "$([ "${r[gpt2.same]}" = true ] && [ "${r[llama3.same]}" = true ] && [ "${r[jsonl.same]}" = true ] && echo true || echo false)"
