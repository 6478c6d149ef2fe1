#!/usr/bin/env bash
# train.reproducible gives the same bits whatever OpenBLAS's thread count: the tiny deck (context length 64, where
# OpenBLAS threads its products; the MPI tests' 16 is too small for it to) on 1 and 2 ranks, with
# OPENBLAS_NUM_THREADS unset (1 rank then took both cores of a 2-core machine, 2 ranks one each), 1 and 2: every
# step's loss bitwise equal (metrics.jsonl prints the shortest digits that read back as the same double). The
# banner names the one thread per rank of the mode, and warns when OPENBLAS_NUM_THREADS asked for another count.
#   reproducible_blas_threads.sh FSDPP MPIEXEC WORKDIR
set -u
fsdpp=$1; mpirun=$2; dir=$3
rm -rf "$dir"; mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }
common=(train.reproducible=true train.global_batch=60 train.steps=2 schedule.warmup_steps=1 train.eval_interval=0
        log.interval=1)
reference=""
for threads in unset 1 2; do
  if [ "$threads" = unset ]; then launch=(env -u OPENBLAS_NUM_THREADS); else launch=(env "OPENBLAS_NUM_THREADS=$threads"); fi
  for np in 1 2; do
    run="$dir/threads-$threads-np$np"
    # --bind-to none: Open MPI binds each rank to a core, and OpenBLAS then caps OPENBLAS_NUM_THREADS at 1.
    "${launch[@]}" "$mpirun" --bind-to none -n "$np" "$fsdpp" train "${common[@]}" "train.micro_batch=$((60 / np))" \
      "run.output=$run" > "$run.log" 2>&1 || { tail -20 "$run.log"; fail "OPENBLAS_NUM_THREADS $threads, $np rank(s): the run failed"; }
    losses=$(grep -o '"loss":[^,}]*' "$run/metrics.jsonl" | cut -d: -f2 | tr '\n' ' ')
    echo "OPENBLAS_NUM_THREADS $threads, $np rank(s): $(grep -o 'BLAS threads per rank: .*' "$run.log"); step losses $losses"
    [ "$(wc -w <<<"$losses")" = 2 ] || fail "OPENBLAS_NUM_THREADS $threads, $np rank(s): $(wc -w <<<"$losses") losses in metrics.jsonl, expected 2"
    [ -n "$reference" ] || reference=$losses
    [ "$losses" = "$reference" ] || fail "OPENBLAS_NUM_THREADS $threads, $np rank(s): losses $losses, first run $reference"
  done
done
for log in "$dir"/*.log; do
  grep -q "BLAS threads per rank: 1 (train.reproducible)$" "$log" || fail "$log: no 'BLAS threads per rank: 1 (train.reproducible)'"
done
for np in 1 2; do
  grep -q "^warning: train.reproducible runs OpenBLAS with 1 thread per rank, not OPENBLAS_NUM_THREADS=2" \
    "$dir/threads-2-np$np.log" || fail "OPENBLAS_NUM_THREADS 2, $np rank(s): no warning that the mode overrides it"
done
if grep -q "^warning: train.reproducible runs OpenBLAS" "$dir"/threads-unset-*.log "$dir"/threads-1-*.log; then
  fail "a warning about OPENBLAS_NUM_THREADS where it was unset or 1"
fi
echo "train.reproducible: the same losses on 1 and 2 ranks with OPENBLAS_NUM_THREADS unset, 1 and 2"
