#include "fsdpp/plan/simulate.hpp"

#include "fsdpp/runtime/error.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>

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

namespace {

// One rank's step as it plays out: the compute stream's clock and the communicator streams' queues. The ops are
// fed in order (compute, issue, wait), then drain() runs what was never waited for.
class StepSimulation {
 public:
  SimulatedStep out;

  void compute(const TimedOp& op) {
    const double began = now_;
    double left = op.seconds;
    while (left > 0) run_until_next_end(true, left);
    out.compute_s += now_ - began;
    out.compute_by_what[op.what] += now_ - began;
  }

  void issue(const TimedOp& op) {
    FSDPP_CHECK(!op.stream.empty(), "simulate: a collective issued on no stream (id {})", op.id);
    std::deque<Running>& queue = streams_[op.stream];
    queue.push_back({op.id, op.seconds, now_, op.beside_compute});
    ++unfinished_[op.id];
    stream_of_[op.id] = op.stream;
  }

  // Idles the compute stream until every collective issued under op.id has ended; the time is exposed on the
  // stream of its last issue.
  void wait(const TimedOp& op) {
    const auto it = unfinished_.find(op.id);
    if (it == unfinished_.end()) return;  // nothing was issued under this id (a group of one rank)
    double idle = 0;
    while (it->second > 0) {
      const double began = now_;
      run_until_next_end(false, idle);
      out.exposed_s[stream_of_[op.id]] += now_ - began;
    }
    unfinished_.erase(it);
  }

  // Never waited for: waited at the end; each stretch until a collective ends is charged to its stream.
  void drain() {
    double idle = 0;
    for (;;) {
      const bool any = std::any_of(streams_.begin(), streams_.end(), [](const auto& s) { return !s.second.empty(); });
      if (!any) break;
      const double began = now_;
      const std::string ended = run_until_next_end(false, idle);
      out.exposed_s[ended] += now_ - began;
    }
    out.seconds = now_;
  }

 private:
  // Each communicator stream runs the collective at its head; the rest queue behind it in issue order.
  struct Running {
    int id;
    double left;     // seconds still to run at full speed
    double started;  // when it reached the head of its stream
    BesideCompute slows;
  };

  // Runs everything until the first thing ends: the compute op (when `computing`, `compute_left` seconds of work
  // left) or the collective at a stream's head. Rates: compute runs at 1 / (1 + the largest compute_slowdown of the
  // collectives running); a collective at 1 / (1 + its collective_slowdown) while compute runs, else at 1.
  // Returns the stream whose collective ended ("" when the compute op did).
  std::string run_until_next_end(bool computing, double& compute_left) {
    double slowest = 0;
    for (const auto& [name, queue] : streams_)
      if (!queue.empty()) slowest = std::max(slowest, queue.front().slows.compute_slowdown);
    const double compute_rate = 1.0 / (1.0 + slowest);
    auto rate_of = [&](const Running& r) { return computing ? 1.0 / (1.0 + r.slows.collective_slowdown) : 1.0; };
    double dt = computing ? compute_left / compute_rate : std::numeric_limits<double>::infinity();
    std::string first;  // "" while the compute op ends first
    for (const auto& [name, queue] : streams_)
      if (!queue.empty() && queue.front().left / rate_of(queue.front()) < dt)
        dt = queue.front().left / rate_of(queue.front()), first = name;
    FSDPP_CHECK(std::isfinite(dt), "simulate: waiting with nothing running");
    now_ += dt;
    if (computing) compute_left = first.empty() ? 0 : std::max(0.0, compute_left - dt * compute_rate);
    for (auto& [name, queue] : streams_) {
      if (queue.empty()) continue;
      Running& head = queue.front();
      head.left = name == first ? 0 : std::max(0.0, head.left - dt * rate_of(head));
      if (name != first) continue;
      out.busy_s[name] += now_ - head.started;
      --unfinished_[head.id];
      queue.pop_front();
      if (!queue.empty()) queue.front().started = now_;
    }
    return first;
  }

  double now_ = 0;  // the compute stream's clock
  std::map<std::string, std::deque<Running>> streams_;
  std::map<int, int> unfinished_;         // by id: collectives issued under it and not yet ended
  std::map<int, std::string> stream_of_;  // by id: the stream of its last issue (exposed time goes there)
};

}  // namespace

SimulatedStep simulate(const std::vector<TimedOp>& ops) {
  StepSimulation sim;
  for (const TimedOp& op : ops) {
    switch (op.kind) {
      case TimedOp::Kind::compute: sim.compute(op); break;
      case TimedOp::Kind::issue: sim.issue(op); break;
      case TimedOp::Kind::wait: sim.wait(op); break;
    }
  }
  sim.drain();
  return std::move(sim.out);
}

}  // namespace fsdpp
