#include "fsdpp/observe/flight_recorder.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>

namespace fsdpp {
namespace {

using Clock = std::chrono::steady_clock;

struct Registry {
  std::mutex mutex;
  std::vector<CommEntry> comms;    // by id
  std::vector<FlightRecord> ring;  // record n lives in slot (n - 1) % size
  std::uint64_t next_number = 1;
  std::set<std::string> sites;     // interned site names: records point into it
  bool tracing = false;
  std::vector<FlightRecord> traced;  // tracing: the records that reached a final state, in that order
  std::atomic<std::int64_t> step{0};
  const Clock::time_point epoch = Clock::now();
};

// Never destroyed: a dump may be written from the watchdog's or the signal thread at any time, even while the
// process exits.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

thread_local const std::string* t_site = nullptr;            // FlightSite
thread_local std::vector<const std::string*> t_units;        // FlightSite::enter_unit, innermost last

const std::string* intern(const std::string& text) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return &*r.sites.insert(text).first;
}

// The slot of record `number`, or nullptr when it was never recorded or has been overwritten since.
FlightRecord* slot_of(Registry& r, std::uint64_t number) {
  if (number == 0 || r.ring.empty()) return nullptr;
  FlightRecord& slot = r.ring[(number - 1) % r.ring.size()];
  return slot.number == number ? &slot : nullptr;
}

void mark(const CollectiveTicket& ticket, RecordState state) {
  if (ticket.record == 0) return;
  Registry& r = registry();
  const double now = FlightRecorder::now_s();
  std::lock_guard<std::mutex> lock(r.mutex);
  FlightRecord* record = slot_of(r, ticket.record);
  // A final state stays: the watchdog and a waiting host may both see the end of one device collective.
  if (!record || record->state == RecordState::completed || record->state == RecordState::failed) return;
  record->state = state;
  if (state == RecordState::started) record->started_s = now;
  else record->completed_s = now;
  if (r.tracing && state != RecordState::started) r.traced.push_back(*record);
}

std::string unit_site(const std::string& unit, bool backward) {
  return unit + (backward ? " backward" : " forward") + " (tensor parallel)";
}

}  // namespace

const char* collective_op_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::all_gather: return "all_gather";
    case CollectiveOp::reduce_scatter: return "reduce_scatter";
    case CollectiveOp::all_reduce: return "all_reduce";
    case CollectiveOp::broadcast: return "broadcast";
    case CollectiveOp::barrier: return "barrier";
    case CollectiveOp::all_to_all: return "all_to_all";
    case CollectiveOp::send: return "send";
    case CollectiveOp::receive: return "recv";
  }
  return "?";
}

const char* record_state_name(RecordState state) {
  switch (state) {
    case RecordState::issued: return "issued";
    case RecordState::started: return "started";
    case RecordState::completed: return "completed";
    case RecordState::failed: return "failed";
  }
  return "?";
}

void FlightRecorder::configure(std::size_t capacity) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.ring.assign(capacity, FlightRecord{});
  r.ring.shrink_to_fit();
  r.next_number = 1;
}

std::size_t FlightRecorder::capacity() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.ring.size();
}

void FlightRecorder::set_step(std::int64_t step) { registry().step.store(step, std::memory_order_relaxed); }
std::int64_t FlightRecorder::step() { return registry().step.load(std::memory_order_relaxed); }

double FlightRecorder::now_s() {
  return std::chrono::duration<double>(Clock::now() - registry().epoch).count();
}

std::uint32_t FlightRecorder::register_comm(std::string backend) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  CommEntry entry;
  entry.id = static_cast<std::uint32_t>(r.comms.size());
  entry.label = "a group";
  entry.backend = std::move(backend);
  r.comms.push_back(std::move(entry));
  return r.comms.back().id;
}

void FlightRecorder::set_label(std::uint32_t comm, std::string label) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.comms.at(comm).label = std::move(label);
}

void FlightRecorder::set_members(std::uint32_t comm, std::vector<int> world_ranks, int rank_in_group) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.comms.at(comm).world_ranks = std::move(world_ranks);
  r.comms.at(comm).rank_in_group = rank_in_group;
}

std::string FlightRecorder::label(std::uint32_t comm) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return comm < r.comms.size() ? r.comms[comm].label : std::string("a group");
}

CollectiveTicket FlightRecorder::issue(std::uint32_t comm, std::uint64_t seq, CollectiveOp op, std::size_t count,
                                       DType dtype, std::uint64_t ring_bytes_out) {
  CollectiveTicket ticket{0, comm, seq, op};
  Registry& r = registry();
  const double now = now_s();
  const std::string* site = t_site ? t_site : t_units.empty() ? nullptr : t_units.back();
  std::lock_guard<std::mutex> lock(r.mutex);
  CommEntry& entry = r.comms.at(comm);
  entry.issued = seq;
  entry.payload_bytes += count * dtype_size(dtype);
  entry.ring_bytes_out += ring_bytes_out;
  if (r.ring.empty()) return ticket;
  ticket.record = r.next_number++;
  FlightRecord& record = r.ring[(ticket.record - 1) % r.ring.size()];
  record = FlightRecord{};
  record.number = ticket.record;
  record.comm = comm;
  record.seq = seq;
  record.op = op;
  record.dtype = dtype;
  record.count = count;
  record.step = r.step.load(std::memory_order_relaxed);
  record.site = site;
  record.issued_s = now;
  return ticket;
}

void FlightRecorder::started(const CollectiveTicket& ticket) { mark(ticket, RecordState::started); }
void FlightRecorder::completed(const CollectiveTicket& ticket) { mark(ticket, RecordState::completed); }
void FlightRecorder::failed(const CollectiveTicket& ticket) { mark(ticket, RecordState::failed); }

std::string FlightRecorder::site_of(const CollectiveTicket& ticket) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const FlightRecord* record = slot_of(r, ticket.record);
  return record && record->site ? *record->site : std::string();
}

FlightRecord FlightRecorder::record_of(const CollectiveTicket& ticket) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const FlightRecord* record = slot_of(r, ticket.record);
  return record ? *record : FlightRecord{};
}

void FlightRecorder::set_tracing(bool on) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.tracing = on;
  if (on) r.traced.reserve(std::max<std::size_t>(r.traced.capacity(), 4096));
}

std::vector<FlightRecord> FlightRecorder::take_traced() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<FlightRecord> out;
  out.swap(r.traced);
  return out;
}

std::vector<FlightRecord> FlightRecorder::records() {
  Registry& r = registry();
  std::vector<FlightRecord> out;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    for (const FlightRecord& record : r.ring)
      if (record.number != 0) out.push_back(record);
  }
  std::sort(out.begin(), out.end(), [](const FlightRecord& a, const FlightRecord& b) { return a.number < b.number; });
  return out;
}

std::vector<CommEntry> FlightRecorder::comms() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.comms;
}

FlightSite::FlightSite(const std::string& site) : previous_(t_site) { t_site = intern(site); }
FlightSite::~FlightSite() { t_site = previous_; }

void FlightSite::enter_unit(const std::string& unit, bool backward) { t_units.push_back(intern(unit_site(unit, backward))); }

void FlightSite::leave_unit(const std::string& unit, bool backward) {
  // Only the innermost unit leaves: hooks that do not nest (an exception mid-pass) cannot unbalance the stack.
  if (!t_units.empty() && *t_units.back() == unit_site(unit, backward)) t_units.pop_back();
}

}  // namespace fsdpp
