// Overlapped gradient reductions (comm.overlap) and prefetch depth (fsdp.forward_prefetch/backward_prefetch)
// change when collectives are waited for, never what they compute: losses, final weights and collective counts
// are bitwise those of the blocking schedule, and with overlap off the memory plan is the one before overlap.
#include "input_decks.hpp"
#include "mpi_test.hpp"
#include "train_runs.hpp"

#include "fsdpp/fsdp/fully_shard.hpp"
#include "fsdpp/optim/lr_schedule.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/runtime/timers.hpp"
#include "fsdpp/parallel/build_model.hpp"
#include "fsdpp/train/data_feed.hpp"
#include "fsdpp/plan/memory_plan.hpp"
#include "fsdpp/train/train_step.hpp"
#include "fsdpp/train/trainer.hpp"

#include <string>
#include <vector>

using namespace fsdpp;
using test::with;

namespace {

const std::vector<std::string> kOverlapCommon = {"train.steps=4", "train.eval_interval=0", "schedule.warmup_steps=1",
                                                 "train.micro_batch=4"};

Deck tiny_overlap(const std::vector<std::string>& extra) {
  return test::input_deck("tiny.yaml", with(kOverlapCommon, extra));
}

using test::run_steps;
using test::StepsRun;

// Collectives and the bytes they move: the same whatever the schedule (peaks and waits may differ).
void check_same_collectives(const FsdpStats& got, const FsdpStats& want) {
  CHECK(got.forward_all_gathers == want.forward_all_gathers);
  CHECK(got.backward_all_gathers == want.backward_all_gathers);
  CHECK(got.reduce_scatters == want.reduce_scatters);
  CHECK(got.all_reduces == want.all_reduces);
  CHECK(got.all_gather_bytes == want.all_gather_bytes);
  CHECK(got.reduce_scatter_bytes == want.reduce_scatter_bytes);
  CHECK(got.host_to_device_bytes == want.host_to_device_bytes);
  CHECK(got.device_to_host_bytes == want.device_to_host_bytes);
}

void check_same_run_and_collectives(const StepsRun& got, const StepsRun& want) {
  test::check_bitwise(got.losses, want.losses, "loss");
  test::check_bitwise(got.weights, want.weights, "final weight");
  REQUIRE(got.stats.size() == want.stats.size());
  for (std::size_t s = 0; s < got.stats.size(); ++s) {
    CAPTURE(s);
    check_same_collectives(got.stats[s], want.stats[s]);
  }
}

const std::vector<std::vector<std::string>> kLayouts = {
    {"fsdp.strategy=full_shard"},
    {"fsdp.strategy=shard_grad_op"},
    {"fsdp.strategy=no_shard"},
    {"fsdp.strategy=hybrid_shard", "mesh.dp_replicate=2", "mesh.dp_shard=2"},
    {"fsdp.reshard_after_forward=2"},
    {"fsdp.offload=cpu"},
    {"fsdp.accumulate=unsharded", "train.micro_batch=2"},
    {"train.micro_batch=2"},
    {"fsdp.reduce_dtype=bf16"},
    {"fsdp.param_dtype=bf16", "fsdp.reduce_dtype=bf16", "matmul.precision=f32"},
    {"train.activation_checkpointing=full"},
    {"fsdp.strategy=hybrid_shard", "mesh.dp_replicate=2", "mesh.dp_shard=2", "train.activation_checkpointing=full"},
    {"fsdp.strategy=hybrid_shard", "mesh.dp_replicate=2", "mesh.dp_shard=2", "train.micro_batch=2"},
};

}  // namespace

MPI_TEST_CASE("overlap: reductions in flight give bitwise the blocking schedule's losses, weights and collectives", 4) {
  for (const auto& layout : kLayouts) {
    CAPTURE(layout.back());
    const StepsRun blocking = run_steps(test_comm, tiny_overlap(with(layout, {"comm.overlap=false"})));
    const StepsRun overlapped = run_steps(test_comm, tiny_overlap(with(layout, {"comm.overlap=true"})));
    check_same_run_and_collectives(overlapped, blocking);
    // Something was reduced at all: the comparison is not between two empty schedules.
    CHECK(blocking.stats.front().reduce_scatters + blocking.stats.front().all_reduces > 0);
  }
}

