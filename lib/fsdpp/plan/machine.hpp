#pragma once
// A machine description: what `fsdpp plan --machine` (plan/step_cost.hpp) prices a training step on. Per device:
// GEMM throughput by precision as a function of the GEMM's size (a saturating curve, or measured points), the
// memory bandwidth of the non-GEMM kernels and a fixed cost per kernel; per link class (inside a node, across
// nodes): latency and bus bandwidth of each collective algorithm (ring, tree), or figures measured per
// operation; the node size; the host link for CPU offload. Written as YAML (docs/performance-model.md has the
// reference): the built-in presets are spec-sheet figures, `fsdpp bench calibrate` writes measured ones.
#include "fsdpp/fsdp/time_events.hpp"

#include <cstdint>
#include <map>
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

// A kernel family's own speed, forward and backward, in the model's count of its bytes (step_cost.cpp; backward at
// kBackwardBytesPerForwardByte times the forward's bytes), where it differs from the other non-GEMM kernels (on a
// CPU core: bound by exp, or by nothing but memory).
struct KernelRate {
  double forward_gbs = 0, backward_gbs = 0;
};

// The families a machine may give rates for (device.kernels), as the performance model prices them: the MLP's
// activation (GPT-2's gelu, SwiGLU) and the attention softmax over materialized scores.
const std::vector<std::string>& kernel_family_names();
// The model's count of a family's forward bytes per element (f32): gelu reads its input and writes its output (8);
// SwiGLU reads gate and up and writes their product (12, per output); the softmax reads each score for the row's
// maximum and for its sum and writes the probability (12). calibrate counts the kernels it times the same way.
double kernel_family_bytes_per_element(const std::string& family);

struct Machine {
  int schema = 1;
  std::string name, source, notes;
  int devices_per_node = 8;
  double memory_gib = 0;
  double memory_bandwidth_gbs = 0;
  // The non-GEMM kernels of backward passes, in the model's count of their bytes (kBackwardBytesPerForwardByte
  // times their forward's): optional, 0 when absent (then memory_bandwidth_gbs). Calibrate measures it, because on
  // a CPU core a forward kernel can be bound by exp where its backward is not (softmax: the probabilities are
  // stored), and the same bytes then take different times.
  double backward_bandwidth_gbs = 0;
  // The optimizer step (the gradient norm, then the update), in the model's count of its bytes (step_cost.hpp,
  // optimizer_passes): optional, 0 when absent (then memory_bandwidth_gbs). On a CPU core the norm's
  // double-precision sum is bound by its additions' latency, not by memory.
  double optimizer_bandwidth_gbs = 0;
  std::map<std::string, KernelRate> kernels;  // optional (calibrate), by kernel_family_names(); absent: as the rest
  double kernel_overhead_us = 0;
  GemmCurve f32, tf32, bf16;
  std::vector<GemmPoint> gemm_points;
  // The BLAS threads each rank used when the GEMMs were measured (calibrate; 0: not said, as in the presets). A
  // run with another count gets other GEMM rates: blas_threads_mismatch says so.
  int blas_threads_per_rank = 0;
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
// One message of `bytes` from a rank to another (a pipeline stage's activations or their gradient): priced as an
// all-gather of two ranks, in which each rank sends its half to the other, so measured figures serve too.
double point_to_point_seconds(const Machine& m, std::int64_t bytes, bool spans_nodes, int per_node = 0);
// The ranks of a group with `stride` between neighbours that share a node (at most `ranks`).
int group_ranks_per_node(const Machine& m, int stride, int ranks);
// The same, on an explicit algorithm's figures (tests, and the measured override).
double collective_seconds(const LinkFigures& f, CollectiveOp op, std::int64_t bytes, int ranks, bool tree, bool measured);
// Do the ranks base, base + stride, ..., base + (n-1) stride lie on more than one node?
bool group_spans_nodes(const Machine& m, int base, int stride, int ranks);

// A GEMM (m x k) times (k x n) in `precision` ("f32", "tf32", "bf16"), `count` times (batched). Without
// gemm_points of the precision: the curve (GemmCurve). With them:
//  - points that form a full grid (every combination of their distinct m, n and k values; calibrate writes one,
//    plan/calibrate.hpp): the TFLOP/s interpolated linearly in (log m, log n, log k) between the eight grid points
//    around the shape (trilinear); a coordinate outside the grid is clamped to its edge, so a larger or smaller
//    GEMM runs at the edge's rate. Between two points the rate lies between theirs: no overshoot.
//  - scattered points (files written before the grid): the nearest point in (log m, log n, log k).
double gemm_seconds(const Machine& m, const std::string& precision, std::int64_t rows, std::int64_t cols,
                    std::int64_t inner, std::int64_t count = 1);
const GemmCurve& gemm_curve(const Machine& m, const std::string& precision);
// A non-GEMM kernel moving `bytes` through device memory.
double kernel_seconds(const Machine& m, double bytes);
// The performance model counts a backward kernel's bytes as this many times its forward's (it reads the forward's
// inputs and the output gradient and writes the input gradient); calibrate counts the backward kernels it times
// the same way, so that backward_bandwidth_gbs is in the model's units.
inline constexpr double kBackwardBytesPerForwardByte = 2;
// The bandwidth a pass's non-GEMM kernels run at: backward_bandwidth_gbs where given, else memory_bandwidth_gbs.
// With a family (kernel_family_names()): its own rate where the machine has one, else the same.
double elementwise_bandwidth_gbs(const Machine& m, bool backward, const std::string& family = "");
// What to tell the user when a run's BLAS threads per rank (`run_threads`) differ from those the machine's GEMMs
// were measured with: a warning naming both counts and OPENBLAS_NUM_THREADS, or "" when they agree or either is
// unknown (0). `what` names the machine setting ("--machine", "run.machine").
std::string blas_threads_mismatch(const Machine& m, int run_threads, const std::string& what);
// A host<->device copy of `bytes` (CPU offload).
double host_copy_seconds(const Machine& m, std::int64_t bytes);

}  // namespace fsdpp
