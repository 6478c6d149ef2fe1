#pragma once
// A rank's flight records on disk: <dir>/rank<r>.json, written whole to a temporary name and renamed, so a
// reader sees a complete dump or none. What `fsdpp debug flight` reads (observe/flight_analysis.hpp):
//   format "fsdpp-flight 1", rank, world_size, host, pid, reason, step, timeout_s, dumped_at_s (the records'
//   clock), wall_time, hosts (of every world rank), not_answering (the ranks that did not answer this rank's
//   request to dump, when it made one), comms (id, label, backend, ranks, issued), and records (comm, seq, op,
//   count, dtype, site, step, state, issued_s, started_s, completed_s; null for times not reached).
#include <string>
#include <vector>

namespace fsdpp {

struct FlightDumpContext {
  int rank = 0;
  int world_size = 1;
  std::vector<std::string> hosts;  // host of every world rank
  std::string reason;              // "watchdog: ...", "SIGUSR2", "asked by rank 0: ..."
  double timeout_s = 0;            // comm.timeout_s of the run
  std::vector<int> not_answering;  // filled by the rank that asked the others to dump
};

// Writes this rank's records and the registry's communicators; returns the file's path. Throws Error when the
// folder cannot be created or written.
std::string write_flight_dump(const std::string& dir, const FlightDumpContext& context);

}  // namespace fsdpp
