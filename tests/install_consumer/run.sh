#!/usr/bin/env bash
# Install fsdpp from the build tree into a scratch prefix, build an outside project against it with
# find_package(fsdpp), and run that project on 2 ranks.
set -euo pipefail
build_dir=$1; mpiexec=$2
work=$build_dir/install-test
rm -rf "$work"
cmake --install "$build_dir" --prefix "$work/prefix" > "$work.log" 2>&1 || { cat "$work.log"; exit 1; }
test -x "$work/prefix/bin/fsdpp"
test -f "$work/prefix/share/cmake/fsdpp/fsdppConfig.cmake"
cmake -S "$(dirname "$0")/consumer" -B "$work/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix"
cmake --build "$work/consumer"
"$mpiexec" -n 2 "$work/consumer/consumer"
