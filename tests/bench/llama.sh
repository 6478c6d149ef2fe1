#!/usr/bin/env bash
# tests/bench/run llama: input/llama-tiny.yaml training throughput on 1 and 2 ranks (1 BLAS thread each), and
# MFU against the sgemm peak measured in the same run, with the Llama FLOP count (6 x matmul parameters of the
# projections and the head + 12 x L x T x C; nn/llama.hpp). A table, then one JSON line.
# Options: --steps N (timed steps per run, default 60). Run from the repository root with build/ built.
set -euo pipefail
steps=60
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    *) echo "usage: tests/bench/run llama [--steps N]" >&2; exit 2 ;;
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
printf '{"bench":"llama","deck":"%s","tokens_per_s_1rank":%s,"tokens_per_s_2ranks":%s,"mfu_1rank":%s,"mfu_2ranks":%s,"scaling_1_to_2":%s}\n' \
  "$deck" "${tok[1]}" "${tok[2]}" "${mfu[1]}" "${mfu[2]}" "$scaling"
