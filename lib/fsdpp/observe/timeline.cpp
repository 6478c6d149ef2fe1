#include "fsdpp/observe/timeline.hpp"

#include "fsdpp/observe/flight_recorder.hpp"
#include "fsdpp/runtime/error.hpp"

#include <Kokkos_Core.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace fsdpp {

namespace timeline_names {
const std::string data = "fsdpp::data", grad_sync = "fsdpp::grad_sync", optimizer = "fsdpp::optimizer",
                  eval = "fsdpp::eval", checkpoint = "fsdpp::checkpoint", sample = "fsdpp::sample",
                  pipeline_receive = "fsdpp::pipeline_receive";
}

std::string timeline_region(const char* what, const std::string& unit) { return fmt::format("fsdpp::{} {}", what, unit); }

namespace {

struct Span {
  std::string name;
  double t0 = 0, t1 = 0;  // FlightRecorder::now_s
  nlohmann::json args;    // null: none
};

struct TimelineState {
  std::mutex mutex;
  std::int64_t first = 0, last = 0;
  std::string dir;
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, world = 1;
  bool started = false;
  std::int64_t first_recorded = 0, last_recorded = 0;
  double sync_s = 0;
  std::thread::id main_thread;
  std::vector<std::uint64_t> issued_begin;  // per communicator id, when recording started
  std::vector<Span> spans;                  // the compute track
  std::map<std::string, std::int64_t> counters;
};

TimelineState& timeline_state() {
  static TimelineState s;
  return s;
}

// The spans entered and not yet left on this thread: the name's address and the start.
thread_local std::vector<std::pair<const std::string*, double>> t_open;

std::int64_t to_ns(double seconds) { return std::llround(seconds * 1e9); }

// A complete event ("ph": "X") in microseconds; start and end are rounded to nanoseconds first, so spans that
// nest in seconds still nest in the file.
nlohmann::json complete_event(const std::string& name, const char* category, int pid, std::uint32_t tid, double t0,
                              double t1, nlohmann::json args) {
  const std::int64_t start = to_ns(t0), end = std::max(start, to_ns(t1));
  nlohmann::json e = {{"name", name}, {"cat", category}, {"ph", "X"}, {"pid", pid}, {"tid", tid},
                      {"ts", static_cast<double>(start) / 1000.0}, {"dur", static_cast<double>(end - start) / 1000.0}};
  if (!args.is_null()) e["args"] = std::move(args);
  return e;
}

nlohmann::json metadata(const char* what, int pid, std::uint32_t tid, const std::string& name) {
  return {{"name", what}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}};
}

// "fsdpp::backward h.3" -> "backward"; "wait all_gather h.1 ..." -> "wait".
std::string category_of(const std::string& name) {
  std::string word = name.substr(0, name.find(' '));
  if (word.rfind("fsdpp::", 0) == 0) word = word.substr(7);
  return word;
}

nlohmann::json collective_event(const FlightRecord& r, int pid, const std::string& label) {
  nlohmann::json args = {{"op", collective_op_name(r.op)},
                         {"bytes", r.count * dtype_size(r.dtype)},
                         {"count", r.count},
                         {"dtype", std::string(dtype_name(r.dtype))},
                         {"site", r.site ? *r.site : std::string()},
                         {"seq", r.seq},
                         {"comm", label},
                         {"step", r.step},
                         {"state", record_state_name(r.state)},
                         {"issued_us", static_cast<double>(to_ns(r.issued_s)) / 1000.0},
                         {"queued_ms", (r.started_s - r.issued_s) * 1e3}};
  const std::string name = r.site ? fmt::format("{} {}", collective_op_name(r.op), *r.site) : collective_op_name(r.op);
  return complete_event(name, collective_op_name(r.op), pid, 1 + r.comm, r.started_s, r.completed_s, std::move(args));
}

