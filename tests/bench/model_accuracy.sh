#!/usr/bin/env bash
# How well `fsdpp plan --machine` predicts ms/step on this machine: calibrate each launch (`fsdpp bench
# calibrate`), predict each case (`fsdpp plan --machine --json`), train it, compare; then the search check on the
# virtual cluster (tests/cluster/vcluster; root). tests/bench/model_accuracy.py says what and how.
#   tests/bench/model_accuracy.sh [--steps 8] [--warmup 2] [--rounds 1] [--min-timed-s 2] [--only TEXT] [--ranks 1,2,4] [--nodes auto|off]
#                                 [--rates 1000mbit,300mbit] [--search-rounds 2] [--quick] [--retries N] [--ci [--bound 0.15]] [--fsdpp build/bin/fsdpp]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export OMPI_MCA_rmaps_base_oversubscribe=1 OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
exec python3 tests/bench/model_accuracy.py "$@"
