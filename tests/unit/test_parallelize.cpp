// parallelize: the deck's layout (mesh, backend, options per strategy), the planning mesh that refuses to
// communicate, and the dry run whose memory events fsdpp plan sums.
#include "input_decks.hpp"
#include "mpi_test.hpp"

#include "fsdpp/config/deck_rules.hpp"
#include "fsdpp/parallel/parallelize.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/nn/gpt.hpp"
#include "fsdpp/nn/llama.hpp"
#include "fsdpp/nn/qwen2.hpp"
#include "fsdpp/parallel/build_model.hpp"
#include "fsdpp/plan/memory_plan.hpp"

#include <map>

using namespace fsdpp;

namespace {

Deck tiny(const std::vector<std::string>& overrides) { return test::input_deck("tiny.yaml", overrides); }

// Sums a dry step's events per buffer kind and keeps the running total and its peak.
struct EventLedger final : FsdpMemoryListener {
  std::map<FsdpBuffer, std::int64_t> live;
  std::int64_t total = 0, peak = 0, events = 0;
  void on_memory(const FsdpMemoryEvent& e) override {
    live[e.buffer] += e.bytes;
    total += e.bytes;
    peak = std::max(peak, total);
    ++events;
  }
};

std::shared_ptr<EventLedger> dry_step(Gpt& model, Parallelism& par, int micro_batches) {
  auto ledger = std::make_shared<EventLedger>();
  par.root().add_memory_listener(ledger);
  Flow flow;
  for (int a = 0; a < micro_batches; ++a) {
    par.before_micro_batch(a, micro_batches);
    model.dry_run(flow, Pass::forward);
    model.dry_run(flow, Pass::backward);
  }
  return ledger;
}

}  // namespace

TEST_CASE("parallelize: comm.backend auto is MPI on a host build; nccl there is a clear error") {
#if !defined(FSDPP_DEVICE_BUILD)
  CHECK(choose_backend(CommBackendChoice::automatic) == CommBackend::mpi);
  CHECK_THROWS_WITH_AS(choose_backend(CommBackendChoice::nccl),
                       doctest::Contains("comm.backend is nccl, but this fsdpp computes on the host"), UsageError);
  CHECK_THROWS_WITH_AS(parallel_layout(tiny({"comm.backend=nccl"}), 2), doctest::Contains("Use comm.backend: mpi"),
                       UsageError);
#else
  CHECK(choose_backend(CommBackendChoice::automatic) == CommBackend::nccl);
#endif
  CHECK(choose_backend(CommBackendChoice::mpi) == CommBackend::mpi);
}

TEST_CASE("parallelize: each strategy is a layout of the one machinery") {
  const ParallelLayout full = parallel_layout(tiny({}), 4);
  REQUIRE(full.mesh.size() == 1);
  CHECK(full.mesh[0].size == 4);
  CHECK(full.sync_every_micro_batch);
  CHECK(full.loss_scale_ranks == 1);

  const ParallelLayout ddp = parallel_layout(tiny({"fsdp.strategy=no_shard"}), 3);
  REQUIRE(ddp.mesh.size() == 2);
  CHECK(ddp.mesh[0].name == "dp_replicate");
  CHECK(ddp.mesh[0].size == 3);
  CHECK(ddp.mesh[1].size == 1);
  CHECK_FALSE(ddp.sync_every_micro_batch);  // DDP's no_sync until the last micro-batch
  CHECK(ddp.loss_scale_ranks == 3);
  CHECK(ddp.gradient_divide_factor == 1);

  const ParallelLayout zero2 = parallel_layout(tiny({"fsdp.strategy=shard_grad_op"}), 2);
  CHECK(zero2.block_options.reshard_after_forward == false);
  CHECK(zero2.root_options.reshard_after_forward == false);

  const ParallelLayout hsdp = parallel_layout(tiny({"fsdp.strategy=hybrid_shard", "mesh.dp_replicate=2"}), 4);
  REQUIRE(hsdp.mesh.size() == 2);
  CHECK(hsdp.mesh[1].size == 2);

  CHECK_THROWS_WITH_AS(parallel_layout(tiny({"fsdp.strategy=hybrid_shard"}), 4), doctest::Contains("needs a mesh.dp_replicate dimension"),
                       UsageError);
  CHECK_THROWS_WITH_AS(parallel_layout(tiny({"fsdp.reshard_after_forward=3"}), 4),
                       doctest::Contains("must divide the 4 ranks"), UsageError);
}

