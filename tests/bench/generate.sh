#!/usr/bin/env bash
# tests/bench/run generate [deck]: fsdpp generate against transformers' generate on the same CPU, the same
# weights and one thread each (OPENBLAS_NUM_THREADS=1, torch.set_num_threads(1)): a GPT-2-shaped deck
# (input/small.yaml by default; input/gpt2-124m.yaml for GPT-2 small's shapes) with random weights from fsdpp init,
# exported with ckpt export --hf; greedy, prompts of 64 tokens, 128 new tokens, batch 1 and 8. Prefill and decode
# tokens/s, the median of 3 runs each. The reference is tests/reference/ensure-transformers' (skipped when absent).
set -euo pipefail
deck=${1:-small}
fsdpp=build/bin/fsdpp
work=build/bench-generate/$deck
prompt=64 new=128 runs=3
mkdir -p "$work"
rm -rf "$work/hf"
"$fsdpp" init "input/$deck.yaml" --out "$work/seed.h5" >/dev/null
"$fsdpp" ckpt export "$work/seed.h5" "$work/hf" --hf --deck "input/$deck.yaml" >/dev/null
vocab=$(sed -n 's/^  "vocab_size": \([0-9]*\),/\1/p' "$work/hf/config.json")
py=$(tests/reference/ensure-transformers 2>/dev/null) || py=""

# ids SEED: a prompt of $prompt token ids
ids() { awk -v seed="$1" -v n="$prompt" -v v="$vocab" 'BEGIN { srand(seed); for (i = 0; i < n; ++i) printf "%s%d", i ? "," : "", int(rand() * v) }'; }
median() { sort -g | awk 'NF { v[++n] = $1 } END { print v[int((n + 1) / 2)] }'; }
fsdpp_rates() {  # BATCH -> "prefill decode" tokens/s, median of $runs
  local args=() out prefill="" decode=""
  for ((b = 1; b <= $1; ++b)); do args+=(--prompt-ids "$(ids "$b")"); done
  for ((r = 0; r < runs; ++r)); do
    out=$("$fsdpp" generate "$work/hf" "${args[@]}" --max-new-tokens "$new" --ignore-eos | grep "^prefill")
    prefill+="$(sed -E 's/.*prefill [0-9]+ tokens in [0-9.]+ s \(([0-9.]+) tokens\/s\).*/\1/' <<<"$out")"$'\n'
    decode+="$(sed -E 's/.*decode [0-9]+ tokens in [0-9.]+ s \(([0-9.]+) tokens\/s\).*/\1/' <<<"$out")"$'\n'
  done
  echo "$(median <<<"$prefill") $(median <<<"$decode")"
}
transformers_rates() {  # BATCH -> "prefill decode" tokens/s, median of $runs; "null null" without the reference
  [ -n "$py" ] || { echo "null null"; return; }
  local prefill="" decode="" line
  for ((r = 0; r < runs; ++r)); do
    line=$("$py" tests/reference/hf_reference.py bench "$work/hf" "$prompt" "$new" "$1")
    prefill+="$(sed -E 's/.*"prefill_tok_s": ([0-9.e+]+).*/\1/' <<<"$line")"$'\n'
    decode+="$(sed -E 's/.*"decode_tok_s": ([0-9.e+]+).*/\1/' <<<"$line")"$'\n'
  done
  echo "$(median <<<"$prefill") $(median <<<"$decode")"
}
ratio() { if [ "$2" = null ]; then echo null; else awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; fi; }

read -r f1p f1d <<<"$(fsdpp_rates 1)"
read -r f8p f8d <<<"$(fsdpp_rates 8)"
read -r t1p t1d <<<"$(transformers_rates 1)"
read -r t8p t8d <<<"$(transformers_rates 8)"
r1=$(ratio "$f1d" "$t1d") r8=$(ratio "$f8d" "$t8d")
echo "generate: input/$deck.yaml ($("$fsdpp" train "input/$deck.yaml" --dry-run | sed -n 's/^dry run: \([0-9]*\) parameters.*/\1/p') parameters, random weights), prompts of $prompt tokens, $new new tokens, greedy, 1 thread"
[ -n "$py" ] || echo "(no transformers reference: tests/reference/ensure-transformers could not install it)"
printf '%-6s %-14s %14s %14s %14s\n' batch who prefill_tok/s decode_tok/s decode_ratio
printf '%-6s %-14s %14.1f %14.1f %14s\n' 1 fsdpp "$f1p" "$f1d" "$r1"
[ -z "$py" ] || printf '%-6s %-14s %14.1f %14.1f\n' 1 transformers "$t1p" "$t1d"
printf '%-6s %-14s %14.1f %14.1f %14s\n' 8 fsdpp "$f8p" "$f8d" "$r8"
[ -z "$py" ] || printf '%-6s %-14s %14.1f %14.1f\n' 8 transformers "$t8p" "$t8d"
printf '{"bench":"generate","deck":"%s","prompt":%d,"new":%d,"prefill_tok_s":%.1f,"decode_tok_s":%.1f,"transformers_prefill_tok_s":%s,"transformers_decode_tok_s":%s,"ratio":%s,"batch8_decode_tok_s":%.1f,"batch8_transformers_decode_tok_s":%s,"batch8_ratio":%s}\n' \
  "$deck" "$prompt" "$new" "$f1p" "$f1d" "$t1p" "$t1d" "$r1" "$f8d" "$t8d" "$r8"
