#include "fsdpp/runtime/device.hpp"

#include "fsdpp/runtime/collective_errors.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/runtime/rank_names.hpp"

#include <fmt/format.h>

#include <cstring>
#include <string>
#include <vector>

#ifdef FSDPP_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace fsdpp {

DevicePolicy parse_device_policy(const std::string& text) {
  if (text == "auto") return DevicePolicy::automatic;
  if (text == "host" || text == "cpu") return DevicePolicy::host;
  if (text == "cuda" || text == "gpu") return DevicePolicy::cuda;
  throw UsageError(fmt::format("unknown device '{}': expected auto, host or cuda", text));
}

DevicePlan plan_device(int local_rank, int visible_devices, DevicePolicy policy) {
  DevicePlan plan;
  if (policy == DevicePolicy::host) return plan;
  if (visible_devices <= 0) {
    if (policy == DevicePolicy::cuda)
      plan.conflict = "device 'cuda' was requested but this rank sees no CUDA GPU; run on a GPU node (with a GPU "
                      "allocation such as srun --gpus-per-task=1) and a CUDA build of fsdpp, or use device 'host' "
                      "(FSDPP_DEVICE=host)";
    return plan;
  }
  plan.device = local_rank % visible_devices;
  return plan;
}

std::optional<std::string> find_shared_gpu(const std::vector<std::string>& gpu_ids,
                                           const std::vector<int>& world_ranks, bool allow_sharing) {
  if (allow_sharing) return std::nullopt;
  for (std::size_t a = 0; a < gpu_ids.size(); ++a) {
    if (gpu_ids[a].empty()) continue;  // on the host
    std::vector<int> local{static_cast<int>(a)};
    for (std::size_t b = a + 1; b < gpu_ids.size(); ++b)
      if (gpu_ids[b] == gpu_ids[a]) local.push_back(static_cast<int>(b));
    if (local.size() < 2) continue;
    std::string who = "node-local ranks " + join_numbers(local);
    if (world_ranks.size() == gpu_ids.size()) {
      std::vector<int> world;
      for (int l : local) world.push_back(world_ranks[static_cast<std::size_t>(l)]);
      who = fmt::format("ranks {} ({})", join_numbers(world), who);
    }
    return fmt::format(
        "{} would {} run on the same GPU (PCI bus id {}), so {} ranks would share one GPU. Launch one rank per "
        "GPU (srun --gpus-per-task=1, or srun --gpus-per-node=G with G tasks per node, or mpirun with -npernode "
        "G for G GPUs per node), or set FSDPP_ALLOW_GPU_SHARING=1 if sharing is intended",
        who, local.size() == 2 ? "both" : "all", gpu_ids[a], local.size());
  }
  return std::nullopt;
}

namespace {

// The PCI bus id of a CUDA device ("0000:3B:00.0"): the same physical GPU has the same id in every process,
// whatever CUDA_VISIBLE_DEVICES renumbered it to. Empty for the host or when CUDA cannot say (error set).
std::string pci_bus_id(int device, std::string& error) {
  if (device < 0) return {};
#ifdef FSDPP_HAVE_CUDA
  char bus[64] = {0};
  const cudaError_t rc = cudaDeviceGetPCIBusId(bus, sizeof bus, device);
  if (rc != cudaSuccess) {
    cudaGetLastError();
    error = fmt::format("cudaDeviceGetPCIBusId(cuda:{}) failed: {}; check the GPU and its driver (nvidia-smi)",
                        device, cudaGetErrorString(rc));
    return {};
  }
  return bus;
#else
  error = fmt::format("cuda:{} was chosen in a build without CUDA", device);
  return {};
#endif
}

std::string describe_device(int device);

}  // namespace

GpuProbe probe_gpus() {
  GpuProbe probe;
#ifdef FSDPP_HAVE_CUDA
  const cudaError_t rc = cudaGetDeviceCount(&probe.count);
  if (rc != cudaSuccess) {
    cudaGetLastError();  // clear the "no device" error so later CUDA queries start clean
    probe.count = 0;
    probe.error = fmt::format("cudaGetDeviceCount: {} ({})", cudaGetErrorString(rc), cudaGetErrorName(rc));
  } else if (probe.count == 0) {
    probe.error = "cudaGetDeviceCount: 0 devices";
  }
#else
  probe.error = "this build has no CUDA support";
#endif
  return probe;
}

std::string describe_visible_gpus() {
  const GpuProbe probe = probe_gpus();
  if (probe.count == 0) return "no usable GPU (" + probe.error + ")";
  std::string text = fmt::format("{} CUDA GPU(s):", probe.count);
  for (int d = 0; d < probe.count; ++d) text += (d ? ", " : " ") + describe_device(d);
  return text;
}

