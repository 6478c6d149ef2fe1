# shellcheck shell=bash disable=SC2154
# Shared by the cluster tests (sourced): a vcluster of its own for each test, brought down on any exit; jobs run
# with sbatch --wait from the login node (this namespace); byte counters of the nodes' links.
# The caller sets: root (the checkout), fsdpp (the executable), work (a folder of its own).
set -u
V=$root/tests/cluster/vcluster
export FSDPP_VCLUSTER_DIR=$work/vcluster FSDPP=$fsdpp
fail() { echo "FAIL: $*"; exit 1; }

# Brings up `nodes` nodes; skips the test (exit 77, one line) where namespaces cannot be made.
cluster_up() {
  local out rc
  out=$("$V" up --nodes "$1" 2> "$work/vcluster-up.log"); rc=$?
  cat "$work/vcluster-up.log"
  if [ "$rc" = 77 ]; then grep SKIPPED "$work/vcluster-up.log"; exit 77; fi
  [ "$rc" = 0 ] || fail "vcluster up --nodes $1 failed (exit $rc)"
  trap '"$V" down' EXIT
  eval "$out"  # export SLURM_CONF=...
  export SLURM_CONF
}

# run_job SBATCH-ARGS...: submits, then waits for the job's end, polling every 0.3 s (sbatch --wait sleeps 2, 8,
# then 32 s between looks); returns the job's exit code. JOB holds its id.
run_job() {
  local line state code
  JOB=$(sbatch --parsable "$@") || return 1
  while :; do
    line=$(scontrol -o show job "$JOB")
    state=$(grep -Eo "JobState=[A-Z_]+" <<< "$line")
    case "${state#JobState=}" in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE) break ;; esac
    sleep 0.3
  done
  code=$(grep -Eo "ExitCode=[0-9]+" <<< "$line")
  return "${code#ExitCode=}"
}

# crashed_at_launch OUT [FIRST]: the output shows a task killed by a signal before fsdpp said anything (FIRST: a
# regular expression for its first line on rank 0; a training job's is "placement: ..."). Seen twice in CI, each
# time rank 0 segfaulting at address 0 with no frame of ours, before any output, inside the MPI/PMIx start-up of
# srun --mpi=pmix: stop 47 (tp-multi-node.sbatch in templates.sh) and a local CI run of 3ba8483 (calibrate.sh, while CI's
# background lane built the OpenMP variant). 150 launches and 10 runs of templates.sh here, and 11 runs of
# calibrate.sh (5 of them beside 3 busy loops), did not repeat it. Such a launch is retried once, and said so.
crashed_at_launch() {
  ! grep -Eq "${2:-^placement: }" "$1" && grep -Eq "Segmentation fault|Process received signal|Bus error" "$1"
}

# Bytes sent by all nodes through their links (every byte that crossed between nodes, or to the login node).
bytes_sent() { "$V" bytes | awk '{s += $2} END {print s}'; }

# The job's own prediction: "bytes between hosts (predicted, flat rings): N"
predicted_bytes() { grep -Eo "bytes between hosts \(predicted, flat rings\): [0-9]+" "$1" | tail -1 | grep -Eo "[0-9]+$"; }

# |measured - predicted| <= 5% of predicted
within_5_percent() { awk -v m="$1" -v p="$2" 'BEGIN {d = m - p; if (d < 0) d = -d; exit !(p > 0 && d <= 0.05 * p)}'; }

# Losses logged at the same steps of two metrics.jsonl files agree within fp32 tolerance (relative 1e-5),
# over at least `min` common steps; prints the largest relative difference.
same_losses() {
  python3 - "$1" "$2" "${3:-3}" <<'PY'
import json, sys
def losses(path):
    return {r["step"]: r["loss"] for r in map(json.loads, open(path)) if "loss" in r}
a, b, least = losses(sys.argv[1]), losses(sys.argv[2]), int(sys.argv[3])
common = sorted(set(a) & set(b))
worst = max((abs(a[s] - b[s]) / max(abs(a[s]), 1e-30) for s in common), default=float("inf"))
print(f"{len(common)} common steps, largest relative loss difference {worst:.3g}")
sys.exit(0 if len(common) >= least and worst <= 1e-5 else 1)
PY
}

# The fsdpp processes running on node $1.
fsdpp_on() { for p in $("$V" pids "$1"); do [ "$(cat "/proc/$p/comm" 2>/dev/null)" = fsdpp ] && echo "$p"; done; }
