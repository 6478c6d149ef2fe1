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
      sleep 1
      kill -0 $ranks 2>/dev/null || fail "STOP: the ranks ended while the wrapper was stopped"
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

try USR1 85
grep -q "preempted: signal 10 received" "$dir/USR1.log" || fail "USR1: the ranks were not preempted"
try HUP 85
try USR2 85
try STOP 0 1000  # enough steps to outlast the second the wrapper stays stopped (150 took 1.0 s in CI, 12 took 0.4 s here)
grep -Eq "Loop time of [0-9.]+ on 2 procs for 1000 steps" "$dir/STOP.log" || fail "STOP/CONT: the run did not finish"
# The signals that end the wrapper, four at a time (each run mostly waits).
batch=()
for sig in QUIT ILL TRAP ABRT BUS FPE SEGV PIPE ALRM STKFLT XCPU XFSZ VTALRM PROF IO PWR SYS RTMIN RTMIN+8 RTMAX; do
  ( try "$sig" $((128 + $(kill -l "$sig")))
    grep -q "fsdpp-mpiexec: signal $(kill -l "$sig") received; ending the job before this launcher" "$dir/$sig.log" \
      || fail "$sig: the wrapper did not say it ended the job" ) > "$dir/$sig.result" 2>&1 &
  batch+=($!)
  if [ ${#batch[@]} = 4 ]; then
    for p in "${batch[@]}"; do wait "$p" || failed=1; done
    batch=()
  fi
done
for p in "${batch[@]}"; do wait "$p" || failed=1; done
cat "$dir"/*.result
[ -z "${failed:-}" ] || fail "a signal left the job behind its launcher or ended it wrongly (above)"
try KILL 137
echo "launcher signals: USR1, HUP, USR2, STOP/CONT and every terminating signal, KILL included, leave no job behind its launcher"
