# shellcheck shell=bash disable=SC2034
# Shared by the tests of one-host runs under mpiexec (sourced): the flight recorder's and the launcher's.
set -u
fail() { echo "FAIL: $*"; exit 1; }
host=$(hostname)

# Waits until run folder $1 has logged $2 steps (at most 60 s).
wait_for_steps() {
  for _ in $(seq 600); do
    [ -f "$1/metrics.jsonl" ] && [ "$(wc -l < "$1/metrics.jsonl")" -ge "$2" ] && return 0
    sleep 0.1
  done
  return 1
}

# The PID of world rank $2 among the children of launcher $1 (OMPI_COMM_WORLD_RANK in its environment).
rank_pid() {
  local child
  for child in $(pgrep -P "$1"); do
    tr '\0' '\n' < "/proc/$child/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" && { echo "$child"; return 0; }
  done
  return 1
}

# Waits for process $1 to end within $2 seconds; prints the milliseconds it took from $3 (date +%s%N).
wait_gone() {
  local deadline=$((SECONDS + $2))
  while kill -0 "$1" 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.05
  done
  echo $((($(date +%s%N) - $3) / 1000000))
}
