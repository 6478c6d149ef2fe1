#include "fsdpp/plan/memory_check.hpp"

#include "fsdpp/runtime/collective_errors.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/tensor/types.hpp"

#include <Kokkos_Core.hpp>

#ifdef FSDPP_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <type_traits>

namespace fsdpp {
namespace {

// MemAvailable from /proc/meminfo, in bytes; -1 when there is none (not Linux, or a kernel before 3.14).
std::int64_t host_mem_available() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string key, unit;
    std::int64_t kib = -1;
    words >> key >> kib >> unit;
    if (key == "MemAvailable:" && kib >= 0) return kib * 1024;
  }
  return -1;
}

// The compute memory this rank can use and which device it is: host memory, or (CUDA builds computing on a
// GPU) the free memory of this rank's GPU. `device` is -1 for the host.
std::int64_t compute_memory_free(int& device, std::string& what) {
  device = -1;
#if defined(FSDPP_HAVE_CUDA) && defined(KOKKOS_ENABLE_CUDA)
  if constexpr (!std::is_same_v<ExecSpace::memory_space, Kokkos::HostSpace>) {
    std::size_t free = 0, total = 0;
    if (cudaGetDevice(&device) == cudaSuccess && cudaMemGetInfo(&free, &total) == cudaSuccess) {
      what = fmt::format("cuda:{} free", device);
      return static_cast<std::int64_t>(free);
    }
    cudaGetLastError();
    device = -1;
    return -1;
  }
#endif
  what = "MemAvailable";
  return host_mem_available();
}

}  // namespace

std::optional<MemoryAvailable> memory_available_per_rank(MPI_Comm world) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  int device = -1;
  std::string what;
  const std::int64_t free = compute_memory_free(device, what);
  // The ranks that share this memory: on the host, the job's ranks on this node; on a GPU, those on this GPU.
  MPI_Comm node = MPI_COMM_NULL, sharing = MPI_COMM_NULL;
  FSDPP_MPI_CHECK(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  FSDPP_MPI_CHECK(MPI_Comm_split(node, device + 1, rank, &sharing));
  int sharers = 1;
  MPI_Comm_size(sharing, &sharers);
  MPI_Comm_free(&sharing);
  MPI_Comm_free(&node);
  // A rank that cannot say makes the answer unknown; otherwise the tightest rank decides.
  int unknown = free < 0 ? 1 : 0;
  FSDPP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &unknown, 1, MPI_INT, MPI_MAX, world));
  if (unknown) return std::nullopt;
  struct {
    double bytes;
    int rank;
  } tightest{static_cast<double>(free / sharers), rank};
  FSDPP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &tightest, 1, MPI_DOUBLE_INT, MPI_MINLOC, world));
  MemoryAvailable out;
  out.bytes_per_rank = static_cast<std::int64_t>(tightest.bytes);
  out.source = broadcast_string(world,
                                fmt::format("{} {} seen by rank {}, shared by {} rank(s)", what, bytes_text(free), rank,
                                            sharers),
                                tightest.rank);
  return out;
}

bool memory_check_enabled(MPI_Comm world) {
  int enabled = 1;
  if (const char* v = std::getenv("FSDPP_MEMORY_CHECK")) {
    const std::string s = v;
    enabled = !(s == "0" || s == "false" || s == "off" || s == "no");
  }
  // Rank 0's choice, so that every rank takes the same path even when the launcher did not pass the variable on.
  FSDPP_MPI_CHECK(MPI_Bcast(&enabled, 1, MPI_INT, 0, world));
  return enabled != 0;
}

namespace {
std::string what_is_needed(MemoryUse use, const MemoryPlan& plan) {
  if (use == MemoryUse::init) return "sharded parameters and one gathered unit";
  if (plan.pipeline_stage < 0) return "the plan's total at the step's peak";
  return fmt::format("the plan's total at the step's peak on the ranks of pipeline stage {}, the stage that needs most",
                     plan.pipeline_stage);
}
}  // namespace

void check_memory_before_allocation(MPI_Comm world, const Deck& deck, MemoryUse use) {
  int ranks = 1;
  MPI_Comm_size(world, &ranks);
  // The planner's UsageError for a deck that cannot run so; init builds the model and runs no step, so only
  // the model states are planned for it (a batch that does not split over these ranks is training's business).
  // A pipeline's stages differ: every rank plans each, and the one that needs most is checked.
  const MemoryPlan plan = [&] {
    if (use != MemoryUse::training) return plan_model_states(deck, ranks);
    if (deck.mesh.pp == 1) return plan_memory(deck, ranks);
    MemoryPlan most = plan_stage_memory(deck, ranks, 0);
    for (int s = 1; s < deck.mesh.pp; ++s)
      if (MemoryPlan p = plan_stage_memory(deck, ranks, s); p.memory.total() > most.memory.total()) most = std::move(p);
    return most;
  }();
  const auto available = memory_available_per_rank(world);
  if (!available) return;
  const std::int64_t have = available->bytes_per_rank;
  std::int64_t need = plan.memory.total();
  if (use == MemoryUse::init) {
    std::int64_t gathered = 0;  // fsdpp init gathers one unit's tensors at a time to write them whole
    for (const PlannedUnit& u : plan.units) gathered = std::max(gathered, u.unsharded_bytes);
    need = plan.memory.parameters + gathered;
  }
  if (need <= have) return;
  const std::string advice =
      use == MemoryUse::training
          ? largest_micro_batch_text(deck, plan, have) + "; `fsdpp plan <deck> --ranks " + std::to_string(ranks) +
                " --mem-per-rank " + std::to_string(have >> 20) + "MiB` shows where the memory goes"
          : "use more ranks: each holds 1/" + std::to_string(plan.shard_ranks) + " of the parameters";
  throw UsageError(fmt::format(
      "not enough memory: {} on {} rank(s) needs {} per rank ({}), but a rank has {} ({}): DOES NOT FIT, so "
      "nothing was allocated.\n{}.\nSet FSDPP_MEMORY_CHECK=0 to skip this check.",
      use == MemoryUse::training ? "training this deck" : "writing this deck's initial weights", ranks,
      bytes_text(need), what_is_needed(use, plan), bytes_text(have), available->source, advice));
}

}  // namespace fsdpp
