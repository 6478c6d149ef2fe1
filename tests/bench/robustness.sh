#!/usr/bin/env bash
# tests/bench/run robustness: the fault scenarios of issue 12 ("lose nothing"), each run through the test
# that reproduces it, then the fuzzers' and sanitizers' last results. A table, then one JSON line:
#   fuzz_execs_total, fuzz_crashes_open, fault_scenarios_passed, fault_scenarios_total
# Run from the repository root after a build (tests/bench/run builds first).
set -uo pipefail
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1 FSDPP_ALLOW_GPU_SHARING=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# what | how: "ctest NAME", or "doctest EXECUTABLE RANKS PATTERN" (doctest splits patterns at commas: none there)
scenarios=(
  "damaged latest: missing, empty, garbage, binary (auto and true)|ctest cli_ckpt_resume_scan"
  "damaged latest, 2 ranks, newest valid checkpoint used|doctest fsdpp_mpi_tests 2 resume: a missing*"
  "keep_last never deletes the newest valid checkpoint|doctest fsdpp_mpi_tests 2 keep_last never deletes*"
  "latest replaced atomically (temp + fsync + rename)|doctest fsdpp_mpi_tests 1 latest is replaced atomically*"
  "full disk on a small tmpfs: abort, continue, resume|ctest cli_ckpt_full_disk"
  "injected failure at stage, write, close, rename, latest|ctest cli_ckpt_save_faults"
  "injected failure at each point, on every rank|doctest fsdpp_mpi_tests 2 save faults: a failure at each point*"
  "kill -9 of one rank mid-save|ctest cli_ckpt_crash_during_save"
  "divergence (lr 1e30): abort and skip, no NaN checkpoint|ctest cli_nonfinite_np2"
  "edited offset, rows, shard count: clear error on every rank|doctest fsdpp_mpi_tests 2 ckpt layout: edited offsets*"
  "non-finite weights refused on load, reported by verify|doctest fsdpp_mpi_tests 2 ckpt layout: non-finite weights*"
  "two runs sharing checkpoint.dir|doctest fsdpp_mpi_tests 2 one writer per checkpoint folder*"
  "unreadable init_from on 3 ranks: exit 2 in seconds|ctest cli_bad_init_from_np3"
  "model too large: the planner's verdict, not bad_alloc (train)|ctest cli_train_does_not_fit_np2"
  "model too large: the planner's verdict, not bad_alloc (init)|ctest cli_init_does_not_fit_np2"
  "safetensors: duplicate header keys|doctest fsdpp_unit_tests 1 safetensors: rejects duplicate keys*"
  "safetensors: NaN/inf refused by import and init_from|doctest fsdpp_unit_tests 1 *non-finite*"
  "SIGTERM/SIGINT to the launcher: save, exit 85; one rank's signal named|ctest cli_preempt_signals_np2"
  "preemption: save, requeue, resume bitwise|ctest cli_preemption_np2"
  "mismatch message names no missing deck key|doctest fsdpp_mpi_tests 2 ckpt layout: a model mismatch suggests*"
  "a rank stalls in a collective: watchdog reports and aborts|ctest cli_watchdog_np2"
)
passed=0 total=0
printf '%-72s %-6s %8s\n' scenario result seconds
for entry in "${scenarios[@]}"; do
  what=${entry%%|*}
  read -r kind rest <<<"${entry#*|}"
  start=$(date +%s.%N)
  if [ "$kind" = ctest ]; then
    ctest --test-dir build -R "^${rest}\$" --timeout 600 > "$work/log" 2>&1 && grep -q "100% tests passed" "$work/log"
  else
    read -r exe np pattern <<<"$rest"
    mpiexec -n "$np" "build/bin/$exe" "-tc=$pattern" > "$work/log" 2>&1 && grep -qE "test cases: +[1-9][0-9]* \| +[1-9]" "$work/log"
  fi
  ok=$?
  seconds=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  total=$((total + 1))
  if [ $ok = 0 ]; then passed=$((passed + 1)); result=pass; else result=FAIL; fi
  printf '%-72s %-6s %8s\n' "$what" "$result" "$seconds"
done

# Fuzzing and sanitizers: the last results CI wrote (share/scripts/ci-extras), if any.
execs=0 open=0
summary=build-fuzz/fuzz-summary.json
if [ -f "$summary" ]; then
  echo
  python3 - "$summary" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
targets = s.get("targets", {})
print(f"{'fuzz target':<24} {'executions':>12} {'crashes':>8} {'seconds':>8}")
for name, v in sorted(targets.items()):
    print(f"{name:<24} {v.get('execs', 0):>12} {v.get('crashes', 0):>8} {v.get('seconds', 0):>8}")
san = s.get("sanitizer")
if san:
    print(f"sanitizers (address,undefined) over {san.get('tests')}: {san.get('result')} ({san.get('seconds')} s)")
PY
  execs=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("fuzz_execs_total", 0))' "$summary")
  open=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("fuzz_crashes_open", 0))' "$summary")
else
  echo; echo "fuzzing: no $summary yet (share/scripts/ci-extras writes it; run 'share/scripts/quickstart test')"
fi
echo "{\"bench\":\"robustness\",\"fuzz_execs_total\":$execs,\"fuzz_crashes_open\":$open,\"fault_scenarios_passed\":$passed,\"fault_scenarios_total\":$total}"
