#!/usr/bin/env bash
# The virtual cluster itself (tests/cluster/vcluster):
#  - where namespaces cannot be made (here: without CAP_SYS_ADMIN and CAP_NET_ADMIN) `up` refuses in one line,
#    exit 77 (ctest: skipped);
#  - `up --nodes 2` starts within seconds; each node has its own hostname and address; Slurm sees both idle;
#  - `down` removes everything `up` made (namespaces, links, bridge, daemons, namespace handles, the folder);
#    so does a test that fails after `up` (lib.sh's trap), and an `up` that fails half-way;
#  - `--nodes 4 --link-rate 20mbit`: 4 nodes; a transfer out of a node takes at least its size over the rate,
#    where the same transfer on an unshaped link is several times faster;
#  - `--pin`: each node's tasks on cores of their own; refused with fewer cores than nodes.
set -u
root=$1; fsdpp=$2; work=$3
rm -rf "$work"; mkdir -p "$work"
# shellcheck source=tests/cluster/lib.sh
. "$root/tests/cluster/lib.sh"
W=$FSDPP_VCLUSTER_DIR

# Nothing of a vcluster left on this machine: no namespace, link, bridge, daemon, mount or folder.
nothing_left() {  # what, daemon PIDs
  local what=$1; shift
  ip netns list | grep -q "^fvc-" && fail "$what: a namespace is left: $(ip netns list | grep "^fvc-")"
  ip -o link show | grep -q "fvc-" && fail "$what: a link is left: $(ip -o link show | grep -o "fvc-[a-z0-9]*" | sort -u)"
  for pid in "$@"; do kill -0 "$pid" 2>/dev/null && fail "$what: daemon $pid still runs"; done
  grep -q "$W" /proc/mounts && fail "$what: a namespace handle is still mounted under $W"
  [ -e "$W" ] && fail "$what: $W is left"
  echo "$what: nothing left"
}
daemons() { cat "$W"/run/*.pid 2>/dev/null; }

# 1. Refusal without the capabilities namespaces need.
out=$(setpriv --bounding-set=-sys_admin,-net_admin "$V" up --nodes 2 2>&1); rc=$?
echo "$out"
[ "$rc" = 77 ] || fail "up without CAP_SYS_ADMIN/CAP_NET_ADMIN exited $rc, expected 77"
[ "$(echo "$out" | wc -l)" = 1 ] && grep -q "^vcluster: SKIPPED: cannot make network namespaces here" <<< "$out" \
  || fail "the refusal is not one clear line"

# 2. Two nodes, their names and addresses, Slurm's view; the startup time.
cluster_up 2
took=$(grep -Eo "up in [0-9.]+ s" "$work/vcluster-up.log" | grep -Eo "[0-9.]+")
awk -v t="$took" 'BEGIN {exit !(t < 10)}' || fail "startup took $took s"
for k in 1 2; do
  [ "$("$V" exec "node$k" hostname)" = "node$k" ] || fail "node$k: wrong hostname"
  "$V" exec "node$k" ip -4 -o addr show eth0 | grep -q "inet 10.213.22.1$k/24" || fail "node$k: wrong address"
  "$V" exec "node$k" ip route | grep -q "^default" && fail "node$k: has a default route"
done
[ "$(sinfo -h -N -o '%N %t' | tr '\n' ' ')" = "node1 idle node2 idle " ] || fail "Slurm does not see node1 and node2 idle"
[ "$(srun -N2 --ntasks-per-node=1 hostname | sort | tr '\n' ' ')" = "node1 node2 " ] || fail "srun across the nodes"
"$V" status
pids=$(daemons)
"$V" down
trap - EXIT
nothing_left "down" $pids

# 3. A test that fails after up: lib.sh's trap brings everything down.
(cluster_up 2; fail "a deliberate failure after up") > "$work/failing-test.log" 2>&1
grep -q "FAIL: a deliberate failure after up" "$work/failing-test.log" || { cat "$work/failing-test.log"; fail "the failing test did not run"; }
nothing_left "a test that failed after up"

# 4. An up that fails half-way (after node2's namespace) removes what it made.
FSDPP_VCLUSTER_TEST_FAIL=node2 "$V" up --nodes 3 > /dev/null 2> "$work/half-way.log" && fail "the half-way fault did not fail up"
cat "$work/half-way.log"
nothing_left "an up that failed half-way"

# 5. Four nodes with shaped links: a transfer out of node4 (8 MB through Slurm's I/O forwarding) against the rate.
cluster_up 2
start=$(date +%s%N)
srun -N1 -w node2 head -c 8000000 /dev/zero | wc -c > "$work/unshaped.count"
unshaped=$((($(date +%s%N) - start) / 1000000))
"$V" down
trap - EXIT
out=$("$V" up --nodes 4 --link-rate 20mbit 2> "$work/vcluster-up.log") || { cat "$work/vcluster-up.log"; fail "up --nodes 4 --link-rate 20mbit"; }
cat "$work/vcluster-up.log"
trap '"$V" down' EXIT
eval "$out"
[ "$(sinfo -h -N -o %t | grep -c idle)" = 4 ] || fail "4 nodes are not idle"
tc class show dev fvc-n4 | grep -q "htb 1:10 .*rate 20Mbit" || fail "fvc-n4 is not shaped"
start=$(date +%s%N)
srun -N1 -w node4 head -c 8000000 /dev/zero | wc -c > "$work/shaped.count"
shaped=$((($(date +%s%N) - start) / 1000000))
[ "$(cat "$work/shaped.count")" = 8000000 ] && [ "$(cat "$work/unshaped.count")" = 8000000 ] || fail "the transfers lost bytes"
bound=$((8000000 * 8 / 20000))  # ms at 20 Mbit/s
echo "8 MB out of a node: ${unshaped} ms unshaped, ${shaped} ms at 20 Mbit/s (at least ${bound} ms)"
[ "$shaped" -ge $((bound * 9 / 10)) ] || fail "the shaped transfer took $shaped ms, less than 8 MB at 20 Mbit/s"
[ "$unshaped" -lt $((shaped / 2)) ] || fail "the unshaped transfer ($unshaped ms) is not clearly faster than the shaped one"
pids=$(daemons)
"$V" down
trap - EXIT
nothing_left "4 shaped nodes" $pids
# 6. --pin: each node's tasks run on cores of their own (the allowed cores split among the nodes); refused in one
#    line with fewer cores than nodes.
out=$(taskset -c 0 "$V" up --nodes 2 --pin 2>&1) && fail "up --nodes 2 --pin on one core was not refused"
echo "$out" | grep -q "^vcluster: --pin needs a core per node: 2 nodes, 1 core(s) here" || fail "the --pin refusal: $out"
nothing_left "a refused --pin"
out=$(taskset -c 0,1 "$V" up --nodes 2 --pin 2> "$work/vcluster-up.log") || { cat "$work/vcluster-up.log"; fail "up --pin"; }
trap '"$V" down' EXIT
eval "$out"
srun -N2 --ntasks-per-node=2 bash -c 'echo "$(hostname) $(awk "/^Cpus_allowed_list/ {print \$2}" /proc/self/status)"' \
  | sort -u > "$work/pinned"
cat "$work/pinned"
[ "$(tr '\n' ' ' < "$work/pinned")" = "node1 0 node2 1 " ] || fail "--pin: the nodes' tasks are not on cores 0 and 1"
"$V" down
trap - EXIT
nothing_left "2 pinned nodes"
echo "vcluster: refuses without the capabilities, up in $took s, hostnames and addresses per node, everything removed" \
     "by down, after a failed test and after a failed up; 4 nodes; links shaped; --pin gives each node its own cores"
