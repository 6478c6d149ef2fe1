#!/usr/bin/env bash
# fsdpp bench calibrate across two nodes (2 nodes x 2 ranks, as tests/bench/run model_accuracy calibrates the
# virtual cluster): the inter-node figures are measured, not copied; the groups {0, 2} and {1, 3} are counted as
# two groups over each node's links at once and the group of all four as one (the per-node fit the model's node
# share expects: docs/performance-model.md); the machine file reads back into `fsdpp plan`.
set -u
root=$1; fsdpp=$2; work=$3
rm -rf "$work"; mkdir -p "$work"
# shellcheck source=tests/cluster/lib.sh
. "$root/tests/cluster/lib.sh"

cluster_up 2
export FSDPP_DEVICE=host
for try in 1 2; do
  srun --mpi=pmix --kill-on-bad-exit=1 --nodes=2 --ntasks-per-node=2 --cpus-per-task=1 --partition=vc \
    "$fsdpp" bench calibrate "$root/input/llama-tiny.yaml" --quick --name vc-2x2 > "$work/machine.yaml" 2> "$work/calibrate.log" \
    && break
  cat "$work/calibrate.log"
  if [ "$try" = 1 ] && crashed_at_launch "$work/calibrate.log" "^calibrate: "; then
    echo "calibrate: a task crashed at launch, before fsdpp printed anything (MPI/PMIx start-up); retrying once"
    continue
  fi
  fail "calibrate on 2 nodes x 2 ranks"
done
grep "collectives on groups" "$work/calibrate.log"
grep -q "groups of 2 (intra-node, consecutive ranks)$" "$work/calibrate.log" || fail "no intra-node groups of 2"
grep -q "groups of 2 (inter-node, strided ranks; 2 group(s) at once over each node's links)$" "$work/calibrate.log" \
  || fail "the strided groups of 2 are not counted as two groups over each node's links"
grep -q "groups of 4 (inter-node, consecutive ranks; 1 group(s) at once over each node's links)$" "$work/calibrate.log" \
  || fail "the group of 4 is not counted as one group over each node's links"
grep -q "NOT MEASURED" "$work/machine.yaml" && fail "a link class was not measured: $(grep -o 'NOT MEASURED[^;]*' "$work/machine.yaml")"
grep -q "^devices_per_node: 2$" "$work/machine.yaml" || fail "devices_per_node is not 2"
"$fsdpp" plan "$root/input/small.yaml" fsdp.strategy=hybrid_shard mesh.dp_replicate=2 mesh.dp_shard=2 \
  train.micro_batch=4 train.global_batch=16 --ranks 4 --machine "$work/machine.yaml" --json > "$work/plan.json" \
  || fail "fsdpp plan does not read the calibrated machine"
python3 - "$work/plan.json" <<'PY' || fail "the plan's time"
import json, sys
t = json.load(open(sys.argv[1]))["time"]
print(f"HSDP 2 x 2 on the calibrated machine: {t['ms_per_step']:.1f} ms a step, dp_replicate {t['comm_ms_by_dim']['dp_replicate']:.1f} ms")
assert t["ms_per_step"] > 0 and t["comm_ms_by_dim"]["dp_replicate"] > 0
PY
echo "calibrate on 2 nodes x 2 ranks: inter-node figures measured; strided groups counted twice per node link"
