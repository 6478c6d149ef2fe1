#include "fsdpp/perf/simulate.hpp"

#include "fsdpp/runtime/error.hpp"

#include <algorithm>

namespace fsdpp {

std::string SimulatedStep::critical_resource() const {
  std::string best = "compute";
  double longest = compute_s;
  for (const auto& [stream, s] : busy_s)
    if (s > longest) best = stream, longest = s;
  return best;
}

double SimulatedStep::exposed_total_s() const {
  double total = 0;
  for (const auto& [stream, s] : exposed_s) total += s;
  return total;
}

SimulatedStep simulate(const std::vector<TimedOp>& ops) {
  SimulatedStep out;
  double now = 0;                          // the compute stream's clock
  std::map<std::string, double> free_at;   // each communicator stream: when its last collective ends
  struct InFlight {
    double end = 0;
    std::string stream;
  };
  std::map<int, InFlight> in_flight;       // by id; several issues under one id end at the latest
  auto wait_for = [&](const InFlight& f) {
    if (f.end > now) {
      out.exposed_s[f.stream] += f.end - now;
      now = f.end;
    }
  };
  for (const TimedOp& op : ops) {
    switch (op.kind) {
      case TimedOp::Kind::compute:
        now += op.seconds;
        out.compute_s += op.seconds;
        out.compute_by_what[op.what] += op.seconds;
        break;
      case TimedOp::Kind::issue: {
        FSDPP_CHECK(!op.stream.empty(), "simulate: a collective issued on no stream (id {})", op.id);
        const double start = std::max(now, free_at[op.stream]);
        free_at[op.stream] = start + op.seconds;
        out.busy_s[op.stream] += op.seconds;
        InFlight& f = in_flight[op.id];
        f.end = std::max(f.end, start + op.seconds);
        f.stream = op.stream;
        break;
      }
      case TimedOp::Kind::wait: {
        const auto it = in_flight.find(op.id);
        if (it == in_flight.end()) break;  // nothing was issued under this id (a group of one rank)
        wait_for(it->second);
        in_flight.erase(it);
        break;
      }
    }
  }
  std::vector<InFlight> left;  // never waited for: waited at the end, in the order they finish
  for (const auto& [id, f] : in_flight) left.push_back(f);
  std::sort(left.begin(), left.end(), [](const InFlight& a, const InFlight& b) { return a.end < b.end; });
  for (const InFlight& f : left) wait_for(f);
  out.seconds = now;
  return out;
}

}  // namespace fsdpp
