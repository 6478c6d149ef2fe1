#include "fsdpp/observe/flight_service.hpp"

#include "fsdpp/observe/flight_dump.hpp"
#include "fsdpp/observe/flight_recorder.hpp"
#include "fsdpp/observe/peer_channel.hpp"
#include "fsdpp/runtime/rank_names.hpp"
#include "fsdpp/runtime/fatal.hpp"
#include "fsdpp/runtime/log.hpp"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>

namespace fsdpp {
namespace {

// How long a rank that aborts waits for the others' answers: dumps take milliseconds, so this is about the
// ranks that will never answer.
constexpr double kAnswerWait_s = 2.0;

struct Service {
  std::string dir;
  double timeout_s = 0;
  int rank = 0, world_size = 1;
  std::unique_ptr<PeerChannel> channel;
  std::atomic<bool> ready{false};  // the channel is in place: requests arriving before are answered, not dumped
  std::mutex dump_mutex;  // one dump at a time: requests, SIGUSR2 and the abort may meet
  std::chrono::steady_clock::time_point last_requested_dump{};
  // This rank dumped on its way out (an abort): a later request (a stopped rank resumed by the launcher's kill,
  // whose own watchdog then fires) must not overwrite that dump, which holds why it aborted and whom it found
  // silent.
  std::atomic<bool> dumped_for_abort{false};
};

std::mutex g_service_mutex;  // guards g_service's lifetime against the abort hook
std::unique_ptr<Service> g_service;

std::string dump(Service& s, const std::string& reason, std::vector<int> not_answering = {}) {
  FlightDumpContext context;
  context.rank = s.rank;
  context.world_size = s.world_size;
  context.hosts = s.channel->hosts();
  context.reason = reason;
  context.timeout_s = s.timeout_s;
  context.not_answering = std::move(not_answering);
  std::lock_guard<std::mutex> lock(s.dump_mutex);
  return write_flight_dump(s.dir, context);
}

// On the channel's thread: another rank's request, or SIGUSR2 (asking_rank -1).
void on_request(Service& s, int asking_rank, const std::string& reason) {
  if (!s.ready || s.dumped_for_abort) return;
  try {
    if (asking_rank < 0) {
      const std::string path = dump(s, "SIGUSR2: dumped while the run goes on");
      Log::every_rank("flight recorder: SIGUSR2: wrote the last {} collectives to {}; the run goes on",
                      FlightRecorder::records().size(), path);
      return;
    }
    // Asked again (a repeated datagram, a second aborting rank) within a second: the dump on disk is current.
    const auto now = std::chrono::steady_clock::now();
    if (now - s.last_requested_dump < std::chrono::seconds(1)) return;
    s.last_requested_dump = now;
    dump(s, fmt::format("asked by rank {}: {}", asking_rank, reason));
  } catch (const std::exception& e) {
    Log::error_one_rank(fmt::format("flight recorder: {}", e.what()));
  }
}

std::string text_for_abort(Service& s, const std::string& message) {
  const std::optional<std::vector<int>> asked = s.channel->ask_all_to_dump(message, kAnswerWait_s);
  const std::vector<int> silent = asked.value_or(std::vector<int>{});
  std::string path;
  try {
    s.dumped_for_abort = true;  // first: a request arriving meanwhile must not write after this dump
    path = dump(s, "aborting: " + message, silent);
  } catch (const std::exception& e) {
    path = fmt::format("(not written: {})", e.what());
  }
  const std::vector<std::string>& hosts = s.channel->hosts();
  std::string text = fmt::format("[rank {}] flight recorder: this rank's last {} collectives are in {}; ", s.rank,
                                 FlightRecorder::records().size(), path);
  if (!asked) {
    text += fmt::format("the other ranks were not asked to dump theirs ({}). ", s.channel->problem());
  } else if (silent.empty()) {
    text += s.world_size > 1 ? "every other rank answered and dumped its own. " : "";
  } else {
    text += fmt::format("{} did not answer a request to dump within {:.0f} s: stopped, gone, or cut off from rank {} "
                        "on {}. ", ranks_on_hosts(silent, hosts), kAnswerWait_s, s.rank,
                        hosts.at(static_cast<std::size_t>(s.rank)));
  }
  return text + fmt::format("Which rank never entered which collective: fsdpp debug flight {}", s.dir);
}

std::string abort_hook(const std::string& message) {
  std::lock_guard<std::mutex> lock(g_service_mutex);
  return g_service ? text_for_abort(*g_service, message) : std::string();
}

extern "C" void on_sigusr2(int) { PeerChannel::wake_from_signal(); }

}  // namespace

void FlightService::start(MPI_Comm world, std::size_t records, const std::string& dir, double timeout_s) {
  stop();
  auto s = std::make_unique<Service>();
  s->dir = dir;
  s->timeout_s = timeout_s;
  MPI_Comm_rank(world, &s->rank);
  MPI_Comm_size(world, &s->world_size);
  char host[MPI_MAX_PROCESSOR_NAME] = {0};
  int length = 0;
  MPI_Get_processor_name(host, &length);
  Service* raw = s.get();
  s->channel = std::make_unique<PeerChannel>(world, std::string(host, static_cast<std::size_t>(length)),
                                             [raw](int asking, const std::string& reason) { on_request(*raw, asking, reason); });
  FlightRecorder::configure(records);
  if (!s->channel->usable() && s->rank == 0)
    Log::warn("flight recorder: no side channel ({}): a rank that aborts dumps its own records only, and SIGUSR2 "
              "dumps nothing", s->channel->problem());
  s->ready = true;
  {
    std::lock_guard<std::mutex> lock(g_service_mutex);
    g_service = std::move(s);
  }
  set_abort_hook(abort_hook);
}

void FlightService::stop() {
  std::unique_ptr<Service> old;
  {
    std::lock_guard<std::mutex> lock(g_service_mutex);
    old = std::move(g_service);
  }
  if (!old) return;
  set_abort_hook(nullptr);
  old.reset();  // joins the channel's thread
  FlightRecorder::configure(0);
  FlightRecorder::set_step(0);
}

bool FlightService::running() {
  std::lock_guard<std::mutex> lock(g_service_mutex);
  return g_service != nullptr;
}

std::vector<std::string> FlightService::hosts() {
  std::lock_guard<std::mutex> lock(g_service_mutex);
  return g_service ? g_service->channel->hosts() : std::vector<std::string>{};
}

void FlightService::install_signal_handler() {
  struct sigaction action {};
  action.sa_handler = on_sigusr2;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGUSR2, &action, nullptr);
}

FlightService::Run::Run(MPI_Comm world, std::size_t records, const std::string& dir, double timeout_s)
    : exceptions_(std::uncaught_exceptions()) {
  start(world, records, dir, timeout_s);
}

FlightService::Run::~Run() {
  if (std::uncaught_exceptions() == exceptions_) stop();
}

}  // namespace fsdpp
