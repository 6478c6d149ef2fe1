#!/usr/bin/env python3
"""fsdpp plan --machine (cli_plan_time): the "time" object's contract, ordering properties of the predictions,
--search (only layouts that fit, fastest first), the --ranks scaling table, machine files and their errors.
Properties, not numbers: the figures depend on the presets, which may be refined.

usage: plan_time_check.py FSDPP SOURCE_DIR WORK_DIR
"""
import json
import os
import subprocess
import sys

fsdpp, source, work = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(work, exist_ok=True)
llama8b = os.path.join(source, "input", "llama3-8b.yaml")
small = os.path.join(source, "input", "small.yaml")
failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)


def plan(*args, expect=0):
    r = subprocess.run([fsdpp, "plan", *args], capture_output=True, text=True, timeout=300)
    if r.returncode != expect:
        sys.exit(f"fsdpp plan {' '.join(args)} exited {r.returncode}, expected {expect}:\n{r.stdout}{r.stderr}")
    return r


def plan_json(*args):
    out = plan(*args, "--json").stdout.strip().splitlines()
    return json.loads(out[-1])


def time_of(*args):
    return plan_json(*args)["time"]


# The contract's object, and a sane range for Llama 3 8B on 8 H100 (torchtitan measures 5,762 tokens/s per GPU).
t8 = time_of(llama8b, "--ranks", "8", "--machine", "h100-sxm-8x")
for key in ["ms_per_step", "tokens_per_s_per_device", "tokens_per_s", "mfu", "critical_resource", "exposed_comm_ms",
            "compute_ms", "comm_ms"]:
    check(key in t8, f"time has '{key}'")
check(1000 < t8["tokens_per_s_per_device"] < 20000, f"8B on 8 H100: {t8['tokens_per_s_per_device']:.0f} tokens/s per "
      "device, within 1000..20000")
check(0 < t8["mfu"] < 1, f"MFU {t8['mfu']:.3f} in (0, 1)")
check(abs(t8["tokens_per_s"] - 8 * t8["tokens_per_s_per_device"]) < 1e-6 * t8["tokens_per_s"], "total = 8 x per device")
check("dp_shard" in t8["exposed_comm_ms"], "exposed communication per mesh dimension (dp_shard)")

t64 = time_of(llama8b, "--ranks", "64", "--machine", "h100-sxm-8x")
check(t64["tokens_per_s"] > t8["tokens_per_s"], "more ranks: more tokens/s in total")
check(t64["tokens_per_s_per_device"] <= 1.05 * t8["tokens_per_s_per_device"], "more ranks: no more tokens/s per device")
f32 = time_of(llama8b, "--ranks", "8", "--machine", "h100-sxm-8x", "fsdp.param_dtype=f32")
check(f32["ms_per_step"] > t8["ms_per_step"], "bf16 faster than f32")
blocking = time_of(llama8b, "--ranks", "8", "--machine", "h100-sxm-8x", "comm.overlap=false")
check(t8["ms_per_step"] <= blocking["ms_per_step"], "comm.overlap true not slower than false")
no_prefetch = time_of(llama8b, "--ranks", "8", "--machine", "h100-sxm-8x", "fsdp.forward_prefetch=0",
                      "fsdp.backward_prefetch=0")
check(sum(no_prefetch["exposed_comm_ms"].values()) > sum(t8["exposed_comm_ms"].values()),
      "prefetch 0 exposes more all-gather time")
a100 = time_of(llama8b, "--ranks", "8", "--machine", "a100-sxm-8x")
check(a100["ms_per_step"] > t8["ms_per_step"], "A100 slower than H100")

# The table's section.
table = plan(llama8b, "--ranks", "8", "--machine", "h100-sxm-8x").stdout
check("Predicted time on h100-sxm-8x" in table and "critical resource" in table, "the table has 'Predicted time'")
plain = plan(small, "train.micro_batch=2", "--ranks", "2").stdout
check("add --machine" in plain, "without --machine the table says how to get a prediction")

