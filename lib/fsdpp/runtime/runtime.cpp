#include "fsdpp/runtime/runtime.hpp"

#include "fsdpp/runtime/collective_errors.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/runtime/fatal.hpp"
#include "fsdpp/runtime/memory_accounting.hpp"

#include <Kokkos_Core.hpp>

#include <malloc.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace fsdpp {
#if defined(KOKKOS_ENABLE_CUDA)
int cuda_driver_shim_anchor();  // cuda_driver_shim.cpp: keeps libcuda.so.1 off the executables' load-time needs
#endif
namespace {

bool env_flag(const char* name, bool fallback) {
  const char* value = std::getenv(name);
  if (!value) return fallback;
  return !(std::strcmp(value, "0") == 0 || std::strcmp(value, "") == 0 || std::strcmp(value, "false") == 0);
}

}  // namespace

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "single";
    case MPI_THREAD_FUNNELED: return "funneled";
    case MPI_THREAD_SERIALIZED: return "serialized";
    case MPI_THREAD_MULTIPLE: return "multiple";
  }
  return "unknown";
}

RuntimeOptions RuntimeOptions::from_environment(RuntimeOptions o) {
  o.log.all_ranks = env_flag("FSDPP_LOG_ALL_RANKS", o.log.all_ranks);
  o.log.rank_prefix = env_flag("FSDPP_LOG_RANK_PREFIX", o.log.rank_prefix);
  o.allow_gpu_sharing = env_flag("FSDPP_ALLOW_GPU_SHARING", o.allow_gpu_sharing);
  if (const char* device = std::getenv("FSDPP_DEVICE")) o.device = parse_device_policy(device);
  return o;
}

Runtime::Runtime(int& argc, char**& argv, RuntimeOptions options) {
  // A write to the socket of a rank that died (a lost node) must fail with EPIPE, not kill this rank with
  // SIGPIPE before it can say anything: the collective then stalls, and the watchdog ends the job naming the
  // collective and, through the flight recorder, the ranks and node that stopped answering.
  std::signal(SIGPIPE, SIG_IGN);
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    // MULTIPLE because each MPI communicator runs its asynchronous collectives on a thread of its own.
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &thread_level_) != MPI_SUCCESS) {
      std::fprintf(stderr, "error: MPI_Init_thread failed; check the MPI installation and the launcher\n");
      std::exit(1);
    }
    owns_mpi_ = true;
  } else {
    MPI_Query_thread(&thread_level_);
  }
  saved_argv0_ = argc > 0 && argv[0] ? argv[0] : "fsdpp";
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--kokkos-", 9) == 0) kokkos_flags_.emplace_back(argv[i]);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  Log::configure(rank_, size_, options.log);

  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local_rank_);
  MPI_Comm_size(node, &local_size_);
  MPI_Comm_free(&node);

  char host[MPI_MAX_PROCESSOR_NAME] = {0};
  int length = 0;
  MPI_Get_processor_name(host, &length);
  hostname_.assign(host, static_cast<std::size_t>(length));

  options_ = options;
#if defined(KOKKOS_ENABLE_CUDA)
  (void)cuda_driver_shim_anchor();
#endif
  if (options.start_device) start_device();
}

std::string gpu_build_target() {
#if defined(KOKKOS_ENABLE_CUDA)
  const char* arch =
#if defined(KOKKOS_ARCH_BLACKWELL100)
      "sm_100";
#elif defined(KOKKOS_ARCH_HOPPER90)
      "sm_90";
#elif defined(KOKKOS_ARCH_ADA89)
      "sm_89";
#elif defined(KOKKOS_ARCH_AMPERE86)
      "sm_86";
#elif defined(KOKKOS_ARCH_AMPERE80)
      "sm_80";
#elif defined(KOKKOS_ARCH_VOLTA70)
      "sm_70";
#else
      "the architecture Kokkos was configured for";
#endif
  return fmt::format("Kokkos {}.{}.{:02d} Cuda backend, {}", KOKKOS_VERSION / 10000, KOKKOS_VERSION / 100 % 100,
                     KOKKOS_VERSION % 100, arch);
#elif defined(KOKKOS_ENABLE_HIP)
  return "Kokkos HIP backend";
#elif defined(KOKKOS_ENABLE_SYCL)
  return "Kokkos SYCL backend";
#else
  return {};
#endif
}