void write_trace(TimelineState& s) {
  const std::vector<CommEntry> comms = FlightRecorder::comms();
  std::vector<FlightRecord> records = FlightRecorder::take_traced();
  nlohmann::json events = nlohmann::json::array();
  std::set<std::string> units;
  for (const Span& span : s.spans) {
    const std::string category = category_of(span.name);
    if (category == "forward") units.insert(span.name.substr(span.name.find(' ') + 1));
    events.push_back(complete_event(span.name, category.c_str(), s.rank, 0, span.t0, span.t1, span.args));
  }
  // The collectives issued while recording: per communicator, sequence numbers after issued_begin.
  std::map<std::uint32_t, std::uint64_t> events_per_comm;
  for (const FlightRecord& r : records) {
    const std::uint64_t begin = r.comm < s.issued_begin.size() ? s.issued_begin[r.comm] : 0;
    if (r.seq <= begin || r.started_s < 0 || r.completed_s < 0) continue;
    events.push_back(collective_event(r, s.rank, comms.at(r.comm).label));
    ++events_per_comm[r.comm];
  }
  std::stable_sort(events.begin(), events.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
    const auto key = [](const nlohmann::json& e) {
      return std::make_tuple(e["tid"].get<std::uint32_t>(), e["ts"].get<double>(), -e["dur"].get<double>());
    };
    return key(a) < key(b);
  });
  events.push_back(metadata("process_name", s.rank, 0, fmt::format("rank {}", s.rank)));
  events.push_back(metadata("thread_name", s.rank, 0, "compute"));
  nlohmann::json comm_info = nlohmann::json::array();
  for (const CommEntry& c : comms) {
    const std::uint64_t begin = c.id < s.issued_begin.size() ? s.issued_begin[c.id] : 0;
    if (c.issued <= begin) continue;  // nothing issued while recording: no track
    events.push_back(metadata("thread_name", s.rank, 1 + c.id, fmt::format("{} ({})", c.label, c.backend)));
    comm_info.push_back({{"id", c.id}, {"tid", 1 + c.id}, {"label", c.label}, {"backend", c.backend},
                         {"ranks", c.world_ranks}, {"issued_begin", begin}, {"issued_end", c.issued},
                         {"events", events_per_comm[c.id]}});
  }
  nlohmann::json trace = {
      {"traceEvents", std::move(events)},
      {"displayTimeUnit", "ms"},
      {"otherData",
       {{"format", "fsdpp-trace 1"}, {"rank", s.rank}, {"world", s.world},
        {"steps", {s.first_recorded, s.last_recorded}}, {"sync_us", static_cast<double>(to_ns(s.sync_s)) / 1000.0},
        {"units", std::vector<std::string>(units.begin(), units.end())}, {"comms", std::move(comm_info)},
        {"counters", s.counters}}}};
  std::error_code ec;
  std::filesystem::create_directories(s.dir, ec);
  FSDPP_CHECK(!ec, "run.trace: cannot create {}: {}", s.dir, ec.message());
  const std::string path = fmt::format("{}/rank{}.json", s.dir, s.rank), partial = path + ".partial";
  {
    std::ofstream out(partial);
    out << trace.dump() << '\n';
    FSDPP_CHECK(out.good(), "run.trace: cannot write {}", partial);
  }
  std::filesystem::rename(partial, path, ec);
  FSDPP_CHECK(!ec, "run.trace: cannot rename {} to {}: {}", partial, path, ec.message());
}

void stop_recording() {
  timeline_detail::recording.store(false, std::memory_order_relaxed);
  FlightRecorder::set_tracing(false);
}

}  // namespace

void Timeline::configure(std::int64_t first, std::int64_t last, std::string dir, MPI_Comm comm) {
  reset();
  TimelineState& s = timeline_state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.first = first;
  s.last = last;
  s.dir = std::move(dir);
  s.comm = comm;
  if (comm != MPI_COMM_NULL) {
    MPI_Comm_rank(comm, &s.rank);
    MPI_Comm_size(comm, &s.world);
  }
}