namespace {

std::string describe_device(int device) {
  if (device < 0) return "host";
#ifdef FSDPP_HAVE_CUDA
  cudaDeviceProp prop{};
  char bus[32] = {0};
  if (cudaGetDeviceProperties(&prop, device) == cudaSuccess &&
      cudaDeviceGetPCIBusId(bus, sizeof bus, device) == cudaSuccess)
    return fmt::format("cuda:{} ({}, {})", device, prop.name, bus);
#endif
  return fmt::format("cuda:{}", device);
}

}  // namespace

DeviceChoice choose_device(MPI_Comm world, int local_rank, DevicePolicy policy,
                           bool allow_sharing, const std::string& gpu_build) {
  DeviceChoice choice;
  const GpuProbe probe = probe_gpus();
  choice.visible_devices = probe.count;
  DevicePlan plan;
  if (gpu_build.empty()) {
    plan = plan_device(local_rank, choice.visible_devices, policy);
  } else if (policy == DevicePolicy::host) {
    plan.conflict = fmt::format("device 'host' was requested, but this fsdpp is a GPU build ({}) whose kernels run "
                                "only on a GPU; use a CPU build of fsdpp for host runs", gpu_build);
  } else {
    plan = plan_device(local_rank, choice.visible_devices, DevicePolicy::automatic);
    if (plan.device < 0)
      plan.conflict = fmt::format(
          "this fsdpp is a GPU build ({}) and this command computes on a GPU, but no usable GPU was found: {}. "
          "Run it on a GPU node (with a GPU allocation such as srun --gpus-per-task=1) and check the GPU and its "
          "driver there with nvidia-smi. Commands that need no GPU run anywhere: --version, plan, train --dry-run, "
          "ckpt, report, tokenize, mesh --dry-run",
          gpu_build, probe.error);
  }

  int rank = 0;
  MPI_Comm_rank(world, &rank);
  char host[MPI_MAX_PROCESSOR_NAME] = {0};
  int length = 0;
  MPI_Get_processor_name(host, &length);

  std::optional<std::string> refusal;
  std::string bus;
  if (!plan.conflict) {
    std::string error;
    bus = pci_bus_id(plan.device, error);
    if (!error.empty()) plan.conflict = error;
  }
  if (plan.conflict) refusal = fmt::format("rank {} on host {}: {}", rank, host, *plan.conflict);

  // The ranks of this node exchange the physical GPU each chose; every rank of the node reaches the same verdict.
  MPI_Comm node = MPI_COMM_NULL;
  FSDPP_MPI_CHECK(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  int node_size = 1;
  MPI_Comm_size(node, &node_size);
  constexpr int kIdBytes = 64;
  char mine[kIdBytes] = {0};
  std::strncpy(mine, bus.c_str(), kIdBytes - 1);
  std::vector<char> all_ids(static_cast<std::size_t>(node_size) * kIdBytes);
  std::vector<int> world_ranks(static_cast<std::size_t>(node_size));
  FSDPP_MPI_CHECK(MPI_Allgather(mine, kIdBytes, MPI_CHAR, all_ids.data(), kIdBytes, MPI_CHAR, node));
  FSDPP_MPI_CHECK(MPI_Allgather(&rank, 1, MPI_INT, world_ranks.data(), 1, MPI_INT, node));
  MPI_Comm_free(&node);
  std::vector<std::string> gpu_ids;
  for (int r = 0; r < node_size; ++r) gpu_ids.emplace_back(&all_ids[static_cast<std::size_t>(r) * kIdBytes]);
  if (!refusal)
    if (auto shared = find_shared_gpu(gpu_ids, world_ranks, allow_sharing))
      refusal = fmt::format("host {} ({} ranks on this node; rank {} sees {} GPU(s)): {}", host, node_size, rank,
                            choice.visible_devices, *shared);

  // The lowest refused rank explains the refusal to everyone, so rank 0 can print it once.
  agree_on_error(world, refusal.value_or(std::string()));

  choice.device = plan.device;
#ifdef FSDPP_HAVE_CUDA
  if (choice.device >= 0 && cudaSetDevice(choice.device) != cudaSuccess)
    throw Error(fmt::format("cudaSetDevice({}) failed: {}", choice.device, cudaGetErrorString(cudaGetLastError())));
#endif
  choice.name = describe_device(choice.device);
  return choice;
}

}  // namespace fsdpp
