# Sourced by the training benchmarks (attention, activation_checkpointing, tp_scaling): their shared options, the
# MPI environment of one machine, and a work folder removed on exit. Set the defaults before sourcing:
#   fsdpp=build/bin/fsdpp deck=input/small.yaml steps=6 rounds=2 ranks="1 2"; source tests/bench/options.sh "$@"
# Options: --fsdpp, --deck, --steps, --rounds, --ranks; every other argument is a deck override (in `overrides`).
overrides=()
while [ $# -gt 0 ]; do
  case "$1" in
    --fsdpp) fsdpp=$2; shift 2 ;;
    --deck) deck=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    *) overrides+=("$1"); shift ;;
  esac
done
[ "$steps" -ge 2 ] || { echo "error: --steps must be at least 2 (the first step is not timed)" >&2; exit 2; }
export OMPI_MCA_rmaps_base_oversubscribe=1 OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# vcluster_up: a virtual cluster of 2 nodes for the bench's srun jobs (tests/cluster/vcluster, root; V names it),
# brought down on exit; fails, with its reason in $work/vcluster.log, where none can be made.
vcluster_up() {
  export FSDPP_VCLUSTER_DIR=$work/vcluster
  V=tests/cluster/vcluster
  local up
  up=$("$V" up --nodes 2 --cpus 2 2>"$work/vcluster.log") || return 1
  trap '"$V" down >/dev/null 2>&1; rm -rf "$work"' EXIT
  eval "$up"
  export SLURM_CONF FSDPP_DEVICE=host
}
# The bytes the virtual cluster's links have carried so far (after vcluster_up).
vcluster_bytes() { "$V" bytes | awk '{s += $2} END {print s}'; }
