#!/usr/bin/env bash
# tests/bench/run llama: the Llama work in one benchmark, then one JSON line with the headline figures.
#   1. input/llama-tiny.yaml training throughput on 1 and 2 ranks (1 BLAS thread each), and MFU against the
#      sgemm peak measured in the same run, with the Llama FLOP count (6 x matmul parameters of the projections
#      and the head + 12 x L x T x C; nn/llama.hpp);
#   2. activation checkpointing on a small.yaml-sized Llama (V 4096, T 256, C 256, L 4, NH 8, NKV 2) on 1 rank:
#      peak memory and time, full and every_2 against none (tests/bench/activation_checkpointing.sh);
#   3. `fsdpp tokenize` against Python `tokenizers` in MB/s on the same tokenizer.json (tests/bench/tokenize.sh).
# Options: --steps N (timed steps per throughput run, default 60), --quick (1 round of 4 steps for 2, 2 MB for 3).
# Run from the repository root with build/ built.
set -euo pipefail
steps=60 ac_steps=6 ac_rounds=2 tok_mb=8
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --quick) ac_steps=4 ac_rounds=1 tok_mb=2; shift ;;
    *) echo "usage: tests/bench/run llama [--steps N] [--quick]" >&2; exit 2 ;;
  esac
done
deck=input/llama-tiny.yaml
declare -A tok mfu peak
for n in 1 2; do
  out=$(mpiexec --oversubscribe -n "$n" build/bin/fsdpp bench train "$deck" --steps "$steps" 2>&1) || { echo "$out"; exit 1; }
  json=$(echo "$out" | grep '^{"bench":"train"' | tail -1)
  [ -n "$json" ] || { echo "$out"; echo "error: no JSON result from fsdpp bench train on $n rank(s)" >&2; exit 1; }
  field() { echo "$json" | grep -o "\"$1\":[0-9.e+-]*" | cut -d: -f2; }
  tok[$n]=$(field tokens_per_s); mfu[$n]=$(field mfu); peak[$n]=$(field sgemm_gflops)
done
params=$(build/bin/fsdpp plan "$deck" --ranks 1 2>/dev/null | grep -o '[0-9]* parameters' | head -1 | cut -d' ' -f1 || true)
printf '%-8s %14s %8s %20s\n' ranks tokens/s MFU "sgemm GFLOP/s/rank"
for n in 1 2; do printf '%-8s %14.0f %8.3f %20.1f\n' "$n" "${tok[$n]}" "${mfu[$n]}" "${peak[$n]}"; done
scaling=$(awk -v a="${tok[1]}" -v b="${tok[2]}" 'BEGIN { printf "%.3f", b / (2 * a) }')
# The deck fixes the global batch, so 2 ranks split the same work: efficiency = tokens/s(2) / (2 x tokens/s(1)).
echo "scaling efficiency 1 -> 2 ranks (same global batch): $scaling; model: $deck, ${params:-?} parameters"
throughput=$(printf '{"deck":"%s","tokens_per_s_1rank":%s,"tokens_per_s_2ranks":%s,"mfu_1rank":%s,"mfu_2ranks":%s,"scaling_1_to_2":%s}' \
  "$deck" "${tok[1]}" "${tok[2]}" "${mfu[1]}" "${mfu[2]}" "$scaling")

echo
echo "== activation checkpointing on a small.yaml-sized Llama, 1 rank"
small_llama=(model.vocab_size=4096 model.context_length=256 model.n_embd=256 model.n_layer=4 model.n_head=8
             model.n_kv_head=2 train.global_batch=8)
ac_out=$(tests/bench/activation_checkpointing.sh --deck "$deck" --ranks 1 --steps "$ac_steps" --rounds "$ac_rounds" \
           "${small_llama[@]}") || { echo "$ac_out"; exit 1; }
echo "$ac_out" | sed '$d'
ac_json=$(echo "$ac_out" | tail -1)

echo
echo "== tokenize: fsdpp against Python tokenizers ($tok_mb MB)"
tok_out=$(tests/bench/tokenize.sh "$tok_mb") || { echo "$tok_out"; exit 1; }
echo "$tok_out" | sed '$d'
tok_json=$(echo "$tok_out" | tail -1)

python3 - "$throughput" "$ac_json" "$tok_json" <<'PY'
import json, sys
t, ac, tok = (json.loads(a) for a in sys.argv[1:4])
r = ac["1rank"]
out = {"bench": "llama", **t,
       "ac_peak_ratio_full_none": r["peak_ratio_full_none"], "ac_time_ratio_full_none": r["time_ratio_full_none"],
       "ac_peak_ratio_every2_none": r["peak_ratio_every2_none"],
       "ac_planned_vs_measured_full": round(r["full"]["planned_peak_mib"] / r["full"]["measured_peak_mib"], 4),
       "tokenize_mb_per_s": tok["tokenize_mb_per_s"], "python_tokenizers_mb_per_s": tok["python_tokenizers_mb_per_s"],
       "tokenize_ids_identical": tok["ids_identical"]}
print(json.dumps(out))
PY
