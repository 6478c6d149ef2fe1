#include "fsdpp/runtime/watchdog.hpp"

#include <fmt/format.h>
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>

namespace fsdpp {
namespace {

using Clock = std::chrono::steady_clock;

struct Watched {
  const char* op;
  std::string group;
  Clock::time_point started;
};

struct State {
  std::atomic<bool> enabled{false};
  std::atomic<std::int64_t> step{0};
  double timeout_s = 0;
  std::mutex mutex;
  std::condition_variable cv;
  bool stopping = false;
  std::uint64_t next_id = 1;
  std::map<std::uint64_t, Watched> in_progress;  // by id: the oldest first
  std::thread monitor;
};

State& state() {
  static State s;
  return s;
}

[[noreturn]] void abort_job(const Watched& w, double waited, std::int64_t step) {
  int rank = 0, finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::string where = step > 0 ? fmt::format("at step {}", step) : std::string("outside the training steps");
  std::fprintf(stderr,
               "[rank %d] error: collective watchdog: %s over %s did not finish within %.0f s (waited %.1f s, %s); "
               "a rank is stuck or gone. Aborting the job (comm.timeout_s; 0 disables the watchdog)\n",
               rank, w.op, w.group.c_str(), state().timeout_s, waited, where.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

void monitor_loop() {
  State& s = state();
  const auto tick = std::chrono::duration<double>(std::min(0.25, s.timeout_s / 4));
  std::unique_lock<std::mutex> lock(s.mutex);
  while (!s.stopping) {
    s.cv.wait_for(lock, tick);
    if (s.stopping || s.in_progress.empty()) continue;
    const Watched& oldest = s.in_progress.begin()->second;
    const double waited = std::chrono::duration<double>(Clock::now() - oldest.started).count();
    if (waited > s.timeout_s) abort_job(oldest, waited, s.step.load());
  }
}

}  // namespace

void CollectiveWatchdog::start(double timeout_s) {
  State& s = state();
  stop();
  if (timeout_s <= 0) return;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.timeout_s = timeout_s;
    s.stopping = false;
    s.in_progress.clear();
  }
  s.monitor = std::thread(monitor_loop);
  s.enabled = true;
}

void CollectiveWatchdog::stop() {
  State& s = state();
  s.enabled = false;
  if (!s.monitor.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.stopping = true;
  }
  s.cv.notify_all();
  s.monitor.join();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.in_progress.clear();
  s.step = 0;
}

void CollectiveWatchdog::set_step(std::int64_t step) { state().step = step; }

CollectiveWatchdog::Scope::Scope(const char* op, const std::string& group) {
  State& s = state();
  if (!s.enabled.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(s.mutex);
  id_ = s.next_id++;
  s.in_progress.emplace(id_, Watched{op, group, Clock::now()});
}

CollectiveWatchdog::Scope::~Scope() {
  if (id_ == 0) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.in_progress.erase(id_);
}

}  // namespace fsdpp
