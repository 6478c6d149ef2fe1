#include "fsdpp/observe/watchdog.hpp"

#include "fsdpp/runtime/fatal.hpp"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

namespace fsdpp {
namespace {

using Clock = std::chrono::steady_clock;

struct Watched {
  CollectiveTicket ticket;
  std::string region;  // a Region's description; empty for a collective
  Clock::time_point started;  // the host's start, or when a device collective was enqueued
  std::shared_ptr<DeviceCompletion> device;  // null for a collective the host runs
  bool device_running = false;
};

struct WatchdogState {
  std::atomic<bool> enabled{false};
  double timeout_s = 0;
  std::mutex mutex;
  std::condition_variable cv;
  bool stopping = false;
  std::uint64_t next_id = 1;
  std::map<std::uint64_t, Watched> in_progress;  // by id: the oldest first
  std::thread monitor;
};

WatchdogState& watchdog_state() {
  static WatchdogState s;
  return s;
}

std::string where_in_training() {
  const std::int64_t step = FlightRecorder::step();
  return step > 0 ? fmt::format("at step {}", step) : std::string("outside the training steps");
}

[[noreturn]] void time_out(const Watched& w, double waited, double timeout_s) {
  if (w.device) w.device->abort();  // its kernels would otherwise spin on the GPU past the job
  abort_job(fmt::format("collective watchdog: {} did not finish within {:.0f} s (waited {:.1f} s, {}); a rank is "
                        "stuck or gone. Aborting the job (comm.timeout_s; 0 disables the watchdog)",
                        w.region.empty() ? describe_collective(w.ticket) : w.region, timeout_s, waited,
                        where_in_training()));
}

[[noreturn]] void device_failed(const Watched& w, const std::string& error) {
  w.device->abort();  // ncclCommAbort, never Destroy: that could block on the failed communicator
  abort_job(fmt::format("{} failed on the device: {} ({}); a peer or the network failed. Aborting the job",
                        describe_collective(w.ticket), error, where_in_training()));
}

// Polls the device collectives: done ones leave (their flight record completed), running ones are marked so.
// Called with the mutex held; the first failure ends the job.
void poll_devices(WatchdogState& s) {
  for (auto it = s.in_progress.begin(); it != s.in_progress.end();) {
    Watched& w = it->second;
    if (!w.device) {
      ++it;
      continue;
    }
    std::string error;
    const DeviceCompletion::Progress progress = w.device->poll(error);
    if (progress == DeviceCompletion::Progress::failed) device_failed(w, error);
    if (progress != DeviceCompletion::Progress::queued && !w.device_running) {
      w.device_running = true;
      FlightRecorder::started(w.ticket);
    }
    if (progress == DeviceCompletion::Progress::done) {
      FlightRecorder::completed(w.ticket);
      it = s.in_progress.erase(it);
    } else {
      ++it;
    }
  }
}

void monitor_loop() {
  WatchdogState& s = watchdog_state();
  const auto tick = std::chrono::duration<double>(std::min(0.25, s.timeout_s / 4));
  std::unique_lock<std::mutex> lock(s.mutex);
  while (!s.stopping) {
    s.cv.wait_for(lock, tick);
    if (s.stopping || s.in_progress.empty()) continue;
    poll_devices(s);
    if (s.in_progress.empty()) continue;
    const Watched& oldest = s.in_progress.begin()->second;
    const double waited = std::chrono::duration<double>(Clock::now() - oldest.started).count();
    if (waited > s.timeout_s) time_out(oldest, waited, s.timeout_s);
  }
}

std::uint64_t watch(WatchdogState& s, Watched w) {
  std::lock_guard<std::mutex> lock(s.mutex);
  const std::uint64_t id = s.next_id++;
  s.in_progress.emplace(id, std::move(w));
  return id;
}

}  // namespace

std::string describe_collective(const CollectiveTicket& ticket) {
  const std::string site = FlightRecorder::site_of(ticket);
  return fmt::format("{} over {} (#{}{}{})", collective_op_name(ticket.op), FlightRecorder::label(ticket.comm),
                     ticket.seq, site.empty() ? "" : ", ", site);
}

void CollectiveWatchdog::start(double timeout_s) {
  WatchdogState& s = watchdog_state();
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
  WatchdogState& s = watchdog_state();
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
}

bool CollectiveWatchdog::running() { return watchdog_state().enabled.load(std::memory_order_relaxed); }

CollectiveWatchdog::Scope::Scope(const CollectiveTicket& ticket)
    : ticket_(ticket), exceptions_(std::uncaught_exceptions()) {
  FlightRecorder::started(ticket_);
  WatchdogState& s = watchdog_state();
  if (!s.enabled.load(std::memory_order_relaxed)) return;
  id_ = watch(s, Watched{ticket_, {}, Clock::now(), nullptr, true});
}

CollectiveWatchdog::Scope::~Scope() {
  // Unwinding from the collective's exception: the record says it failed rather than completed.
  if (std::uncaught_exceptions() > exceptions_) FlightRecorder::failed(ticket_);
  else FlightRecorder::completed(ticket_);
  if (id_ == 0) return;
  WatchdogState& s = watchdog_state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.in_progress.erase(id_);
}

void CollectiveWatchdog::watch_device(const CollectiveTicket& ticket, std::shared_ptr<DeviceCompletion> completion) {
  WatchdogState& s = watchdog_state();
  if (!s.enabled.load(std::memory_order_relaxed)) return;
  watch(s, Watched{ticket, {}, Clock::now(), std::move(completion), false});
}

CollectiveWatchdog::Region::Region(std::string what) {
  WatchdogState& s = watchdog_state();
  if (!s.enabled.load(std::memory_order_relaxed)) return;
  id_ = watch(s, Watched{CollectiveTicket{}, std::move(what), Clock::now(), nullptr, true});
}

CollectiveWatchdog::Region::~Region() {
  if (id_ == 0) return;
  WatchdogState& s = watchdog_state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.in_progress.erase(id_);
}

void CollectiveWatchdog::forget_communicator(std::uint32_t comm) {
  WatchdogState& s = watchdog_state();
  std::lock_guard<std::mutex> lock(s.mutex);
  for (auto it = s.in_progress.begin(); it != s.in_progress.end();)
    it = it->second.device && it->second.ticket.comm == comm ? s.in_progress.erase(it) : std::next(it);
}

}  // namespace fsdpp
