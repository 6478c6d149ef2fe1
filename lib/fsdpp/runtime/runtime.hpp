#pragma once
// Runtime: the RAII owner of MPI and Kokkos for one process.
//   construct: MPI_Init_thread(MULTIPLE) -> node-local rank (MPI_Comm_split_type)
//              -> start_device(): device choice -> Kokkos::initialize (with --kokkos-device-id on CUDA builds)
//   destruct:  Kokkos::finalize -> MPI_Finalize
// With RuntimeOptions::start_device off, construction stops after MPI and the device part waits for an explicit
// start_device(): the fsdpp executable starts it only for commands that compute, so that a GPU build's
// --version, plan, ckpt, report, tokenize and mesh --dry-run run on machines without a GPU or driver (a Kokkos
// built with CUDA cannot initialize there). Such commands must not touch Kokkos.
// Works without a launcher too (MPI singleton: one rank). If MPI or Kokkos was already initialized by the
// caller (a test harness), the Runtime uses it and leaves its finalization to that caller.
#include "fsdpp/runtime/device.hpp"
#include "fsdpp/runtime/log.hpp"

#include <mpi.h>

#include <exception>
#include <string>
#include <vector>

namespace fsdpp {

struct RuntimeOptions {
  LogOptions log;
  DevicePolicy device = DevicePolicy::automatic;
  bool allow_gpu_sharing = false;
  bool start_device = true;  // false: MPI only until Runtime::start_device()
  // Read FSDPP_LOG_ALL_RANKS, FSDPP_LOG_RANK_PREFIX, FSDPP_DEVICE and FSDPP_ALLOW_GPU_SHARING on top of these.
  static RuntimeOptions from_environment(RuntimeOptions defaults);
  static RuntimeOptions from_environment() { return from_environment(RuntimeOptions{}); }
};

class Runtime {
 public:
  Runtime(int& argc, char**& argv, RuntimeOptions options = RuntimeOptions::from_environment());
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  MPI_Comm world() const { return MPI_COMM_WORLD; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  const std::string& hostname() const { return hostname_; }
  // Collective and idempotent: choose this rank's device and initialize Kokkos on it. When that is impossible
  // (a GPU build on a rank without a usable GPU, a refused placement) every rank exits with code 2 and one
  // message saying which GPU was expected and what the driver said.
  void start_device();
  const DeviceChoice& device() const { return device_; }  // meaningful once start_device() ran
  int thread_level() const { return thread_level_; }

  // Exit every rank with `code`. Ranks first meet in a barrier; one that is not reached within
  // `timeout_s` seconds means some rank went another way, and the job is aborted instead of hanging.
  [[noreturn]] void exit_all(int code, double timeout_s = 60.0);

  // Turn an exception that reached main into the right exit: a UsageError is printed once by rank 0 and every
  // rank exits with code 2; any other error is printed with its rank and the job is aborted (abort_job,
  // runtime/fatal.hpp: with the flight recorder's dumps when a training run is in progress).
  [[noreturn]] void fail(const std::exception& error);

 private:
  void finalize();

  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  int thread_level_ = MPI_THREAD_SINGLE;
  std::string hostname_;
  DeviceChoice device_;
  RuntimeOptions options_;
  std::string saved_argv0_;
  std::vector<std::string> kokkos_flags_;  // the user's --kokkos-* arguments, for a later start_device()
  bool device_started_ = false;
  bool owns_mpi_ = false, owns_kokkos_ = false, finalized_ = false;
};

const char* thread_level_name(int level);

// What the GPU kernels of this build are compiled for ("Kokkos Cuda backend, sm_90"), or "" for a host build
// (Kokkos' default execution space runs on the CPU).
std::string gpu_build_target();

}  // namespace fsdpp
