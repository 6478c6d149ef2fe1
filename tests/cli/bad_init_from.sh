#!/usr/bin/env bash
# Weights that only rank 0 reads, and cannot use, are a clear error on every rank at once: an F64 safetensors
# file (a dtype fsdpp does not read) and a truncated one under checkpoint.init_from on 3 ranks end with exit 2
# and the reader's message printed once, within seconds, instead of ranks 1-2 waiting in a broadcast.
set -u
fsdpp=$1; mpirun=$2; dir=$3
rm -rf "$dir"; mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }
# A safetensors file: 8-byte little-endian header length, the JSON header, then the data.
write_safetensors() {  # path dtype bytes-of-data-written
  local header="{\"wte.weight\":{\"dtype\":\"$2\",\"shape\":[64,64],\"data_offsets\":[0,$((64 * 64 * 8))]}}"
  local n=${#header}
  printf "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x\\x00\\x00\\x00\\x00' $((n & 255)) $((n >> 8 & 255)) $((n >> 16 & 255)) $((n >> 24 & 255)))" > "$1"
  printf '%s' "$header" >> "$1"
  head -c "$3" /dev/zero >> "$1"
}
write_safetensors "$dir/f64.safetensors" F64 $((64 * 64 * 8))
write_safetensors "$dir/truncated.safetensors" F32 100
for file in f64 truncated; do
  start=$(date +%s)
  out=$(timeout 120 "$mpirun" -n 3 "$fsdpp" train train.steps=2 schedule.warmup_steps=0 train.eval_interval=0 \
          train.global_batch=12 train.micro_batch=4 "checkpoint.init_from=$dir/$file.safetensors" 2>&1)
  rc=$?
  seconds=$(( $(date +%s) - start ))
  echo "$out" | grep -E "^error" | head -3
  [ "$rc" = 2 ] || { echo "$out" | tail -20; fail "$file: exit code $rc, expected 2"; }
  [ "$(echo "$out" | grep -c "^error: .*$file.safetensors")" = 1 ] || fail "$file: the error naming the file is not printed exactly once"
  echo "$file: exit 2 after ${seconds} s"
done
echo "bad init_from: every rank stopped with rank 0's error"
