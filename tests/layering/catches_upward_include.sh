#!/bin/bash
# The layering check must fail, naming the file, the line and both layers, when a low folder (tensor/) includes a
# high one (train/); and pass again on the same copy without that line.
set -euo pipefail
repo=${1:?usage: catches_upward_include.sh REPO}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/docs" "$tmp/lib"
cp "$repo/docs/architecture.md" "$tmp/docs/"
cp -r "$repo/lib/fsdpp" "$tmp/lib/"
check="$repo/tests/layering/check_layers.py"
python3 "$check" "$tmp" > /dev/null || { echo "FAIL: the unmodified copy should pass"; exit 1; }
echo '#include "fsdpp/train/trainer.hpp"' >> "$tmp/lib/fsdpp/tensor/types.hpp"
if out=$(python3 "$check" "$tmp"); then echo "FAIL: an upward include passed:"; echo "$out"; exit 1; fi
echo "$out" | grep -Eq '^lib/fsdpp/tensor/types.hpp:[0-9]+: includes lib/fsdpp/train/trainer.hpp: tensor/ is on layer 2, train/ on layer 9' \
  || { echo "FAIL: the message does not name the file, line and layers:"; echo "$out"; exit 1; }
echo "ok: $(echo "$out" | tail -1)"
