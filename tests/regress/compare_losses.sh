#!/usr/bin/env bash
# Bitwise loss regression between two builds: runs loss_matrix.sh with each fsdpp executable and diffs the
# outputs. Exit 0 only when every loss of every run is identical to the last bit.
#   tests/regress/compare_losses.sh baseline/fsdpp build/bin/fsdpp
# A baseline executable of an older revision: git worktree add /tmp/base REV && cmake -S /tmp/base -B
# /tmp/base/build -G Ninja && cmake --build /tmp/base/build --target fsdpp
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
old=${1:?usage: $0 OLD_FSDPP NEW_FSDPP}
new=${2:?usage: $0 OLD_FSDPP NEW_FSDPP}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$here/loss_matrix.sh" "$old" >"$tmp/old.txt"
"$here/loss_matrix.sh" "$new" >"$tmp/new.txt"
if diff -u "$tmp/old.txt" "$tmp/new.txt"; then
  echo "bitwise identical: $(wc -l <"$tmp/new.txt") runs"
else
  echo "error: losses differ between $old and $new (diff above)" >&2
  exit 1
fi