void Timeline::reset() {
  TimelineState& s = timeline_state();
  stop_recording();
  FlightRecorder::take_traced();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.first = s.last = 0;
  s.started = false;
  s.spans.clear();
  s.counters.clear();
  s.issued_begin.clear();
  t_open.clear();
}

void Timeline::begin_step(std::int64_t step) {
  TimelineState& s = timeline_state();
  if (s.first == 0 || s.started || step < s.first || step > s.last) return;
  if (s.comm != MPI_COMM_NULL) MPI_Barrier(s.comm);  // the ranks' common instant: sync_us, for merging
  std::lock_guard<std::mutex> lock(s.mutex);
  s.started = true;
  s.first_recorded = s.last_recorded = step;
  s.sync_s = FlightRecorder::now_s();
  s.main_thread = std::this_thread::get_id();
  s.issued_begin.clear();
  for (const CommEntry& c : FlightRecorder::comms()) s.issued_begin.push_back(c.issued);
  s.spans.reserve(4096);
  t_open.clear();
  FlightRecorder::take_traced();
  FlightRecorder::set_tracing(true);
  timeline_detail::recording.store(true, std::memory_order_relaxed);
}

void Timeline::end_step(std::int64_t step) {
  TimelineState& s = timeline_state();
  if (!recording()) return;
  s.last_recorded = step;
  if (step < s.last) return;
  finish();
}

void Timeline::finish() {
  TimelineState& s = timeline_state();
  if (!recording()) return;
  stop_recording();
  std::lock_guard<std::mutex> lock(s.mutex);
  write_trace(s);
  s.spans.clear();
  s.first = 0;  // written once
}

void Timeline::add_counter(const char* name, std::int64_t value) {
  if (!recording()) return;
  TimelineState& s = timeline_state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.counters[name] += value;
}

void Timeline::enter(const std::string& name) {
  Kokkos::Profiling::pushRegion(name);
  if (recording()) t_open.emplace_back(&name, FlightRecorder::now_s());
}

void Timeline::leave(const std::string& name) {
  Kokkos::Profiling::popRegion();
  if (!recording() || t_open.empty()) return;
  // Spans an exception skipped the leave of are dropped with the one that encloses them.
  const auto it = std::find_if(t_open.rbegin(), t_open.rend(), [&](const auto& open) { return open.first == &name; });
  if (it == t_open.rend()) return;
  const double t0 = it->second, t1 = FlightRecorder::now_s();
  t_open.erase(std::prev(it.base()), t_open.end());
  TimelineState& s = timeline_state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.spans.push_back(Span{name, t0, t1, nullptr});
}

void Timeline::waited(const CollectiveTicket& ticket, double t0, double t1, bool blocking) {
  if (!recording() || ticket.record == 0) return;
  TimelineState& s = timeline_state();
  if (std::this_thread::get_id() != s.main_thread) return;  // the compute track is the main thread's
  const FlightRecord r = FlightRecorder::record_of(ticket);
  if (r.number == 0) return;
  // Never longer than the collective: from its issue (or the wait's start) to its completion (or the return).
  const double start = std::max(t0, r.issued_s);
  const double end = std::max(start, r.completed_s >= 0 ? std::min(t1, r.completed_s) : t1);
  const std::string site = r.site ? *r.site : std::string();
  nlohmann::json args = {{"comm", FlightRecorder::label(r.comm)}, {"comm_id", r.comm}, {"seq", r.seq},
                         {"op", collective_op_name(r.op)}, {"site", site},
                         {"handoff_us", r.completed_s >= 0 ? std::max(0.0, t1 - r.completed_s) * 1e6 : 0.0}};
  std::lock_guard<std::mutex> lock(s.mutex);
  std::string name = fmt::format("{} {}", blocking ? "blocking" : "wait", collective_op_name(r.op));
  if (!site.empty()) name += " " + site;
  s.spans.push_back(Span{std::move(name), start, end, std::move(args)});
}

}  // namespace fsdpp