# A machine file: a preset's figures with slower links predict no faster steps; errors name the file and line.
machine = os.path.join(work, "slow.yaml")
with open(machine, "w") as f:
    f.write("""fsdpp_machine: 1
name: slow-links
source: calibrated
notes: test
devices_per_node: 2
device:
  memory_gib: 0.25
  memory_bandwidth_gbs: 20
  kernel_overhead_us: 5
  gemm:
    f32: {peak_tflops: 0.1, half_gflop: 0.05}
    tf32: {peak_tflops: 0.1, half_gflop: 0.05}
    bf16: {peak_tflops: 0.05, half_gflop: 0.05}
host_link: {bandwidth_gbs: 5, latency_us: 10}
network:
  intra_node:
    ring: {latency_us: 20, busbw_gbs: 2}
    tree: {latency_us: 20, busbw_gbs: 2}
  inter_node:
    ring: {latency_us: 50, busbw_gbs: 0.1}
    tree: {latency_us: 50, busbw_gbs: 0.1}
""")
slow = time_of(small, "train.micro_batch=2", "--ranks", "4", "--machine", machine)
check(slow["critical_resource"].startswith("dp_shard (inter-node)"), f"0.1 GB/s across nodes: the critical resource "
      f"is the link ({slow['critical_resource']})")
bad = os.path.join(work, "bad.yaml")
with open(bad, "w") as f:
    f.write(open(machine).read().replace("  memory_bandwidth_gbs: 20", "  memory_bandwidth: 20"))
r = plan(small, "train.micro_batch=2", "--ranks", "4", "--machine", bad, expect=2)
check("bad.yaml:" in r.stdout + r.stderr and "memory_bandwidth_gbs" in r.stdout + r.stderr,
      "a bad machine file: the file, line and key")
r = plan(small, "train.micro_batch=2", "--ranks", "4", "--machine", "no-such-machine", expect=2)
check("neither a preset" in r.stdout + r.stderr, "an unknown --machine names the presets")
r = plan("--list-machines")
check(all(p in r.stdout for p in ["a100-sxm-8x", "h100-sxm-8x", "h200-sxm-8x"]), "--list-machines lists the presets")

# --search: only layouts that fit, fastest first; 0.25 GiB leaves some out.
found = plan_json(small, "--ranks", "4", "--machine", machine, "--search")
rows = found["best"]
check(len(rows) >= 2, f"--search found {found['fitting_layouts']} fitting layouts")
check(all(r["bytes_per_rank"] <= 0.25 * 2**30 for r in rows), "every layout shown fits in the device memory")
ms = [r["time"]["ms_per_step"] for r in rows]
check(ms == sorted(ms), "fastest first")
roomy = plan_json(small, "--ranks", "4", "--machine", "h100-sxm-8x", "--search")
check(roomy["fitting_layouts"] > found["fitting_layouts"], "more memory: more layouts fit")
text = plan(small, "--ranks", "4", "--machine", "h100-sxm-8x", "--search").stdout
check("why #1:" in text, "the search says why the best wins")
# Pipelines take part: with links across nodes 100x slower still, one stage per node (activations between the
# nodes, every gradient reduction inside one) beats the data-parallel layouts, whose reductions cross them.
crawl = os.path.join(work, "crawl.yaml")
with open(crawl, "w") as f:
    f.write(open(machine).read().replace("busbw_gbs: 0.1}", "busbw_gbs: 0.001}").replace("memory_gib: 0.25",
                                                                                          "memory_gib: 4"))
best = plan_json(small, "--ranks", "4", "--machine", crawl, "--search")["best"]
check("mesh.pp=2" in best[0]["overrides"], f"--search with slow links across nodes picks a pipeline across them "
      f"({best[0]['layout']})")
priced = time_of(small, "--ranks", "4", "--machine", crawl, *best[0]["overrides"])
check(priced["comm_bytes_by_dim"]["pp"] > 0 and priced["link_by_dim"]["pp"] == "inter-node" and
      priced["link_by_dim"].get("dp_shard", "intra-node") == "intra-node",
      "its plan sends pipeline messages across the nodes and reduces gradients inside them")

# --ranks list: one row per count, in order, total tokens/s growing.
scaling = plan_json(llama8b, "train.global_batch=512", "--ranks", "8,64,512", "--machine", "h100-sxm-8x")["scaling"]
check([row["ranks"] for row in scaling] == [8, 64, 512], "one scaling row per rank count")
totals = [row["time"]["tokens_per_s"] for row in scaling]
check(totals == sorted(totals), "scaling: total tokens/s grows with ranks")

if failures:
    sys.exit(f"plan_time_check: {len(failures)} failure(s)")
print("plan_time_check: the time object, ordering properties, search, scaling and machine files hold")
