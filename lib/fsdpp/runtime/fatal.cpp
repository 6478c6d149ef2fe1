#include "fsdpp/runtime/fatal.hpp"

#include "fsdpp/runtime/log.hpp"

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace fsdpp {
namespace {
std::atomic<AbortHook> g_hook{nullptr};
std::atomic<bool> g_aborting{false};
}  // namespace

void set_abort_hook(AbortHook hook) { g_hook = hook; }

void abort_job(const std::string& message, int code) {
  if (g_aborting.exchange(true)) {
    // Another thread is already ending the job (the watchdog while the main thread failed, say).
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  Log::error_one_rank(message);
  if (AbortHook hook = g_hook.load()) {
    const std::string more = hook(message);
    if (!more.empty()) {
      std::fprintf(stderr, "%s\n", more.c_str());
      std::fflush(stderr);
    }
  }
  // MPI_Abort asks the launcher to end the job; with the launcher gone (killed, or cut off) it can wait forever,
  // leaving this rank behind. Whatever happens to it, the process ends 10 s from now.
  std::thread([code] {
    std::this_thread::sleep_for(std::chrono::seconds(10));
    std::_Exit(code);
  }).detach();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();  // MPI_Abort does not return; this keeps [[noreturn]] honest if it ever did
}

}  // namespace fsdpp
