#!/usr/bin/env bash
# A GPU build of fsdpp on a machine without a GPU or NVIDIA driver (a login node, the build machines):
#   - the commands that need no device run: --version, --help, plan, train --dry-run, mesh --dry-run,
#     tokenize, report, and ckpt inspect|verify|consolidate|export|import of a checkpoint written by the host
#     (CPU) build;
#   - train and init stop with one clear message (the GPU that was expected, what the CUDA runtime said) and
#     exit code 2, on 1 and 2 ranks: no stack trace, no SIGABRT.
#   tests/gpu/no_driver.sh CUDA_BIN_DIR HOST_BIN_DIR [WORK_DIR]
# Exit 0: all held; 1: something did not; 77: a GPU is visible here, so this is not a no-driver machine.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cuda=${1:?usage: $0 CUDA_BIN_DIR HOST_BIN_DIR [WORK_DIR]}
host=${2:?usage: $0 CUDA_BIN_DIR HOST_BIN_DIR [WORK_DIR]}
work=${3:-$(mktemp -d)}
mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1
fsdpp=$cuda/fsdpp
failures=0

if [ -x "$cuda/fsdpp_gpu_info" ] && "$cuda/fsdpp_gpu_info" >/dev/null 2>&1; then
  echo "no_driver: SKIPPED: a GPU is visible here ($("$cuda/fsdpp_gpu_info" | head -c 120)); this test is for machines without one"
  exit 77
fi
# Captured first: with pipefail, grep -q closing the pipe at its first match would fail fsdpp's next write.
version=$("$fsdpp" --version 2>&1)
grep -q "Kokkos .*Cuda" <<<"$version" ||
  { echo "no_driver: error: $fsdpp is not a CUDA build (its --version names no Cuda backend)" >&2; exit 1; }

# check NAME EXPECTED_EXIT COMMAND... [-- PATTERN...]: runs the command, checks its exit code, that every
# PATTERN (extended regex) is in its output, and that the output has no trace of a crash.
check() {
  local name=$1 expected=$2
  shift 2
  local cmd=() patterns=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do cmd+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  patterns=("$@")
  local log="$work/$name.log"
  timeout 120 "${cmd[@]}" >"$log" 2>&1
  local rc=$? ok=1
  [ "$rc" = "$expected" ] || { echo "  exit code $rc, expected $expected"; ok=0; }
  for p in "${patterns[@]}"; do
    grep -Eq -- "$p" "$log" || { echo "  missing from the output: $p"; ok=0; }
  done
  if grep -Eq "terminate called|Aborted|SIGABRT|Signal: 6|core dumped|cudaErrorStubLibrary.*Kokkos::Impl|Kokkos::abort" "$log"; then
    echo "  the output shows a crash"
    ok=0
  fi
  if [ $ok = 1 ]; then
    echo "no_driver: ok    $name"
  else
    echo "no_driver: FAIL  $name: ${cmd[*]}"
    sed 's/^/    | /' "$log" | head -30
    failures=$((failures + 1))
  fi
}

check version 0 "$fsdpp" --version -- "Kokkos +4\.[0-9.]+ \(Cuda" "CUDA/NCCL +NCCL 2\." "device not started .*no usable GPU"
check help 0 "$fsdpp" --help -- "Subcommands:|SUBCOMMANDS"
check plan 0 "$fsdpp" plan "$root/input/small.yaml" train.global_batch=32 --ranks 4 -- "fsdpp plan: .* on 4 rank"
check plan_json 0 "$fsdpp" plan "$root/input/gpt2-124m.yaml" --ranks 8 --json -- '"ranks":8'
check train_dry_run 0 "$fsdpp" train "$root/input/small.yaml" --dry-run -- "dry run: 4273664 parameters"
check mesh_dry_run 0 "$fsdpp" mesh --dry-run --ranks 4 dp_replicate=2 dp_shard=-1 --backend nccl \
  -- "dry run: 4 ranks, nccl" "rank +3 +coords \[1, 1\] +dp_replicate: \[1 3\] +dp_shard: \[2 3\]"
check tokenize 0 "$fsdpp" tokenize "$root/README.md" "$work/readme.bin" -- "wrote [0-9]+ tokens"

# A checkpoint written by the host build, read by the GPU build.
rm -rf "$work/run" "$work/ckpt"
if "$host/fsdpp" train train.steps=2 train.eval_interval=0 schedule.warmup_steps=1 log.interval=1 \
     checkpoint.dir="$work/ckpt" checkpoint.interval=2 run.output="$work/run" >"$work/host_train.log" 2>&1; then
  step=$(ls "$work/ckpt" | grep -E '^step_[0-9]+\.h5$' | sort -V | tail -1)
  ckpt=$work/ckpt/$step
  check ckpt_inspect 0 "$fsdpp" ckpt inspect "$ckpt" -- "wte"
  check ckpt_verify 0 "$fsdpp" ckpt verify "$ckpt" -- "sound"
  check ckpt_consolidate 0 "$fsdpp" ckpt consolidate "$ckpt" "$work/whole.h5" -- "wrote .*whole\.h5"
  check ckpt_export 0 "$fsdpp" ckpt export "$ckpt" "$work/model.safetensors" -- "wrote .*model\.safetensors"
  check ckpt_import 0 "$fsdpp" ckpt import "$work/model.safetensors" "$work/imported.h5" --deck "$root/input/tiny.yaml" \
    -- "wrote .*imported\.h5"
  if command -v gnuplot >/dev/null; then
    check report 0 "$fsdpp" report "$work/run" -- "wrote .*report\.png"
  fi
else
  echo "no_driver: FAIL  the host build could not write a checkpoint:"; tail -20 "$work/host_train.log"
  failures=$((failures + 1))
fi

# Commands that compute: exit 2, one message naming the expected GPU and the CUDA runtime's answer.
gpu_message="GPU build \(Kokkos [0-9.]+ Cuda backend, sm_[0-9]+\).*no usable GPU was found: cudaGetDeviceCount"
check train_exits_2 2 "$fsdpp" train train.steps=1 -- "$gpu_message"
check init_exits_2 2 "$fsdpp" init --out "$work/seed.h5" -- "$gpu_message"
check train_np2_exits_2 2 mpiexec -n 2 "$fsdpp" train train.steps=1 -- "$gpu_message"
if [ "$(grep -Ec "no usable GPU was found" "$work/train_np2_exits_2.log")" != 1 ]; then
  echo "no_driver: FAIL  train on 2 ranks printed the message $(grep -Ec "no usable GPU was found" "$work/train_np2_exits_2.log") times, not once"
  failures=$((failures + 1))
fi
check device_host_refused 2 "$fsdpp" --device host train train.steps=1 -- "device 'host' was requested, but this fsdpp is a GPU build"

if [ $failures = 0 ]; then
  echo "no_driver: all checks passed (GPU build $fsdpp on a machine without a GPU or driver)"
  exit 0
fi
echo "no_driver: $failures check(s) failed (logs in $work)" >&2
exit 1
