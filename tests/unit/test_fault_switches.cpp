// The test-only fault switches of fsdpp train (train/test_faults.hpp): each variable's form, errors that name the
// variable and the form, and what arming does on the rank named and on the others.
#include "fsdpp/observe/collective_faults.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/train/test_faults.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <string>

using namespace fsdpp;

namespace {

// Sets the variables for one case and unsets them after, so no other test inherits a fault.
struct Environment {
  Environment(const char* stall, const char* skip) {
    unsetenv("FSDPP_TEST_SAVE_FAULT");
    if (stall) setenv("FSDPP_TEST_STALL", stall, 1);
    if (skip) setenv("FSDPP_TEST_SKIP_COLLECTIVE", skip, 1);
  }
  ~Environment() {
    unsetenv("FSDPP_TEST_STALL");
    unsetenv("FSDPP_TEST_SKIP_COLLECTIVE");
  }
};

}  // namespace

TEST_CASE("test faults: FSDPP_TEST_STALL's form, and its errors") {
  const StallFault s = parse_stall("1:3:2.5");
  CHECK(s.rank == 1);
  CHECK(s.step == 3);
  CHECK(s.seconds == 2.5);
  for (const char* bad : {"", "1:3", "1:3:100x", "a:3:1", "-1:3:1", "1:0:1", "1:3:-1", "1:3:1:4"}) {
    const std::string expected = "FSDPP_TEST_STALL='" + std::string(bad) + "': expected <rank>:<step>:<seconds>";
    CHECK_THROWS_WITH_AS(parse_stall(bad), doctest::Contains(expected.c_str()), UsageError);
  }
}

TEST_CASE("test faults: a stall hook only on the rank named, sleeping only before the step named") {
  const Environment env("0:2:0.2", nullptr);
  CHECK_FALSE(arm_test_faults_from_environment(1));
  const auto hook = arm_test_faults_from_environment(0);
  REQUIRE(hook);
  const auto seconds_of = [&](std::int64_t step) {
    const auto t0 = std::chrono::steady_clock::now();
    hook(step);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  CHECK(seconds_of(1) < 0.1);
  CHECK(seconds_of(2) >= 0.2);
}

TEST_CASE("test faults: the collective skip is armed on its rank only; a malformed switch names its variable") {
  {
    const Environment env(nullptr, "1:dp_shard:12");
    CHECK_FALSE(arm_test_faults_from_environment(0));  // no stall: no hook
    CHECK_FALSE(collective_fault_armed());
    arm_test_faults_from_environment(1);
    CHECK(collective_fault_armed());
    CHECK(take_collective_skip("dp_shard", 12));  // taken once, then disarmed
    CHECK_FALSE(collective_fault_armed());
  }
  const Environment env(nullptr, "1:dp_shard");
  CHECK_THROWS_WITH_AS(arm_test_faults_from_environment(0),
                       doctest::Contains("FSDPP_TEST_SKIP_COLLECTIVE='1:dp_shard': expected <rank>:<dimension>"),
                       UsageError);
}
