#include "fsdpp/runtime/device.hpp"

#include "fsdpp/runtime/error.hpp"

#include <fmt/format.h>

#include <climits>
#include <cstring>

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

DevicePlan plan_device(int local_rank, int local_size, int visible_devices, DevicePolicy policy,
                       bool allow_sharing) {
  DevicePlan plan;
  if (policy == DevicePolicy::host) return plan;
  if (visible_devices <= 0) {
    if (policy == DevicePolicy::cuda)
      plan.conflict = "device 'cuda' was requested but this rank sees no CUDA GPU; run on a GPU node, or use "
                      "device 'host' (FSDPP_DEVICE=host)";
    return plan;
  }
  if (local_size > visible_devices && !allow_sharing) {
    plan.conflict = fmt::format(
        "{} ranks on this node would share {} visible GPU(s), so two ranks would run on one GPU. Launch one "
        "rank per GPU (srun --gpus-per-task=1, or mpirun with -npernode {}), or set "
        "FSDPP_ALLOW_GPU_SHARING=1 if sharing is intended",
        local_size, visible_devices, visible_devices);
    return plan;
  }
  plan.device = local_rank % visible_devices;
  return plan;
}

namespace {

int count_visible_gpus() {
#ifdef FSDPP_HAVE_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error so later CUDA queries start clean
    return 0;
  }
  return count;
#else
  return 0;
#endif
}

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

DeviceChoice choose_device(MPI_Comm world, int local_rank, int local_size, DevicePolicy policy,
                           bool allow_sharing) {
  DeviceChoice choice;
  choice.visible_devices = count_visible_gpus();
  const DevicePlan plan = plan_device(local_rank, local_size, choice.visible_devices, policy, allow_sharing);

  int rank = 0;
  MPI_Comm_rank(world, &rank);
  // The lowest refused rank explains the refusal to everyone, so rank 0 can print it once.
  int first_refused = plan.conflict ? rank : INT_MAX;
  FSDPP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &first_refused, 1, MPI_INT, MPI_MIN, world));
  if (first_refused != INT_MAX) {
    char text[1024] = {0};
    if (rank == first_refused) {
      char host[MPI_MAX_PROCESSOR_NAME] = {0};
      int length = 0;
      MPI_Get_processor_name(host, &length);
      fmt::format_to_n(text, sizeof text - 1, "rank {} on host {}: {}", rank, host, *plan.conflict);
    }
    FSDPP_MPI_CHECK(MPI_Bcast(text, sizeof text, MPI_CHAR, first_refused, world));
    throw UsageError(text);
  }

  choice.device = plan.device;
#ifdef FSDPP_HAVE_CUDA
  if (choice.device >= 0 && cudaSetDevice(choice.device) != cudaSuccess)
    throw Error(fmt::format("cudaSetDevice({}) failed: {}", choice.device, cudaGetErrorString(cudaGetLastError())));
#endif
  choice.name = describe_device(choice.device);
  return choice;
}

}  // namespace fsdpp
