#!/usr/bin/env bash
# Every signal a scheduler or a user may send to share/scripts/fsdpp-mpiexec (SIGTERM and SIGINT: see
# preempt_signals.sh), against a 2-rank training run, as preempt.sh tries mpiexec:
#   SIGUSR1, SIGHUP                the ranks save and stop: exit 85
#   SIGUSR2                        every rank dumps its flight records and the run goes on (then SIGTERM: 85)
#   SIGSTOP, then SIGCONT          the wrapper pauses; the job runs on with its launcher and ends normally: 0
#   every other signal that ends a process, SIGKILL included
#                                  the job ends with the wrapper (128 + signal), and right after it a run on the
#                                  same checkpoint.dir is not refused: no rank lives on holding its lock
# In every case, within 15 s of the wrapper's exit, mpiexec and both ranks are gone.
set -u
fsdpp=$1; mpirun=$2; wrapper=$3; dir=$4
rm -rf "$dir"; mkdir -p "$dir"
# shellcheck source=tests/flight/lib.sh
. "$(dirname "$0")/../flight/lib.sh"  # fail, wait_for_steps
export MPIEXEC=$mpirun
args=(train.steps=400 schedule.warmup_steps=2 train.eval_interval=0 log.interval=1 checkpoint.interval=100000)

# try SIGNAL EXPECTED-EXIT-CODE [steps]
try() {
  local sig=$1 want=$2 steps=${3:-400} run=$dir/$1 wrapper_pid launcher ranks rc
  # A session directory of its own for each job: runs four at a time, and Open MPI 4.1's mpiexec fails to start
  # ("orte_session_dir failed ... File exists" on /tmp/ompi.<host>.<uid>) when it creates the shared one while
  # another job's mpiexec, ending, removes it.
  local -x OMPI_MCA_orte_tmpdir_base
  OMPI_MCA_orte_tmpdir_base=$(mktemp -d /tmp/fsdpp-signals.XXXXXX)
  # A background job of a script starts with SIGINT and SIGQUIT ignored; the wrapper gets them back.
  env --default-signal=QUIT,INT "$wrapper" -n 2 "$fsdpp" train "${args[@]}" "train.steps=$steps" "checkpoint.dir=$run-ck" \
    "run.output=$run" > "$run.log" 2>&1 &
  wrapper_pid=$!
  wait_for_steps "$run" 1 || { kill -9 "$wrapper_pid"; fail "$sig: no steps logged"; }
  launcher=$(pgrep -P "$wrapper_pid")
  ranks=$(pgrep -P "$launcher" | tr '\n' ' ')
  [ "$(echo "$ranks" | wc -w)" = 2 ] || fail "$sig: expected 2 ranks under mpiexec $launcher, found '$ranks'"
  case "$sig" in
    USR2)
      kill -USR2 "$wrapper_pid"
      for _ in $(seq 100); do [ "$(grep -c "SIGUSR2: wrote" "$run.log")" = 2 ] && break; sleep 0.1; done
      [ "$(grep -c "SIGUSR2: wrote" "$run.log")" = 2 ] || fail "USR2: the ranks did not both dump"
      wait_for_steps "$run" 8 || fail "USR2: the run did not go on"
      kill -TERM "$wrapper_pid" ;;
    STOP)
      kill -STOP "$wrapper_pid"
      # While the wrapper is stopped the job runs on: its ranks log 5 more steps (or up to their last; waited for,
      # not a fixed pause), and are still there, unless they have logged every step (ended normally: exit code 0
      # below).
      local logged
      logged=$(wc -l < "$run/metrics.jsonl")
      wait_for_steps "$run" $((logged + 5 < steps ? logged + 5 : steps)) \
        || { kill -CONT "$wrapper_pid"; kill -9 "$wrapper_pid"; fail "STOP: the job made no progress while the wrapper was stopped"; }
      kill -0 $ranks 2>/dev/null || [ "$(wc -l < "$run/metrics.jsonl")" -ge "$steps" ] \
        || fail "STOP: the ranks ended while the wrapper was stopped"
      kill -CONT "$wrapper_pid" ;;
    *) kill "-$sig" "$wrapper_pid" ;;
  esac
  wait "$wrapper_pid"; rc=$?
  local deadline=$((SECONDS + 15))
  while kill -0 "$launcher" $ranks 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || { kill -9 "$launcher" $ranks 2>/dev/null; fail "$sig: mpiexec or a rank outlived the wrapper by 15 s"; }
    sleep 0.1
  done
  echo "SIG$sig: fsdpp-mpiexec exited $rc; mpiexec and the ranks are gone"
  [ "$rc" = "$want" ] || { tail -20 "$run.log"; fail "SIG$sig: exit code $rc, expected $want"; }
  if [ "$sig" = KILL ] || [ "$sig" = QUIT ]; then  # the checkpoint folder's lock went with the ranks
    "$mpirun" -n 2 "$fsdpp" train "${args[@]}" train.steps=2 checkpoint.interval=1 "checkpoint.dir=$run-ck" \
      "run.output=$run-after" > "$run-after.log" 2>&1 || { tail -5 "$run-after.log"; fail "SIG$sig: a run on the same checkpoint.dir was refused"; }
  fi
  rm -rf "$OMPI_MCA_orte_tmpdir_base"
}

# Every case, four at a time (each run mostly waits, and they race each other for the cores): a new one starts as
# soon as one ends. Each writes its lines to $dir/SIG.result.
case_of() {  # SIGNAL: the case, run in a subshell
  local sig=$1
  case "$sig" in
    USR1) try USR1 85
          grep -q "preempted: signal 10 received" "$dir/USR1.log" || fail "USR1: the ranks were not preempted" ;;
    HUP|USR2) try "$sig" 85 ;;
    # 40 steps: more than the 5 the job runs while the wrapper is stopped (200 took 32 s beside the other cases on
    # 2 busy cores, 12 took 0.4 s on an idle one).
    STOP) try STOP 0 40
          grep -Eq "Loop time of [0-9.]+ on 2 procs for 40 steps" "$dir/STOP.log" || fail "STOP/CONT: the run did not finish" ;;
    KILL) try KILL 137 ;;
    *) try "$sig" $((128 + $(kill -l "$sig")))
       grep -q "fsdpp-mpiexec: signal $(kill -l "$sig") received; ending the job before this launcher" "$dir/$sig.log" \
         || fail "$sig: the wrapper did not say it ended the job" ;;
  esac
}
signals=(USR1 HUP USR2 STOP QUIT ILL TRAP ABRT BUS FPE SEGV PIPE ALRM STKFLT XCPU XFSZ VTALRM PROF IO PWR SYS RTMIN
         RTMIN+8 RTMAX KILL)
running=0
for sig in "${signals[@]}"; do
  if [ "$running" = 4 ]; then wait -n || failed=1; running=$((running - 1)); fi
  ( case_of "$sig" ) > "$dir/$sig.result" 2>&1 &
  running=$((running + 1))
done
while [ "$running" -gt 0 ]; do wait -n || failed=1; running=$((running - 1)); done
for sig in "${signals[@]}"; do cat "$dir/$sig.result"; done
[ -z "${failed:-}" ] || fail "a signal left the job behind its launcher or ended it wrongly (above)"
echo "launcher signals: USR1, HUP, USR2, STOP/CONT and every terminating signal, KILL included, leave no job behind its launcher"