TEST_CASE("parallelize: a planning mesh has shapes and ranks but refuses to communicate") {
  const DeviceMesh mesh = DeviceMesh::planning({{"dp_replicate", 2}, {"dp_shard", -1}}, 8, 5);
  CHECK(mesh.is_planning());
  CHECK(mesh.dim_size(1) == 4);
  CHECK(mesh.coordinate(0) == 1);
  CHECK(mesh.coordinate(1) == 1);
  CHECK(mesh.comm(1).size() == 4);
  double x = 1;
  CHECK_THROWS_WITH_AS(mesh.comm(1).all_reduce(&x, 1, ReduceOp::sum), doctest::Contains("planning mesh"), Error);
}

TEST_CASE("parallelize: a dry step allocates nothing, frees every transient buffer it reports, and shrinks as 1/N") {
  std::int64_t peak_on_2 = 0;
  for (int ranks : {2, 4}) {
    CAPTURE(ranks);
    const Deck deck = tiny({"train.micro_batch=2"});
    Gpt model(deck.model);
    const auto par = parallelize_for_planning(model, deck, ranks);
    CHECK(par->mesh().is_planning());
    CHECK(par->units().size() == static_cast<std::size_t>(deck.model.n_layer + 1));
    CHECK(par->units().back().name == model.display_name());  // the root last
    for (Parameter* p : model.parameters()) {
      CHECK(p->is_meta());  // no storage, before or after
      CHECK(p->placement()->chunk_rows == chunk_rows(p->rows(), ranks));
    }
    const auto ledger = dry_step(model, *par, 4);
    for (Parameter* p : model.parameters()) CHECK(p->is_meta());
    CHECK(ledger->events > 0);
    CHECK(ledger->total == 0);  // after the root's backward every group is resharded and reduced
    for (const auto& entry : ledger->live) CHECK_MESSAGE(entry.second == 0, fsdp_buffer_name(entry.first));
    CHECK(ledger->live.count(FsdpBuffer::all_gather) == 1);
    CHECK(ledger->live.count(FsdpBuffer::reduce_scatter) == 1);
    if (ranks == 2) peak_on_2 = ledger->peak;
    else CHECK(ledger->peak < peak_on_2);
  }
}

TEST_CASE("parallelize: no_shard runs as a shard group of one rank: no all-gather, whole gradients reduced") {
  const Deck deck = tiny({"fsdp.strategy=no_shard", "train.micro_batch=2"});
  Gpt model(deck.model);
  const auto par = parallelize_for_planning(model, deck, 4);
  const auto ledger = dry_step(model, *par, 2);
  CHECK(ledger->live.count(FsdpBuffer::all_gather) == 0);
  CHECK(ledger->live.count(FsdpBuffer::reduce_scatter) == 0);
  CHECK(ledger->live.count(FsdpBuffer::unsharded_grads) == 1);
  CHECK(ledger->total == 0);
  std::int64_t params = 0;
  for (Parameter* p : model.parameters()) params += p->numel() * 4;
  CHECK(ledger->peak == params);  // the whole gradients, once; parameters are used in place
}

// A rule runs only where it applies: building the model (fsdpp init's memory check) plans the model states and
// splits no batch; planning a training step still applies training's batch split.
TEST_CASE("plan: the model states alone need no batch split; a training step does") {
  const Deck deck = tiny({});  // 16 sequences in micro-batches of 8: no split over 3 data-parallel ranks
  const MemoryPlan states = plan_model_states(deck, 3);
  CHECK(states.shard_ranks == 3);
  CHECK(states.units.size() == static_cast<std::size_t>(deck.model.n_layer + 1));
  CHECK(states.memory.activations == 0);
  CHECK(states.memory.unsharded_parameters == 0);
  CHECK_THROWS_WITH_AS(plan_memory(deck, 3), doctest::Contains("x 3 data-parallel ranks"), DeckRuleError);
  // Where both apply, the model states are the training plan's.
  const MemoryPlan step = plan_memory(deck, 2);
  const MemoryPlan two = plan_model_states(deck, 2);
  CHECK(two.memory.parameters == step.memory.parameters);
  CHECK(two.memory.gradients == step.memory.gradients);
  CHECK(two.memory.optimizer == step.memory.optimizer);
  CHECK(two.units.size() == step.units.size());
  CHECK(step.memory.activations > 0);
}
