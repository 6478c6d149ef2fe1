#pragma once
// Memory before allocation: `fsdpp train` and `fsdpp init` ask the planner (plan/memory_plan.hpp) what a rank
// will need and stop, before anything big is allocated, when a rank does not have it: a UsageError on every
// rank with the planner's verdict and the largest micro-batch that fits, instead of a bad_alloc, an OOM kill
// or a CUDA out-of-memory part-way through the first step.
//
// What a rank has: on host builds, the node's MemAvailable (/proc/meminfo) divided by the job's ranks on that
// node (MPI_COMM_TYPE_SHARED); on CUDA builds, the free memory of the rank's GPU divided by the ranks sharing
// it. The smallest over the job is what every rank compares against.
#include "fsdpp/config/deck.hpp"
#include "fsdpp/plan/memory_plan.hpp"

#include <mpi.h>

#include <cstdint>
#include <optional>
#include <string>

namespace fsdpp {

struct MemoryAvailable {
  std::int64_t bytes_per_rank = 0;  // the smallest over the job
  std::string source;               // "MemAvailable 21.90 GiB seen by rank 0, shared by 2 rank(s)"
};

// Collective over `world`. nullopt when this system cannot say (no /proc/meminfo).
std::optional<MemoryAvailable> memory_available_per_rank(MPI_Comm world);

enum class MemoryUse {
  training,  // the whole plan: model states, unsharded units, activations at the step's peak
  init,      // fsdpp init: the sharded parameters and one gathered unit
};

// Collective over `world`: plans `deck` on the job's ranks (the planner's UsageError for a deck that cannot
// run) and throws a UsageError on every rank when the plan needs more than a rank has. The message names what
// was needed, what was available and where that figure comes from, the largest micro-batch that fits, and
// FSDPP_MEMORY_CHECK=0 to skip the check.
void check_memory_before_allocation(MPI_Comm world, const Deck& deck, MemoryUse use);

// Collective: false when rank 0's environment has FSDPP_MEMORY_CHECK=0 (or false, off, no): the user knows better.
bool memory_check_enabled(MPI_Comm world);

}  // namespace fsdpp
