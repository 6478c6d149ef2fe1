// Device placement: local rank modulo the GPUs a rank sees, and a refusal only when two ranks of a node chose
// the same physical GPU (the same PCI bus id), unless sharing is allowed.
#include "mpi_test.hpp"

#include "fsdpp/runtime/device.hpp"
#include "fsdpp/runtime/error.hpp"

#include <string>
#include <vector>

using fsdpp::DevicePolicy;
using fsdpp::find_shared_gpu;
using fsdpp::plan_device;

TEST_CASE("device plan: local rank modulo the GPUs this rank sees") {
  for (int r = 0; r < 4; ++r) CHECK(plan_device(r, 4, DevicePolicy::automatic).device == r);
  CHECK(plan_device(5, 4, DevicePolicy::automatic).device == 1);
  CHECK_FALSE(plan_device(3, 8, DevicePolicy::cuda).conflict);
}

TEST_CASE("device plan: srun --gpus-per-task=1, every rank sees one GPU and takes ordinal 0") {
  // The count alone (4 ranks, 1 visible GPU each) is no conflict: the bus ids decide.
  for (int r = 0; r < 4; ++r) {
    const auto plan = plan_device(r, 1, DevicePolicy::cuda);
    CHECK_FALSE(plan.conflict);
    CHECK(plan.device == 0);
  }
}

TEST_CASE("device plan: no GPU means host, unless cuda was demanded") {
  CHECK(plan_device(0, 0, DevicePolicy::automatic).device == -1);
  CHECK_FALSE(plan_device(0, 0, DevicePolicy::automatic).conflict);
  CHECK(plan_device(0, 4, DevicePolicy::host).device == -1);
  const auto demanded = plan_device(0, 0, DevicePolicy::cuda);
  REQUIRE(demanded.conflict);
  CHECK(demanded.conflict->find("sees no CUDA GPU") != std::string::npos);
  CHECK(demanded.conflict->find("FSDPP_DEVICE=host") != std::string::npos);
  CHECK_THROWS_AS(fsdpp::parse_device_policy("tpu"), fsdpp::UsageError);
}

TEST_CASE("shared GPU check: four ranks on four distinct bus ids are fine") {
  const std::vector<std::string> ids{"0000:07:00.0", "0000:0B:00.0", "0000:48:00.0", "0000:4C:00.0"};
  CHECK_FALSE(find_shared_gpu(ids, {0, 1, 2, 3}, false));
  CHECK_FALSE(find_shared_gpu(ids, {}, false));
}

TEST_CASE("shared GPU check: two ranks on one bus id are refused, naming both ranks and the way out") {
  const auto conflict = find_shared_gpu({"0000:07:00.0", "0000:07:00.0"}, {4, 5}, false);
  REQUIRE(conflict);
  CHECK(conflict->find("ranks 4 and 5 (node-local ranks 0 and 1) would both run on the same GPU") !=
        std::string::npos);
  CHECK(conflict->find("0000:07:00.0") != std::string::npos);
  CHECK(conflict->find("srun --gpus-per-task=1") != std::string::npos);
  CHECK(conflict->find("FSDPP_ALLOW_GPU_SHARING=1") != std::string::npos);
  // Without world ranks the node-local ranks are named alone.
  const auto local_only = find_shared_gpu({"a", "b", "a", "a"}, {}, false);
  REQUIRE(local_only);
  CHECK(local_only->find("node-local ranks 0, 2 and 3 would all run") != std::string::npos);
}

TEST_CASE("shared GPU check: sharing allowed, or ranks on the host, is no conflict") {
  CHECK_FALSE(find_shared_gpu({"0000:07:00.0", "0000:07:00.0"}, {0, 1}, true));
  CHECK_FALSE(find_shared_gpu({"", "", ""}, {0, 1, 2}, false));
  CHECK_FALSE(find_shared_gpu({}, {}, false));
}
