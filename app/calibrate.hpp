#pragma once
// fsdpp bench calibrate: the measuring parts shared by its files (app/bench_calibrate.cpp: the command, GEMM
// and kernel measurements, the YAML; app/calibrate_collectives.cpp: the collectives on each group layout).
// Everything is measured with every rank busy at once: where ranks share cores, sockets or links, a rank's
// throughput under that contention is what a training run of the same launch gets.
#include "fsdpp/config/deck_enums.hpp"
#include "fsdpp/plan/line_fit.hpp"
#include "fsdpp/runtime/median.hpp"
#include "fsdpp/fsdp/time_events.hpp"  // BesideCompute

#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

namespace fsdpp::app::calibrate {

using fsdpp::LineFit;            // fsdpp/plan/line_fit.hpp
using fsdpp::fit_line_relative;

// The median of this rank's seconds per call of `run`, then the median over the ranks of `world`; all ranks
// start each repeat together (a barrier). Calls are looped so that a repeat lasts about `target_s`; `finish`
// (a fence) ends each repeat. Collective over `world`.
double seconds_all_busy(MPI_Comm world, int repeats, double target_s, const std::function<void()>& run,
                        const std::function<void()>& finish);

// The median over the ranks of `world` of each rank's `value` (two ranks: their mean). Collective over `world`.
double median_over_ranks(MPI_Comm world, double value);

// Node identity of every rank (MPI_Get_processor_name, gathered): node_of[r] is a small integer.
std::vector<int> node_of_ranks(MPI_Comm world);

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
// contract of docs/performance-model.md). Link classes with no layout are absent. Collective over `world`.
std::vector<LinkClassFits> measure_collectives(MPI_Comm world, const std::vector<int>& node_of,
                                               const CollectiveOptions& options);

}  // namespace fsdpp::app::calibrate
