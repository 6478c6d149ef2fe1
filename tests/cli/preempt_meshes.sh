#!/usr/bin/env bash
# Preemption on every mesh dimension, at many signal timings, under load (issue 54). A pipeline once deadlocked
# here: the stop was agreed over a stage's ranks only, so stage 0 stopped after step 4 and waited in the save while
# stage 1 entered step 5 and waited for stage 0's activations (3 runs of 12 hung on two busy cores, none on a quiet
# machine). So two busy loops hold the cores for the whole test (and two layouts run at a time, each the other's
# load), and each layout is signalled at several steps with a random delay, landing in forwards, backwards, interval
# saves and evaluations; odd trials signal the whole job (mpiexec forwards it), even ones a single rank, as when the
# signal reaches one node before the others (under a pipeline that alone deadlocked every time). Every run must:
#   exit 85 within 90 s (a hang fails, it is not waited out),
#   leave checkpoints/latest naming the step it stopped at, a file `fsdpp ckpt verify` passes,
#   and resume to the uninterrupted run's losses of every later step, bitwise (pp 2 x cp 2 found a save right after
#   an evaluation writing shard 0's rows into every shard; the stop after step 4, the evaluation's, showed it).
# The trials of a layout form one chain, so that no step runs twice: trial 1 starts fresh, trial k + 1 resumes
# trial k's checkpoint and is itself signalled, and a last run resumes the last trial's checkpoint to the end. Each
# run's losses must equal the uninterrupted run's, bitwise, at every step it ran; so every step after each trial's
# stop is resumed from that trial's checkpoint (directly, or through later saves, which a wrong checkpoint would
# carry on) and checked. The steps (5 per trial, and 4) leave room for every stop before the end.
# FSDPP_PREEMPT_TRIALS (default 3) sets the trials per layout; the 2-rank pipeline gets twice as many.
# shellcheck source=../flight/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../flight/lib.sh"  # fail, wait_for_steps, rank_pid
fsdpp=$1; mpirun=$2; decks=$3; dir=$4
trials=${FSDPP_PREEMPT_TRIALS:-3}
rm -rf "$dir"; mkdir -p "$dir"

busy=()
for _ in 1 2; do (while :; do :; done) & busy+=($!); done
trap 'kill "${busy[@]}" 2>/dev/null' EXIT

# An evaluation every 2 steps and a save every 3: the stops of a chain (after steps about 2, 5 and 9) land after
# evaluations, saves and both (a save right after an evaluation is what pp 2 x cp 2 got wrong).
common=(schedule.warmup_steps=1 train.eval_interval=2 train.eval_batches=1 checkpoint.interval=3 log.interval=1
        comm.timeout_s=120)
# Small models: what is checked (the stop agreed over every rank, the save, the resume) does not depend on size.
llama=("$decks/llama-tiny.yaml" model.n_layer=4 model.context_length=32 train.global_batch=8 train.micro_batch=2)
# Qwen3-MoE with 3 layers: at pp 2, stage 0 holds only the dense layer 0 (no experts to exchange).
moe=("$decks/qwen3-moe-tiny.yaml" model.context_length=32 train.global_batch=8 train.micro_batch=2)
layouts=(  # name | ranks | trials | deck and keys
  "pp2|2|$((2 * trials))|${llama[*]} mesh.pp=2"
  "pp2_cp2|4|$trials|${llama[*]} mesh.pp=2 mesh.cp=2 model.attention=fused"
  "pp2_dp2_ep2|4|$trials|${moe[*]} mesh.pp=2 mesh.dp_shard=2 mesh.ep=2"
  "tp2_hsdp2|4|$trials|${llama[*]} mesh.tp=2 fsdp.strategy=hybrid_shard mesh.dp_replicate=2 mesh.dp_shard=1"
)

# The losses of steps in ($2, $3] in metrics file $1, one "step loss" a line (the last line logged for each step).
losses_between() {
  python3 -c '
import json, sys
last = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    last[r["step"]] = r["loss"]
for s in sorted(last):
    if int(sys.argv[2]) < s <= int(sys.argv[3]): print(s, repr(last[s]))' "$1" "$2" "$3"
}
# same_losses WHAT RUN FROM TO: run $RUN's losses of steps (FROM, TO] are the reference's, bitwise, and all there.
same_losses() {
  local want got
  want=$(losses_between "$dir/$name-ref/metrics.jsonl" "$3" "$4")
  got=$(losses_between "$2/metrics.jsonl" "$3" "$4")
  [ "$(echo "$want" | wc -l)" = $(($4 - $3)) ] && [ "$want" = "$got" ] ||
    { diff <(echo "$want") <(echo "$got"); fail "$1: losses of steps $(($3 + 1))-$4 differ from the uninterrupted run's"; }
}

