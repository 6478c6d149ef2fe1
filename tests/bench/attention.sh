#!/usr/bin/env bash
# model.attention: what each attention path costs in a real training step. Trains a deck (default
# input/small.yaml: B 8, T 256, C 256, NH 4) with model.attention reference, batched and fused, and prints per
# path the measured peak (fsdpp's Views), the planned peak (fsdpp plan), the median ms/step over the steps after
# the first, and the ratios against reference; then one JSON line.
# Document masks (data.document_mask): the fused path also trains at T $MASK_T (default 1024) on a token stream
# whose token 0 ends a document every ~200 tokens (lengths uniform in 100..300), masks off and on; the table's
# last lines and the JSON's document_mask_over_off give the ratio of their median ms/step (the key tiles before a
# query tile's document are skipped, so on should not be slower).
#   tests/bench/attention.sh [--fsdpp build/bin/fsdpp] [--deck input/small.yaml] [--steps 5] [--rounds 2]
#                            [--ranks 1] [overrides...]
# The paths run in turn, --rounds times, so that machine noise falls on all of them alike. On a CPU build the
# fused kernel is scalar tile code (it is meant for GPUs) and reference is the default.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
fsdpp=build/bin/fsdpp deck=input/small.yaml steps=5 rounds=2 ranks=1
# shellcheck source=tests/bench/options.sh
source tests/bench/options.sh "$@"
results="$work/results.txt"
for round in $(seq "$rounds"); do
  for path in reference batched fused; do
    args=("${overrides[@]}" "model.attention=$path")
    planned=$("$fsdpp" plan "$deck" "${args[@]}" --ranks "$ranks" --json | grep -o '"total":[0-9]*' | head -1 | cut -d: -f2)
    out="$work/run-$path-$round"
    mpiexec -n "$ranks" "$fsdpp" train "$deck" "${args[@]}" "train.steps=$steps" train.eval_interval=0 \
      schedule.warmup_steps=1 log.interval=1 checkpoint.interval=0 "run.output=$out" >"$out.log" 2>&1 ||
      { tail -20 "$out.log" >&2; echo "error: training with model.attention=$path failed" >&2; exit 1; }
    measured=$(grep -E "^[A-Za-z]+ allocations +\|" "$out.log" | awk -F'|' '{gsub(/ /, "", $4); print $4}')
    ms=$(python3 -c 'import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(",".join(str(r["ms_per_step"]) for r in rows[1:]))' "$out/metrics.jsonl")
    echo "$path $measured $planned $ms" >>"$results"
  done
done
# The document-mask pair: one stream for both, tokens 1..255 (any vocabulary of 256 or more) and 0 as end-of-text.
mask_T=${MASK_T:-1024}
python3 -c 'import random, struct, sys
rng = random.Random(7)
out = []
while len(out) < 2000000:
    out += [rng.randrange(1, 256) for _ in range(rng.randrange(100, 301) - 1)] + [0]
open(sys.argv[1], "wb").write(struct.pack("<%dH" % len(out), *out))' "$work/documents.bin"
for round in $(seq "$rounds"); do
  for masks in false true; do
    out="$work/run-masks-$masks-$round"
    mpiexec -n "$ranks" "$fsdpp" train "$deck" "${overrides[@]}" model.attention=fused "model.context_length=$mask_T" \
      "data.source=$work/documents.bin" data.format=uint16 "data.document_mask=$masks" data.eot_id=0 \
      "train.steps=$steps" train.eval_interval=0 schedule.warmup_steps=1 log.interval=1 checkpoint.interval=0 \
      "run.output=$out" >"$out.log" 2>&1 ||
      { tail -20 "$out.log" >&2; echo "error: training with data.document_mask=$masks failed" >&2; exit 1; }
    python3 -c 'import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(sys.argv[2], ",".join(str(r["ms_per_step"]) for r in rows[1:]))' "$out/metrics.jsonl" "$masks" >>"$work/masks.txt"
  done
done
python3 - "$results" "$deck" "$ranks" "$work/masks.txt" "$mask_T" <<'PY'
import json, statistics, sys
runs = {}
for r in (l.split() for l in open(sys.argv[1])):
    runs.setdefault(r[0], []).append((float(r[1]), float(r[2]) / 1048576, [float(x) for x in r[3].split(",")]))
by = {k: (max(v[0] for v in vs), max(v[1] for v in vs), statistics.median([t for v in vs for t in v[2]]))
      for k, vs in runs.items()}
ref = by["reference"]
print("%-10s %14s %14s %9s %12s %12s %12s" % ("attention", "measured_MiB", "planned_MiB", "error", "ms_per_step",
                                               "peak/ref", "time/ref"))
out = {"bench": "attention", "deck": sys.argv[2], "ranks": int(sys.argv[3])}
for k in ("reference", "batched", "fused"):
    meas, plan, ms = by[k]
    print("%-10s %14.1f %14.1f %8.2f%% %12.1f %12.3f %12.3f" % (k, meas, plan, 100 * (plan - meas) / meas, ms,
                                                              meas / ref[0], ms / ref[2]))
    out[k] = {"measured_peak_mib": round(meas, 1), "planned_peak_mib": round(plan, 1), "ms_per_step": round(ms, 1),
              "peak_ratio": round(meas / ref[0], 3), "time_ratio": round(ms / ref[2], 3)}
masks = {}
for r in (l.split() for l in open(sys.argv[4])):
    masks.setdefault(r[0], []).extend(float(x) for x in r[1].split(","))
off, on = statistics.median(masks["false"]), statistics.median(masks["true"])
print("fused, T %s, a document every ~200 tokens: ms_per_step masks off %.1f, on %.1f, on/off %.3f" %
      (sys.argv[5], off, on, on / off))
out["document_mask"] = {"T": int(sys.argv[5]), "off_ms_per_step": round(off, 1), "on_ms_per_step": round(on, 1)}
out["document_mask_over_off"] = round(on / off, 3)
print(json.dumps(out))
PY
