#!/usr/bin/env bash
# Preemption on every mesh dimension, at many signal timings, under load (issue 54). A pipeline once deadlocked
# here: the stop was agreed over a stage's ranks only, so stage 0 stopped after step 4 and waited in the save while
# stage 1 entered step 5 and waited for stage 0's activations (3 runs of 12 hung on two busy cores, none on a quiet
# machine). So two busy loops hold the cores for the whole test, and each layout is signalled at several steps with
# a random delay, landing in forwards, backwards, interval saves and evaluations; odd trials signal the whole job
# (mpiexec forwards it), even ones a single rank, as when the signal reaches one node before the others (under a
# pipeline that alone deadlocked every time). Every run must:
#   exit 85 within 90 s (a hang fails, it is not waited out),
#   leave checkpoints/latest naming the step it stopped at, a file `fsdpp ckpt verify` passes,
#   and resume to the uninterrupted run's losses of every later step, bitwise (pp 2 x cp 2 found a save right after
#   an evaluation writing shard 0's rows into every shard; the stop after step 4, the evaluation's, showed it).
# FSDPP_PREEMPT_TRIALS (default 3) sets the trials per layout; the 2-rank pipeline gets twice as many.
# shellcheck source=../flight/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../flight/lib.sh"  # fail, wait_for_steps, rank_pid
fsdpp=$1; mpirun=$2; decks=$3; dir=$4
trials=${FSDPP_PREEMPT_TRIALS:-3}
rm -rf "$dir"; mkdir -p "$dir"

busy=()
for _ in 1 2; do (while :; do :; done) & busy+=($!); done
trap 'kill "${busy[@]}" 2>/dev/null' EXIT

steps=16
common=(train.steps=$steps schedule.warmup_steps=1 train.eval_interval=4 train.eval_batches=1 checkpoint.interval=3
        log.interval=1 comm.timeout_s=120)
llama=("$decks/llama-tiny.yaml" model.n_layer=4 train.global_batch=8 train.micro_batch=2)
# Qwen3-MoE with 3 layers: at pp 2, stage 0 holds only the dense layer 0 (no experts to exchange).
moe=("$decks/qwen3-moe-tiny.yaml" train.global_batch=8 train.micro_batch=2)
layouts=(  # name | ranks | trials | deck and keys
  "pp2|2|$((2 * trials))|${llama[*]} mesh.pp=2"
  "pp2_cp2|4|$trials|${llama[*]} mesh.pp=2 mesh.cp=2 model.attention=fused"
  "pp2_dp2_ep2|4|$trials|${moe[*]} mesh.pp=2 mesh.dp_shard=2 mesh.ep=2"
  "tp2_hsdp2|4|$trials|${llama[*]} mesh.tp=2 fsdp.strategy=hybrid_shard mesh.dp_replicate=2 mesh.dp_shard=1"
)

# The losses of steps after $2 in metrics file $1, one "step loss" a line (the last line logged for each step).
losses_after() {
  python3 -c '
import json, sys
last = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    last[r["step"]] = r["loss"]
for s in sorted(last):
    if s > int(sys.argv[2]): print(s, repr(last[s]))' "$1" "$2"
}

runs=0
for layout in "${layouts[@]}"; do
  IFS='|' read -r name ranks count keys <<< "$layout"
  read -ra deck <<< "$keys"
  "$mpirun" -n "$ranks" "$fsdpp" train "${deck[@]}" "${common[@]}" "checkpoint.dir=$dir/$name-ref/ck" \
    "run.output=$dir/$name-ref" > "$dir/$name-ref.log" 2>&1 || { tail -30 "$dir/$name-ref.log"; fail "$name: reference run"; }
  for trial in $(seq "$count"); do
    run=$dir/$name-$trial
    # After step 1..4 is logged, then 0-0.15 s more: a tiny step takes 50-100 ms, so the stop lands a few steps
    # later, well before the last (a signal after the last step boundary would let the run end with exit 0).
    at=$((1 + (trial - 1) % 4))
    delay=$(printf '0.%03d' $((RANDOM % 150)))
    "$mpirun" -n "$ranks" "$fsdpp" train "${deck[@]}" "${common[@]}" "checkpoint.dir=$run/ck" "run.output=$run" \
      > "$run.log" 2>&1 &
    pid=$!
    # The deadline is the test's, not the watchdog's: a hang fails here long before comm.timeout_s (mpiexec ends
    # its ranks on SIGTERM).
    (sleep 90; kill -TERM "$pid" 2>/dev/null; sleep 5; kill -KILL "$pid" 2>/dev/null) &
    deadline=$!
    wait_for_steps "$run" "$at" || { kill -TERM "$pid"; tail -30 "$run.log"; fail "$name trial $trial: no step $at"; }
    sleep "$delay"
    if [ $((trial % 2)) = 1 ]; then
      target="the job"
      kill -USR1 "$pid" 2>/dev/null  # Open MPI's mpiexec forwards SIGUSR1 to every rank
    else
      # One rank alone, as a signal that reaches one node first: the others must stop at the same step.
      rank=$(((trial / 2) % ranks))
      target="rank $rank"
      rank_process=$(rank_pid "$pid" "$rank") || { kill -TERM "$pid"; fail "$name trial $trial: no rank $rank under mpiexec"; }
      kill -USR1 "$rank_process" 2>/dev/null
    fi
    wait "$pid"; rc=$?
    kill "$deadline" 2>/dev/null
    [ "$rc" = 85 ] || { tail -30 "$run.log"; fail "$name trial $trial (signal to $target after step $at + ${delay}s): exit $rc, expected 85"; }
    stopped=$(grep -Eo "preempted: signal 10 received; stopped after step [0-9]+" "$run.log" | grep -Eo "[0-9]+$") \
      || fail "$name trial $trial: no preemption line"
    latest=$(cat "$run/ck/latest") || fail "$name trial $trial: no checkpoints/latest"
    [ "$latest" = "$(printf 'step_%08d.h5' "$stopped")" ] || fail "$name trial $trial: latest is $latest, stopped after step $stopped"
    "$fsdpp" ckpt verify "$run/ck/$latest" > "$run.verify.log" 2>&1 || { cat "$run.verify.log"; fail "$name trial $trial: $latest does not verify"; }
    "$mpirun" -n "$ranks" "$fsdpp" train "${deck[@]}" "${common[@]}" "checkpoint.dir=$run/ck" "run.output=$run" \
      checkpoint.resume=auto > "$run.resume.log" 2>&1 || { tail -30 "$run.resume.log"; fail "$name trial $trial: resume"; }
    want=$(losses_after "$dir/$name-ref/metrics.jsonl" "$stopped")
    got=$(losses_after "$run/metrics.jsonl" "$stopped")
    [ -n "$want" ] && [ "$want" = "$got" ] || { diff <(echo "$want") <(echo "$got"); fail "$name trial $trial: resumed losses differ"; }
    echo "$name trial $trial: signal to $target after step $at + ${delay}s, stopped after step $stopped, exit 85, $latest verifies, resumed bitwise"
    runs=$((runs + 1))
  done
done
echo "preemption on every mesh: $runs runs under load stopped, saved and resumed bitwise"
