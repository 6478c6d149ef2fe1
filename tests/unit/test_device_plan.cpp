// Device placement: local rank modulo visible GPUs, and a refusal when two ranks would share one GPU.
#include "mpi_test.hpp"

#include "fsdpp/runtime/device.hpp"
#include "fsdpp/runtime/error.hpp"

using fsdpp::DevicePolicy;
using fsdpp::plan_device;

TEST_CASE("device plan: one rank per GPU maps local rank to device") {
  for (int r = 0; r < 4; ++r) CHECK(plan_device(r, 4, 4, DevicePolicy::automatic, false).device == r);
  CHECK_FALSE(plan_device(3, 4, 8, DevicePolicy::automatic, false).conflict);
}

TEST_CASE("device plan: two ranks on one GPU is refused with advice, unless allowed") {
  const auto plan = plan_device(1, 2, 1, DevicePolicy::automatic, false);
  REQUIRE(plan.conflict);
  CHECK(plan.conflict->find("2 ranks on this node would share 1 visible GPU") != std::string::npos);
  CHECK(plan.conflict->find("FSDPP_ALLOW_GPU_SHARING=1") != std::string::npos);
  const auto allowed = plan_device(3, 4, 2, DevicePolicy::automatic, true);
  CHECK_FALSE(allowed.conflict);
  CHECK(allowed.device == 1);
}

TEST_CASE("device plan: no GPU means host, unless cuda was demanded") {
  CHECK(plan_device(0, 2, 0, DevicePolicy::automatic, false).device == -1);
  CHECK_FALSE(plan_device(0, 2, 0, DevicePolicy::automatic, false).conflict);
  CHECK(plan_device(0, 1, 4, DevicePolicy::host, false).device == -1);
  const auto demanded = plan_device(0, 1, 0, DevicePolicy::cuda, false);
  REQUIRE(demanded.conflict);
  CHECK(demanded.conflict->find("sees no CUDA GPU") != std::string::npos);
  CHECK_THROWS_AS(fsdpp::parse_device_policy("tpu"), fsdpp::UsageError);
}
