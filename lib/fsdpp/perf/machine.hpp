#pragma once
// A machine description: what `fsdpp plan --machine` (perf/step_cost.hpp) prices a training step on. Per device:
// GEMM throughput by precision as a function of the GEMM's size (a saturating curve, or measured points), the
// memory bandwidth of the non-GEMM kernels and a fixed cost per kernel; per link class (inside a node, across
// nodes): latency and bus bandwidth of each collective algorithm (ring, tree), or figures measured per
// operation; the node size; the host link for CPU offload. Written as YAML (docs/performance-model.md has the
// reference): the built-in presets are spec-sheet figures, `fsdpp bench calibrate` writes measured ones.
#include "fsdpp/perf/time_events.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fsdpp {


// Achieved TFLOP/s of a GEMM of `flops` (= 2 m n k): peak_tflops * flops / (flops + half_gflop * 1e9). half_gflop
// is the size at which a GEMM reaches half the peak (launch, tail and memory-bound effects of small GEMMs).
struct GemmCurve {
  double peak_tflops = 0;
  double half_gflop = 0;
};

struct GemmPoint {  // a measured GEMM (calibrate)
  std::string precision;  // "f32", "tf32", "bf16"
  std::int64_t m = 0, n = 0, k = 0;
  double tflops = 0;
};

struct LinkFigures {
  double latency_us = 0;
  double busbw_gbs = 0;  // nccl-tests' bus bandwidth, GB/s
};

struct LinkClass {
  LinkFigures ring, tree;
  BesideCompute beside_compute;
  // Measured per operation (calibrate), at the group size it was measured at: used instead of ring/tree, with
  // its latency as the whole fitted intercept.
  std::optional<LinkFigures> all_gather, reduce_scatter, all_reduce;
};

struct Machine {
  int schema = 1;
  std::string name, source, notes;
  int devices_per_node = 8;
  double memory_gib = 0;
  double memory_bandwidth_gbs = 0;
  double kernel_overhead_us = 0;
  GemmCurve f32, tf32, bf16;
  std::vector<GemmPoint> gemm_points;
  LinkFigures host_link;
  LinkClass intra_node, inter_node;
};

// The built-in presets (spec sheets), by name; empty when there is none.
const std::vector<std::string>& machine_preset_names();
std::optional<Machine> machine_preset(const std::string& name);
// A preset name, or a path to a YAML file. UsageError naming the file, line and key, and what to write.
// `what` names the setting in errors ("--machine", "run.machine").
Machine load_machine(const std::string& preset_or_path, const std::string& what = "--machine");
// Parses YAML text; `where` names it in errors (a path, or "preset x").
Machine machine_from_yaml(const std::string& text, const std::string& where);
// The YAML that machine_from_yaml reads back to the same Machine.
std::string to_yaml(const Machine& m);

// --- Costs (seconds). Formulas in docs/performance-model.md and issue24-contract.

// A collective over `ranks` ranks moving `bytes` (the full, unsharded buffer of the operation), on the link class
// intra_node or inter_node (`spans_nodes`). The cheaper of ring and tree for all-reduce; ring otherwise.
// `per_node`: the group's ranks on each node (0: a whole node's devices). Across nodes, a group with fewer ranks
// per node than devices_per_node gets that share of the node's ring/tree bandwidth (its ranks' NICs; the other
// ranks' groups use the rest at the same time); "measured" figures are taken as they are.
double collective_seconds(const Machine& m, CollectiveOp op, std::int64_t bytes, int ranks, bool spans_nodes,
                          int per_node = 0);
// The ranks of a group with `stride` between neighbours that share a node (at most `ranks`).
int group_ranks_per_node(const Machine& m, int stride, int ranks);
// The same, on an explicit algorithm's figures (tests, and the measured override).
double collective_seconds(const LinkFigures& f, CollectiveOp op, std::int64_t bytes, int ranks, bool tree, bool measured);
// Do the ranks base, base + stride, ..., base + (n-1) stride lie on more than one node?
bool group_spans_nodes(const Machine& m, int base, int stride, int ranks);

// A GEMM (m x k) times (k x n) in `precision` ("f32", "tf32", "bf16"), `count` times (batched).
double gemm_seconds(const Machine& m, const std::string& precision, std::int64_t rows, std::int64_t cols,
                    std::int64_t inner, std::int64_t count = 1);
const GemmCurve& gemm_curve(const Machine& m, const std::string& precision);
// A non-GEMM kernel moving `bytes` through device memory.
double kernel_seconds(const Machine& m, double bytes);
// A host<->device copy of `bytes` (CPU offload).
double host_copy_seconds(const Machine& m, std::int64_t bytes);

}  // namespace fsdpp
