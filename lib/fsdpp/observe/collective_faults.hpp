#pragma once
// A fault switch for tests of the flight recorder: one rank skips one collective, as a rank whose code took
// another branch would, so that the ranks desynchronise. Nothing is armed unless a test arms it (fsdpp train
// does from FSDPP_TEST_SKIP_COLLECTIVE=<rank>:<dimension>:<sequence number>). Communicator::issue() asks
// take_collective_skip() only while a skip is armed: one relaxed atomic load otherwise.
#include <cstdint>
#include <string>

namespace fsdpp {

struct CollectiveSkip {
  int rank = -1;          // the world rank that skips
  std::string dimension;  // the communicator's label, "dp_shard"
  std::uint64_t seq = 0;  // the collective's sequence number on that communicator
};

// "<rank>:<dimension>:<seq>", e.g. "1:dp_shard:12"; UsageError naming the variable otherwise.
CollectiveSkip parse_collective_skip(const std::string& text);
void arm_collective_skip(const CollectiveSkip& skip);  // on the rank that skips
bool collective_fault_armed();
// True once: for the armed dimension and sequence number; the switch is then disarmed, so the collectives after
// it run (with sequence numbers one behind those of the other ranks).
bool take_collective_skip(const std::string& dimension, std::uint64_t seq);

}  // namespace fsdpp
