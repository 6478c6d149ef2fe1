#!/usr/bin/env bash
# expect.sh: run a command and check what a user would see.
#   expect.sh [--exit zero|nonzero|<code>] [--contains REGEX]... [--once REGEX]... [--skip-if-gpu]
#             [--timeout SECONDS] -- command...
# --once REGEX: the pattern appears on exactly one line of the combined output (an all-ranks error printed
# by rank 0 alone, not once per rank). --timeout: how long before the command counts as hung (default 120 s;
# keep it below the test's ctest TIMEOUT so the output is still shown). Exits 77 (ctest SKIP_RETURN_CODE) with --skip-if-gpu on a GPU machine.
set -u
want_exit=zero; contains=(); once=(); skip_if_gpu=0; limit=120
while [ $# -gt 0 ]; do
  case "$1" in
    --exit) want_exit=$2; shift 2 ;;
    --contains) contains+=("$2"); shift 2 ;;
    --once) once+=("$2"); shift 2 ;;
    --skip-if-gpu) skip_if_gpu=1; shift ;;
    --timeout) limit=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "expect.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
if [ "$skip_if_gpu" = 1 ] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "a GPU is visible: this check is for machines without one"; exit 77
fi
out=$(timeout "$limit" "$@" 2>&1); rc=$?
printf '%s\n' "$out"
echo "---- exit code $rc"
fail=0
if [ "$rc" = 124 ]; then echo "FAIL: timed out (a hang)"; fail=1; fi
if [ "$want_exit" = zero ] && [ "$rc" != 0 ]; then echo "FAIL: expected exit 0"; fail=1; fi
if [ "$want_exit" = nonzero ] && [ "$rc" = 0 ]; then echo "FAIL: expected a non-zero exit"; fail=1; fi
if [[ "$want_exit" =~ ^[0-9]+$ ]] && [ "$rc" != "$want_exit" ]; then echo "FAIL: expected exit $want_exit"; fail=1; fi
for re in "${contains[@]+"${contains[@]}"}"; do
  printf '%s\n' "$out" | grep -Eq -- "$re" || { echo "FAIL: output lacks /$re/"; fail=1; }
done
for re in "${once[@]+"${once[@]}"}"; do
  n=$(printf '%s\n' "$out" | grep -Ec -- "$re")
  [ "$n" = 1 ] || { echo "FAIL: /$re/ appears $n times, expected once"; fail=1; }
done
exit $fail
