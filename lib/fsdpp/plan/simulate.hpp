#pragma once
// Replays a priced step (TimedOp list, program order) as an event simulation: one compute stream, which is also
// the thread that issues collectives and waits for them, and one stream per communicator, each running its
// collectives one at a time in issue order. A collective starts when the compute stream has reached its issue
// point and its stream is free; a wait holds the compute stream until the collective ends, and the time held is
// that communicator's exposed time. What is still running at the end is waited for then (exposed too).
// Where compute and communication share a device's resources (CPU cores here), each slows the other while both
// run: a collective's beside_compute figures (from its link class, plan/machine.hpp) set the
// rates, so the replay is a fluid one between events; with both 0 it is the plain event replay.
#include "fsdpp/fsdp/time_events.hpp"

#include <map>
#include <string>
#include <vector>

namespace fsdpp {

struct SimulatedStep {
  double seconds = 0;                          // the step: every stream drained
  double compute_s = 0;                        // busy time of the compute stream (slowed by collectives beside it)
  std::map<std::string, double> busy_s;        // per communicator stream: time its collectives ran
  std::map<std::string, double> exposed_s;     // per communicator stream: time the compute stream waited for it
  std::map<std::string, double> compute_by_what;  // TimedOp::what -> seconds
  // The resource busy longest (the step cannot be shorter): "compute", or a communicator stream's name.
  std::string critical_resource() const;
  double exposed_total_s() const;
};

SimulatedStep simulate(const std::vector<TimedOp>& ops);

}  // namespace fsdpp