void Runtime::start_device() {
  if (device_started_) return;
  device_started_ = true;
  try {
    device_ = choose_device(MPI_COMM_WORLD, local_rank_, options_.device, options_.allow_gpu_sharing,
                            gpu_build_target());
  } catch (const std::exception& e) {
    fail(e);
  }

  if (!Kokkos::is_initialized()) {
    // Kokkos gets its own argv: the user's --kokkos-* flags plus the device id chosen above.
    std::vector<std::string> kokkos_args{saved_argv0_};
    kokkos_args.insert(kokkos_args.end(), kokkos_flags_.begin(), kokkos_flags_.end());
#if defined(KOKKOS_ENABLE_CUDA)
    if (device_.device >= 0) kokkos_args.push_back("--kokkos-device-id=" + std::to_string(device_.device));
#endif
    std::vector<char*> kargv;
    for (auto& a : kokkos_args) kargv.push_back(a.data());
    kargv.push_back(nullptr);
    int kargc = static_cast<int>(kokkos_args.size());
    // A GPU that is present but unusable (busy in exclusive mode, a driver mismatch) makes Kokkos throw; every
    // rank hears of it and exits with code 2 rather than one aborting while the others wait.
    std::string problem;
    try {
      Kokkos::initialize(kargc, kargv.data());
      owns_kokkos_ = true;
    } catch (const std::exception& e) {
      problem = fmt::format("rank {} on host {}: Kokkos could not start on {}{}: {}", rank_, hostname_, device_.name,
                            gpu_build_target().empty() ? "" : " (" + gpu_build_target() + ")", e.what());
    }
    try {
      agree_on_error(MPI_COMM_WORLD, problem);
    } catch (const std::exception& e) {
      fail(e);
    }
  }
  MemoryAccounting::install();  // before any View: the measured per-rank peaks count every allocation
  // fully_shard frees and reallocates its unsharded buffers every step. glibc serves large blocks with fresh
  // mmaps unless a large block was freed before (its threshold then rises by accident), so a step's speed
  // depended on allocation history: 120 or 145 ms for the same step (tests/bench/run checkpoint). Serve blocks
  // up to 32 MiB (glibc's limit) from the heap and keep freed heap memory, so buffers are recycled without
  // page faults, as a caching allocator would.
#if defined(M_MMAP_THRESHOLD) && defined(M_TRIM_THRESHOLD)
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
#endif
}

Runtime::~Runtime() { finalize(); }

void Runtime::finalize() {
  if (finalized_) return;
  finalized_ = true;
  if (owns_kokkos_) Kokkos::finalize();
  if (owns_mpi_) MPI_Finalize();
}

void Runtime::exit_all(int code, double timeout_s) {
  MPI_Request request;
  MPI_Ibarrier(MPI_COMM_WORLD, &request);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int done = 0;
  while (!done) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done) break;
    if (std::chrono::steady_clock::now() > deadline) {
      Log::error_one_rank(fmt::format("not every rank reached the exit within {:.0f} s; aborting the job",
                                      timeout_s));
      MPI_Abort(MPI_COMM_WORLD, code == 0 ? 1 : code);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  finalize();
  std::exit(code);
}

void Runtime::fail(const std::exception& error) {
  if (dynamic_cast<const UsageError*>(&error)) {
    Log::error_all_ranks(error.what());
    exit_all(2);
  }
  abort_job(error.what());  // with the flight recorder's dumps when a training run is in progress
}

}  // namespace fsdpp
