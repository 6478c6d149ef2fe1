#!/usr/bin/env bash
# Every Kokkos kernel fsdpp launches has a label "fsdpp::<what>" of its own (docs/stack-notes.md §2.1): the
# labels are what Kokkos Tools and nsys show, so a missing or reused one makes a profile ambiguous.
#   1. Static: every parallel_for / parallel_reduce / parallel_scan but the nested team-level ones (and every
#      for_each_index / reduce_over_index, tensor/offload.hpp's wrappers that launch on the host or the device) under lib/ and app/ has a string-literal
#      label of the form fsdpp::<lower_snake_case>, used at no other launch site. Offenders are printed as
#      file:line.
#   2. Runtime: a real `fsdpp train` on 2 ranks (AdamW, bf16 all-gathers, clipping, evaluation, a checkpoint;
#      then SGD from that checkpoint with unsharded accumulation) runs with a Kokkos Tools library that records
#      every kernel launched. Each name must be one of the labels found in step 1, or Kokkos' own ("Kokkos::",
#      e.g. deep_copy's fills); an unlabelled kernel would show up under its functor's type name. The second run
#      checkpoints activations, and the Kokkos regions of the timeline (observe/timeline.hpp) must show up too:
#      each unit's forward and backward, a block's recompute, the optimizer.
# Usage: kernel_labels.sh <source dir> <fsdpp> <mpiexec> <kernel_names_tool.so> <work dir>
set -u
src=$1; fsdpp=$2; mpirun=$3; tool=$4; work=$5
status=0

# ---- 1. static scan ----
labels=$(mktemp)
trap 'rm -f "$labels"' EXIT
find "$src/lib" "$src/app" -type f \( -name '*.cpp' -o -name '*.hpp' -o -name '*.h' -o -name '*.cu' \) | sort |
  xargs awk -v root="$src/" '
    function where(line) { f = FILENAME; sub("^" root, "", f); return f ":" line }
    function check(rest, line) {
      sub(/^[ \t]*/, "", rest)
      # The launch wrappers of tensor/offload.hpp: their definitions, and the label they forward.
      if (rest ~ /^const char\*/ || (FILENAME ~ /tensor\/offload\.hpp$/ && rest ~ /^label,/)) return
      # Nested loops inside a team kernel (TeamThreadRange, ThreadVectorRange, ...) launch nothing.
      if (rest ~ /^(Kokkos::)?(TeamThreadRange|ThreadVectorRange|TeamVectorRange)[ \t]*\(/) return
      if (rest !~ /^"[^"]*"/) { print "BAD " where(line) ": no string-literal label (unlabelled, or a label built at run time)"; return }
      match(rest, /^"[^"]*"/)
      label = substr(rest, 2, RLENGTH - 2)
      if (label !~ /^fsdpp::[a-z0-9_]+$/) print "BAD " where(line) ": label \"" label "\" is not fsdpp::<lower_snake_case>"
      else print "LABEL " label " " where(line)
    }
    FNR == 1 { pending = 0 }
    {
      code = $0
      if (pending) {
        pending = 0
        check(code, pending_line)
      }
      sub(/\/\/.*/, "", code)  # comments mention parallel_for too; labels never contain "//"
      while (match(code, /(parallel_(for|reduce|scan)|for_each_index|reduce_over_index)[ \t]*\(/)) {
        rest = substr(code, RSTART + RLENGTH)
        code = rest
        if (rest ~ /^[ \t]*$/) { pending = 1; pending_line = FNR } else check(rest, FNR)
      }
    }' > "$labels"
sites=$(grep -c '^LABEL ' "$labels")
if grep -q '^BAD ' "$labels"; then
  grep '^BAD ' "$labels" | sed 's/^BAD /FAIL: /'
  status=1
fi
dups=$(grep '^LABEL ' "$labels" | awk '{ print $2 }' | sort | uniq -d)
for d in $dups; do
  echo "FAIL: label \"$d\" is used at more than one launch site:"
  grep "^LABEL $d " "$labels" | awk '{ print "  " $3 }'
  status=1
done
echo "static scan: $sites labelled kernel launch sites under lib/ and app/"
[ "$sites" -gt 10 ] || { echo "FAIL: the scan found implausibly few kernel launches"; status=1; }

# ---- 2. runtime: the kernels a short training really launches ----
rm -rf "$work"
mkdir -p "$work/names"
export FSDPP_KERNEL_NAMES_DIR="$work/names" KOKKOS_TOOLS_LIBS="$tool" KOKKOS_PROFILE_LIBRARY="$tool"
common="train.global_batch=8 train.micro_batch=2 schedule.warmup_steps=1 log.interval=1"
if ! "$mpirun" -n 2 "$fsdpp" train $common train.steps=4 train.eval_interval=2 train.grad_clip=0.5 \
       fsdp.param_dtype=bf16 checkpoint.dir="$work/ckpt" checkpoint.interval=4 "run.output=$work/run1" > "$work/run1.log" 2>&1 ||
   ! "$mpirun" -n 2 "$fsdpp" train $common train.steps=2 train.eval_interval=0 optim.name=sgd fsdp.accumulate=unsharded \
       train.activation_checkpointing=full checkpoint.init_from="$work/ckpt/step_00000004.h5" "run.output=$work/run2" \
       > "$work/run2.log" 2>&1; then
  echo "FAIL: fsdpp train did not run:"; tail -20 "$work"/run*.log
  exit 1
fi
files=("$work"/names/kernels.*)
[ "${#files[@]}" -ge 4 ] && [ -s "${files[0]}" ] || {
  echo "FAIL: the Kokkos Tools library recorded nothing (loaded with KOKKOS_TOOLS_LIBS / KOKKOS_PROFILE_LIBRARY?)"
  exit 1
}
seen=$(cat "${files[@]}" | sort -u)
ours=0
for region in "fsdpp::forward h.0" "fsdpp::backward h.0" "fsdpp::forward GPT (root)" "fsdpp::recompute h.1" \
              "fsdpp::optimizer" "fsdpp::data" "fsdpp::grad_sync" "fsdpp::eval" "fsdpp::checkpoint"; do
  grep -qxF "region $region" <<< "$seen" || { echo "FAIL: no Kokkos region \"$region\" was pushed"; status=1; }
done
echo "regions: $(grep -c '^region ' <<< "$seen") distinct Kokkos regions pushed"
while read -r kind name; do
  if [[ "$kind" == region || "$name" == Kokkos::* ]]; then continue; fi
  if awk -v n="$name" '$1 == "LABEL" && $2 == n { found = 1 } END { exit !found }' "$labels"; then
    ours=$((ours + 1))
    continue
  fi
  echo "FAIL: $kind \"$name\" was launched during training but is not an fsdpp:: label found in lib/ or app/"
  status=1
done <<< "$seen"
echo "runtime: $ours distinct fsdpp:: kernels launched by 2 training runs on 2 ranks; the others are Kokkos' own:"
grep -v ' fsdpp::' <<< "$seen" | grep -v '^region ' | sed 's/ \[.*//' | sort | uniq -c | sed 's/^ */  /'
[ "$ours" -ge 15 ] || { echo "FAIL: implausibly few fsdpp kernels recorded"; status=1; }
[ $status -eq 0 ] && echo "kernel labels OK"
exit $status