# layout_chain LAYOUT: the uninterrupted run and the chain of trials of one layout (fails, exiting, on any fault).
layout_chain() {
  local name ranks count keys deck steps ck resume stopped trial run from at delay pid deadline rc target rank
  local rank_process started latest
  IFS='|' read -r name ranks count keys <<< "$1"
  read -ra deck <<< "$keys"
  steps=$((5 * count + 4))
  deck+=("train.steps=$steps")
  # The uninterrupted run saves nothing (saves must not change what training computes).
  "$mpirun" -n "$ranks" "$fsdpp" train "${deck[@]}" "${common[@]}" checkpoint.interval=0 "checkpoint.dir=$dir/$name-ref/ck" \
    "run.output=$dir/$name-ref" > "$dir/$name-ref.log" 2>&1 || { tail -30 "$dir/$name-ref.log"; fail "$name: reference run"; }
  ck=$dir/$name-ck
  resume=()
  stopped=0
  for trial in $(seq "$count"); do
    run=$dir/$name-$trial
    from=$stopped
    # After step 1..4 of this run is logged, then 0-0.15 s more: a step takes 0.1-0.6 s under the busy loops, so
    # the stop lands 0-3 steps later, well before the last.
    at=$((1 + (trial - 1) % 4))
    delay=$(printf '0.%03d' $((RANDOM % 150)))
    "$mpirun" -n "$ranks" "$fsdpp" train "${deck[@]}" "${common[@]}" "checkpoint.dir=$ck" "run.output=$run" \
      "${resume[@]}" > "$run.log" 2>&1 &
    pid=$!
    # The deadline is the test's, not the watchdog's: a hang fails here long before comm.timeout_s (mpiexec ends
    # its ranks on SIGTERM). Its output goes nowhere: the sleep that outlives the killed deadline must not hold the
    # test's stdout open (ctest waits for it to close, up to 90 s after the last trial).
    (sleep 90; kill -TERM "$pid" 2>/dev/null; sleep 5; kill -KILL "$pid" 2>/dev/null) >/dev/null 2>&1 &
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
    started=$([ "$from" = 0 ] && echo "from the start" || echo "resumed after step $from")
    [ "$rc" = 85 ] || { tail -30 "$run.log"; fail "$name trial $trial ($started, signal to $target after step $at + ${delay}s): exit $rc, expected 85"; }
    stopped=$(grep -Eo "preempted: signal 10 received; stopped after step [0-9]+" "$run.log" | grep -Eo "[0-9]+$") \
      || fail "$name trial $trial: no preemption line"
    [ "$stopped" -gt "$from" ] && [ "$stopped" -lt "$steps" ] || fail "$name trial $trial: stopped after step $stopped ($started, of $steps)"
    latest=$(cat "$ck/latest") || fail "$name trial $trial: no checkpoints/latest"
    [ "$latest" = "$(printf 'step_%08d.h5' "$stopped")" ] || fail "$name trial $trial: latest is $latest, stopped after step $stopped"
    "$fsdpp" ckpt verify "$ck/$latest" > "$run.verify.log" 2>&1 || { cat "$run.verify.log"; fail "$name trial $trial: $latest does not verify"; }
    # This run's steps, from the start or resumed from the previous trial's checkpoint, bitwise the reference's.
    same_losses "$name trial $trial ($started)" "$run" "$from" "$stopped"
    echo "$name trial $trial: $started, signal to $target after step $at + ${delay}s, stopped after step $stopped, exit 85, $latest verifies, its steps bitwise"
    resume=(checkpoint.resume=auto)
  done
  # The last trial's checkpoint, resumed to the end.
  "$mpirun" -n "$ranks" "$fsdpp" train "${deck[@]}" "${common[@]}" "checkpoint.dir=$ck" "run.output=$dir/$name-end" \
    checkpoint.resume=auto > "$dir/$name-end.log" 2>&1 || { tail -30 "$dir/$name-end.log"; fail "$name: resume after step $stopped"; }
  same_losses "$name: resumed after step $stopped" "$dir/$name-end" "$stopped" "$steps"
  echo "$name: $count stops in one chain of resumes, steps 1-$steps bitwise the uninterrupted run's"
}

# Two layouts at a time (two lanes of two, about equally long): the machine's busy loops and another layout's ranks
# are the load each run is signalled under.
lanes=("0 2" "3 1")
pids=()
for lane in "${!lanes[@]}"; do
  (RANDOM=$(($$ + lane)); for k in ${lanes[lane]}; do layout_chain "${layouts[k]}"; done) > "$dir/lane$lane.out" 2>&1 &
  pids+=($!)
done
status=0
for lane in "${!lanes[@]}"; do
  wait "${pids[lane]}" || status=1
  cat "$dir/lane$lane.out"
done
[ "$status" = 0 ] || exit 1
runs=$(cat "$dir"/lane*.out | grep -c " trial [0-9]*: .* its steps bitwise$")
[ "$runs" = $((5 * trials)) ] || fail "$runs trials passed, expected $((5 * trials))"
echo "preemption on every mesh: $runs runs under load stopped, saved and resumed bitwise"
