#include "fsdpp/train/test_faults.hpp"

#include "fsdpp/ckpt/save_faults.hpp"
#include "fsdpp/observe/collective_faults.hpp"
#include "fsdpp/runtime/error.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace fsdpp {
namespace {

// The variable's text; empty when it is unset or empty (the switch is off).
std::string switch_text(const char* variable) {
  const char* text = std::getenv(variable);
  return text ? text : "";
}

}  // namespace

StallFault parse_stall(const std::string& text) {
  StallFault stall;
  long long step = 0;
  int used = 0;
  const bool ok = std::sscanf(text.c_str(), "%d:%lld:%lf%n", &stall.rank, &step, &stall.seconds, &used) == 3 &&
                  used == static_cast<int>(text.size()) && stall.rank >= 0 && step >= 1 && stall.seconds >= 0;
  FSDPP_REQUIRE(ok, "FSDPP_TEST_STALL='{}': expected <rank>:<step>:<seconds>, e.g. 1:3:100", text);
  stall.step = step;
  return stall;
}

std::function<void(std::int64_t step)> arm_test_faults_from_environment(int world_rank) {
  // A fault injected at a named point of a checkpoint save: a failed write, a crash mid-save.
  if (const std::string text = switch_text("FSDPP_TEST_SAVE_FAULT"); !text.empty())
    arm_save_fault(parse_save_fault(text));
  // One rank skips one collective, so the ranks desynchronise: the flight recorder's test.
  if (const std::string text = switch_text("FSDPP_TEST_SKIP_COLLECTIVE"); !text.empty()) {
    const CollectiveSkip skip = parse_collective_skip(text);
    if (skip.rank == world_rank) arm_collective_skip(skip);
  }
  // One rank sleeps before a step while the others wait in its first collective: the collective watchdog's test.
  const std::string text = switch_text("FSDPP_TEST_STALL");
  if (text.empty()) return {};
  const StallFault stall = parse_stall(text);
  if (stall.rank != world_rank) return {};
  return [stall](std::int64_t step) {
    if (step == stall.step) std::this_thread::sleep_for(std::chrono::duration<double>(stall.seconds));
  };
}

}  // namespace fsdpp
