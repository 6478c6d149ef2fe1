#pragma once
// Calibration's measuring and fitting (`fsdpp bench calibrate`, app/bench_calibrate.cpp, is the command-line
// wiring): the GEMM grid (plan/calibrate_gemm.cpp), fsdpp's own non-GEMM kernels and the host link
// (plan/calibrate_kernels.cpp), the collectives on every group layout (plan/calibrate_collectives.cpp). Each fills
// its part of a Machine (plan/machine.hpp). Everything is measured with every rank busy at once: where ranks share
// cores, sockets or links, a rank's throughput under that contention is what a training run of the same launch
// gets. All functions taking `world` are collective over it.
#include "fsdpp/config/deck_enums.hpp"
#include "fsdpp/fsdp/time_events.hpp"  // BesideCompute
#include "fsdpp/plan/line_fit.hpp"
#include "fsdpp/plan/machine.hpp"
#include "fsdpp/tensor/matmul.hpp"

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace fsdpp {

// How long calibration measures: `quick` is the CI's short sweep.
struct CalibrationEffort {
  bool quick = false;
  int repeats() const { return quick ? 3 : 5; }           // timed repeats of a kernel or collective
  double target_s() const { return quick ? 0.0 : 0.05; }  // seconds a timed repeat lasts (calls looped)
  // Sweeps over the whole GEMM grid, each shape's figure the median of its sweeps': a disturbance lasting seconds
  // (another process, a virtual machine's neighbour) then spoils one sweep's figures of the shapes it hits, not
  // every repeat of them. Measured here: 2-rank calibrations whose four 2048-row shapes came out at half speed.
  int gemm_sweeps() const { return 3; }
  int gemm_repeats() const { return quick ? 1 : 2; }       // per sweep
  double gemm_target_s() const { return quick ? 0.002 : 0.004; }  // small shapes looped to this long
};

// Rank 0 reports progress on stderr (stdout is the machine YAML).
void calibration_progress(MPI_Comm world, const std::string& line);

// The median of this rank's seconds per call of `run`, then the median over the ranks of `world`; all ranks
// start each repeat together (a barrier). Calls are looped so that a repeat lasts about `target_s`; `finish`
// (a fence) ends each repeat.
double seconds_all_busy(MPI_Comm world, int repeats, double target_s, const std::function<void()>& run,
                        const std::function<void()>& finish);
// The median over the ranks of `world` of each rank's `value` (two ranks: their mean).
double median_over_ranks(MPI_Comm world, double value);
// Node identity of every rank (MPI_Get_processor_name, gathered): node_of[r] is a small integer.
std::vector<int> node_of_ranks(MPI_Comm world);
// Four significant digits: calibration noise is far above that. What the machine file records.
double sig4(double x);

// --- GEMM (plan/calibrate_gemm.cpp)

// The sizes each of m, n and k of the GEMM grid takes: powers of 2 from 16 (a small model's head size: the
// attention products' thin side) to 1024; the grid is every (m, n, k) of them. Larger dimensions are priced at the
// rate of the grid's edge (machine.hpp, gemm_seconds), where a CPU core's or a GPU's rate has long levelled off
// for these sizes' neighbours; smaller ones likewise.
const std::vector<int>& gemm_grid_sizes();
// Measures the grid in each of `precisions` (gemm_points; each (m, n, k) the mean over the three products of a
// linear layer: forward N,T, input gradient N,N, weight gradient T,N, accumulating), fits each precision's curve
// to its points, and fits the curves of the other precisions to a few grid shapes. Records blas_threads().
void calibrate_gemm(MPI_Comm world, const std::vector<GemmPrecision>& precisions, const CalibrationEffort& effort,
                    Machine& machine);

// --- Non-GEMM kernels and the host link (plan/calibrate_kernels.cpp)

// The sizes the kernels are timed at: rows of `C` values for the norms and activations, `T` x `T` score matrices
// for the softmax; `sizes` values per call, the first a few rows (the per-kernel overhead), the others activation
// sizes (tokens x C and x 4C) that live in memory, not in cache, as training's do.
struct KernelShape {
  int C = 0, T = 0;
  std::vector<std::int64_t> sizes;
};
// The shape for a model of width `C`, context `T` and `tokens` per micro-batch: the activations at least 2^18 and
// 2^20 values, so that a tiny deck (the default) still measures the rates of sizes that leave the cache.
KernelShape kernel_shape(int C, int T, std::int64_t tokens);
// memory_bandwidth_gbs and kernel_overhead_us (the norms forward and the AdamW update, fitted to overhead + bytes /
// bandwidth), backward_bandwidth_gbs, optimizer_bandwidth_gbs and the kernel families' rates.
void calibrate_kernels(MPI_Comm world, const KernelShape& shape, const CalibrationEffort& effort, Machine& machine);
// host_link: a host <-> device copy (on host builds, a copy between two host buffers), latency and bandwidth.
void calibrate_host_link(MPI_Comm world, const CalibrationEffort& effort, Machine& machine);

// --- Collectives (plan/calibrate_collectives.cpp)

struct CollectiveFit {
  std::string op;  // all_gather | reduce_scatter | all_reduce
  double latency_us = 0, busbw_gbs = 0;
  int points = 0;   // (group size, bytes) pairs the fit used
  std::vector<int> group_sizes;
};
// Compute beside a collective of this class, as training overlaps them (plan/machine.hpp, BesideCompute):
// how much longer each takes while the other runs; 0 where nothing overlaps (blocking collectives).
struct BesideComputeFit {
  BesideCompute slows;
  std::size_t bytes = 0;  // the all-gather measured (full buffer); 0: not measured
};
struct LinkClassFits {
  std::string link_class;  // intra_node | inter_node
  std::vector<CollectiveFit> ops;
  BesideComputeFit beside_compute;  // measured on the class's largest group
};

struct CollectiveOptions {
  std::vector<std::size_t> bytes;  // full (unsharded) buffer sizes of the sweep
  int repeats = 5;
  double target_s = 0.02;
  double max_call_s = 0.5;  // a size whose one call takes longer ends that operation's sweep (shaped links)
  CommBackendChoice backend = CommBackendChoice::automatic;  // the deck's comm.backend: what training uses
  bool overlap = true;  // the deck's comm.overlap: collectives through the communicator's thread, as training
};

// Every group layout a device mesh of this world can have (for each group size g dividing the world: groups of
// consecutive ranks, as a mesh's last dimension, and strided groups, as its first), each collective across the
// sweep, all groups of a layout at once; fitted per link class to latency + bytes * factor / busbw (the
// contract of docs/performance-model.md). Link classes with no layout are absent.
std::vector<LinkClassFits> measure_collectives(MPI_Comm world, const std::vector<int>& node_of,
                                               const CollectiveOptions& options);
// The machine's network from the fits: ring and tree are the fitted all_reduce, `measured` each operation's; a
// class the launch had no group of gets the other's figures (or, with none, the host copy's) and `notes` says so.
void set_network(Machine& machine, const std::vector<LinkClassFits>& fits);

}  // namespace fsdpp
