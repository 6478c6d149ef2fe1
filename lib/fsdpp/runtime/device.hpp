#pragma once
// Which device a rank computes on. The rule: node-local rank modulo the number of visible GPUs; two ranks on
// one GPU is an error unless the user allows it (stack-notes §3.4).
#include <mpi.h>

#include <optional>
#include <string>

namespace fsdpp {

enum class DevicePolicy { automatic, host, cuda };

DevicePolicy parse_device_policy(const std::string& text);  // "auto" | "host" | "cuda"; UsageError otherwise

struct DevicePlan {
  int device = -1;             // CUDA device ordinal, or -1 for host
  std::optional<std::string> conflict;  // why this placement is refused, if it is
};

// Pure placement rule, separated from the CUDA queries so that it can be tested without a GPU.
DevicePlan plan_device(int local_rank, int local_size, int visible_devices, DevicePolicy policy,
                       bool allow_sharing);

struct DeviceChoice {
  int device = -1;          // -1: host
  int visible_devices = 0;  // GPUs this rank can see (0 in builds without CUDA)
  std::string name;         // "host" or "cuda:<d> (<gpu name>, <bus id>)"
};

// Collective over `world`: every rank learns if any rank's placement is refused, and then every rank throws
// the same UsageError (so the job exits cleanly instead of half the ranks hanging in NCCL init).
DeviceChoice choose_device(MPI_Comm world, int local_rank, int local_size, DevicePolicy policy,
                           bool allow_sharing);

}  // namespace fsdpp
