#pragma once
// The test-only fault switches of `fsdpp train`, read from the environment in one place. Each is
// "<fields separated by :>"; empty or unset is off; a malformed one is a UsageError naming the variable, the text
// and the expected form.
//   FSDPP_TEST_SAVE_FAULT=<point>:<save>[:<rank>][:crash]   a checkpoint save fails there (ckpt/save_faults.hpp)
//   FSDPP_TEST_SKIP_COLLECTIVE=<rank>:<dimension>:<seq>     that rank skips that collective (observe/collective_faults.hpp)
//   FSDPP_TEST_STALL=<rank>:<step>:<seconds>                that rank sleeps before that step (the watchdog's test)
#include <cstdint>
#include <functional>
#include <string>

namespace fsdpp {

struct StallFault {
  int rank = -1;          // the world rank that sleeps
  std::int64_t step = 0;  // before this optimizer step (1-based)
  double seconds = 0;
};

// "<rank>:<step>:<seconds>", e.g. "1:3:100"; UsageError naming FSDPP_TEST_STALL otherwise.
StallFault parse_stall(const std::string& text);

// Reads the three variables on this rank (`world_rank`, of MPI_COMM_WORLD), arms the save fault and, on its rank,
// the collective skip, and returns the hook TrainOptions::before_step runs for a stall on this rank (empty if none).
std::function<void(std::int64_t step)> arm_test_faults_from_environment(int world_rank);

}  // namespace fsdpp