MPI_TEST_CASE("overlap: with comm.overlap false the memory plan is the one before overlap, to the byte", 4) {
  // Recorded from `fsdpp plan input/tiny.yaml train.micro_batch=4 <layout> --ranks 4 --json` at 36e2dcf, before
  // reductions could be in flight: total, unsharded parameters, unsharded gradients, communication buffers, pool.
  struct Pinned {
    std::vector<std::string> layout;
    std::int64_t total, unsharded_parameters, unsharded_gradients, comm_buffers, pool_cached;
    const char* peak;
  };
  const char* rs_h1 = "backward: reduce-scatter buffers of h.1 allocated";
  const std::vector<Pinned> pinned = {
      {{"fsdp.strategy=full_shard"}, 5524800, 233216, 233216, 449856, 33280, rs_h1},
      {{"fsdp.strategy=shard_grad_op"}, 5524800, 433152, 233216, 249920, 33280, rs_h1},
      {{"fsdp.strategy=no_shard"}, 6107904, 0, 233216, 0, 0, "backward: whole gradients of h.1 allocated"},
      {{"fsdp.strategy=hybrid_shard", "mesh.dp_replicate=2", "mesh.dp_shard=2"}, 6141184, 233216, 233216, 499840,
       166528, rs_h1},
      {{"fsdp.reduce_dtype=bf16"}, 5379008, 233216, 233216, 324896, 12448, rs_h1},
      {{"train.activation_checkpointing=full"}, 4275520, 233216, 233216, 449856, 33280, rs_h1},
      {{"train.micro_batch=2"}, 3453760, 233216, 233216, 449856, 33280, rs_h1},
      {{"fsdp.strategy=hybrid_shard", "mesh.dp_replicate=2", "mesh.dp_shard=2", "train.activation_checkpointing=full"},
       4891904, 233216, 233216, 499840, 166528, rs_h1},
  };
  for (const Pinned& p : pinned) {
    CAPTURE(p.layout.back());
    const MemoryPlan blocking = plan_memory(tiny_overlap(with(p.layout, {"comm.overlap=false"})), 4);
    const PlannedMemory& m = blocking.memory;
    CHECK(m.total() == p.total);
    CHECK(m.unsharded_parameters == p.unsharded_parameters);
    CHECK(m.unsharded_gradients == p.unsharded_gradients);
    CHECK(m.comm_buffers == p.comm_buffers);
    CHECK(m.pool_cached == p.pool_cached);
    CHECK(blocking.peak_moment == p.peak);
    CHECK_FALSE(blocking.reduce_scatter_in_flight);
    // In flight, a unit's reduce-scatter buffers live through the next unit's backward: never fewer live bytes
    // at the peak (the pool may cache differently: its free blocks are left out).
    const MemoryPlan overlapped = plan_memory(tiny_overlap(p.layout), 4);
    CHECK(overlapped.reduce_scatter_in_flight);
    CHECK(overlapped.memory.total() - overlapped.memory.pool_cached >= m.total() - m.pool_cached);
  }
}

MPI_TEST_CASE("overlap: prefetch depth 0, 1, 2 and explicit lists give bitwise losses and the same all-gathers", 4) {
  const StepsRun one = run_steps(test_comm, tiny_overlap({}));
  for (const std::vector<std::string>& prefetch :
       {std::vector<std::string>{"fsdp.forward_prefetch=0", "fsdp.backward_prefetch=0"},
        {"fsdp.forward_prefetch=2", "fsdp.backward_prefetch=2"},
        {"fsdp.forward_prefetch=root:h.0,h.1", "fsdp.backward_prefetch=root:h.1;h.1:h.0"},
        {"fsdp.backward_prefetch=h.1:h.0", "comm.overlap=false"},
        {"fsdp.forward_prefetch=2", "fsdp.strategy=hybrid_shard", "mesh.dp_replicate=2", "mesh.dp_shard=2"}}) {
    CAPTURE(prefetch.front());
    const bool hsdp = prefetch.back() == "mesh.dp_shard=2";
    const StepsRun got = run_steps(test_comm, tiny_overlap(prefetch));
    if (hsdp) {
      const StepsRun want = run_steps(test_comm, tiny_overlap({"fsdp.strategy=hybrid_shard", "mesh.dp_replicate=2",
                                                               "mesh.dp_shard=2"}));
      check_same_run_and_collectives(got, want);
    } else {
      check_same_run_and_collectives(got, one);
    }
  }
}

MPI_TEST_CASE("overlap: a prefetch list naming no unit, or a unit itself, is refused with the units listed", 2) {
  CHECK_THROWS_WITH_AS(build_model(test_comm, tiny_overlap({"fsdp.forward_prefetch=h.0:h.7"})),
                       "fsdp.forward_prefetch: 'h.7' is not a unit of this model; its units are h.0, h.1, root",
                       UsageError);
  CHECK_THROWS_WITH_AS(build_model(test_comm, tiny_overlap({"fsdp.backward_prefetch=block.1:h.0"})),
                       "fsdp.backward_prefetch: 'block.1' is not a unit of this model; its units are h.0, h.1, root",
                       UsageError);
  CHECK_THROWS_WITH_AS(build_model(test_comm, tiny_overlap({"fsdp.backward_prefetch=h.1:h.0,h.1"})),
                       doctest::Contains("fsdp.backward_prefetch: unit h.1 prefetches itself"), UsageError);
}
