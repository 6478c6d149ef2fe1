#pragma once
// Which device a rank computes on. The rule: node-local rank modulo the number of GPUs this rank sees; then the
// ranks of a node compare the PCI bus ids of the GPUs they chose, and two ranks on one physical GPU is an error
// unless the user allows it (docs/stack-notes.md §3.4). Comparing bus ids, not counts, matters under
// `srun --gpus-per-task=1`: each rank then sees exactly one GPU (through CUDA_VISIBLE_DEVICES) as its CUDA
// device 0, a different physical one per rank, which a count ("4 ranks, 1 visible GPU") would wrongly refuse.
#include <mpi.h>

#include <optional>
#include <string>
#include <vector>

namespace fsdpp {

enum class DevicePolicy { automatic, host, cuda };

DevicePolicy parse_device_policy(const std::string& text);  // "auto" | "host" | "cuda"; UsageError otherwise

struct DevicePlan {
  int device = -1;             // CUDA device ordinal, or -1 for host
  std::optional<std::string> conflict;  // why this placement is refused, if it is
};

// Pure placement rule for one rank, separated from the CUDA queries so that it can be tested without a GPU:
// local_rank % visible_devices, host when no GPU is visible (refused when 'cuda' was demanded).
DevicePlan plan_device(int local_rank, int visible_devices, DevicePolicy policy);

// Pure duplicate check for one node: gpu_ids[i] identifies the physical GPU that node-local rank i chose (its PCI
// bus id; empty for a rank on the host), world_ranks[i] is that rank in the job (may be empty: then the local
// ranks are named alone). Returns why the placement is refused when two ranks chose the same GPU and sharing
// is not allowed, naming both ranks and what to do; nullopt when every GPU has one rank.
std::optional<std::string> find_shared_gpu(const std::vector<std::string>& gpu_ids,
                                           const std::vector<int>& world_ranks, bool allow_sharing);

struct DeviceChoice {
  int device = -1;          // -1: host
  int visible_devices = 0;  // GPUs this rank can see (0 in builds without CUDA)
  std::string name;         // "host" or "cuda:<d> (<gpu name>, <bus id>)"
};

// What the CUDA runtime says about this process's GPUs, without starting anything that needs one: safe to call
// on a machine with no GPU or no driver (the error is cleared so later CUDA calls start clean).
struct GpuProbe {
  int count = 0;      // GPUs this process sees (0 when the query failed or in builds without CUDA)
  std::string error;  // why none are usable, as the CUDA runtime said it ("" when the query worked)
};
GpuProbe probe_gpus();
// One line for `fsdpp --version`: "2 CUDA GPU(s): cuda:0 (NVIDIA H200, 0000:3B:00.0), ..." or why there are none.
std::string describe_visible_gpus();

// Collective over `world`: each rank plans its device, the ranks of each node (MPI_COMM_TYPE_SHARED) exchange
// the bus ids they chose, and every rank learns if any placement is refused; then every rank throws the same
// UsageError (so the job exits cleanly instead of half the ranks hanging in NCCL init). local_rank is this
// rank's place on its node, as the runtime computed it. `gpu_build` names the build's GPU target (Kokkos'
// default execution space is a GPU one, "Kokkos Cuda backend, sm_90") when it cannot compute without one:
// then 'auto' demands a GPU, 'host' is refused, and a rank without a GPU is refused with what the CUDA
// runtime said (a missing driver, no device), naming the GPU that was expected.
DeviceChoice choose_device(MPI_Comm world, int local_rank, DevicePolicy policy,
                           bool allow_sharing, const std::string& gpu_build = {});

}  // namespace fsdpp
