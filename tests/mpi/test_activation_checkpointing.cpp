// Activation checkpointing (train.activation_checkpointing): blocks that recompute their forward in backward
// give bitwise the losses and gradients of blocks that keep their activations, on 1, 2 and 3 ranks (3: uneven
// shards) under every strategy, and HSDP on 4; fully_shard's collectives per step are FSDP2 +
// checkpoint_wrapper's (the recomputation adds no all-gather); and fsdpp plan predicts the measured peak with
// checkpointing too.
#include "input_decks.hpp"
#include "mpi_test.hpp"
#include "train_runs.hpp"

#include "fsdpp/config/deck.hpp"
#include "fsdpp/fsdp/fully_shard.hpp"
#include "fsdpp/nn/gpt.hpp"
#include "fsdpp/parallel/parallelize.hpp"
#include "fsdpp/parallel/build_model.hpp"
#include "fsdpp/plan/memory_plan.hpp"
#include "fsdpp/train/trainer.hpp"

#include <cmath>
#include <string>
#include <vector>

using namespace fsdpp;

namespace {

const char* const kModes[] = {"train.activation_checkpointing=none", "train.activation_checkpointing=every_2",
                              "train.activation_checkpointing=full"};

// tiny.yaml with 3 blocks (every_2 then checkpoints h.1 only, between two blocks that keep theirs).
Deck tiny_deck_3_blocks(std::vector<std::string> overrides) {
  overrides.insert(overrides.begin(), "model.n_layer=3");
  return test::input_deck("tiny.yaml", overrides);
}

using test::losses_on;

}  // namespace

MPI_TEST_CASE("activation checkpointing: losses are bitwise those without it on 1, 2 and 3 ranks, every strategy", 3) {
  for (int n : {1, 2, 3}) {
    // 12 sequences per step: whole micro-batches on 1, 2 and 3 ranks, and halves of them for accumulation.
    const std::string micro = "train.micro_batch=" + std::to_string(12 / n);
    const std::string half = "train.micro_batch=" + std::to_string(6 / n);
    std::vector<std::vector<std::string>> layouts = {
        {"fsdp.strategy=full_shard"}, {"fsdp.strategy=shard_grad_op"}, {"fsdp.strategy=no_shard"},
        {"fsdp.param_dtype=bf16", "fsdp.reduce_dtype=bf16", "fsdp.output_dtype=bf16"},
        {"fsdp.accumulate=sharded", half}, {"fsdp.accumulate=unsharded", half}, {"fsdp.offload=cpu"}};
    if (n == 2) layouts.push_back({"fsdp.reshard_after_forward=2"});
    for (const auto& layout : layouts) {
      std::vector<std::vector<double>> runs;
      for (const char* mode : kModes) {
        std::vector<std::string> o = {"train.steps=3", "train.eval_interval=0", "schedule.warmup_steps=1",
                                      "train.global_batch=12", micro, mode};
        o.insert(o.end(), layout.begin(), layout.end());
        runs.push_back(losses_on(test_comm, test_rank, n, tiny_deck_3_blocks(o)));
      }
      CAPTURE(n);
      CAPTURE(layout.back());
      CHECK(runs[1] == runs[0]);  // every_2: bitwise
      CHECK(runs[2] == runs[0]);  // full: bitwise
      CHECK(std::isfinite(runs[0].back()));
    }
  }
}

MPI_TEST_CASE("activation checkpointing: a Llama's losses are bitwise those without it on 1 and 2 ranks", 2) {
  for (int n : {1, 2}) {
    const std::string micro = "train.micro_batch=" + std::to_string(4 / n);
    for (const std::vector<std::string>& layout :
         std::vector<std::vector<std::string>>{{"fsdp.strategy=full_shard"}, {"fsdp.strategy=shard_grad_op"},
                                               {"fsdp.param_dtype=bf16"}}) {
      std::vector<std::vector<double>> runs;
      for (const char* mode : kModes) {
        std::vector<std::string> o = {"model.n_layer=3", "train.steps=3", "train.eval_interval=0",
                                      "schedule.warmup_steps=1", "train.global_batch=4", micro, mode};
        o.insert(o.end(), layout.begin(), layout.end());
        runs.push_back(losses_on(test_comm, test_rank, n, test::input_deck("llama-tiny.yaml", o)));
      }
      CAPTURE(n);
      CAPTURE(layout.back());
      CHECK(runs[1] == runs[0]);
      CHECK(runs[2] == runs[0]);
      CHECK(std::isfinite(runs[0].back()));
    }
  }
}

MPI_TEST_CASE("activation checkpointing: HSDP (2 x 2) losses are bitwise those without it", 4) {
  std::vector<std::vector<double>> runs;
  for (const char* mode : kModes)
    runs.push_back(losses_on(test_comm, test_rank, 4,
                             tiny_deck_3_blocks({"train.steps=3", "train.eval_interval=0",
                                                 "schedule.warmup_steps=1", "train.global_batch=8",
                                                 "train.micro_batch=2", "fsdp.strategy=hybrid_shard",
                                                 "mesh.dp_replicate=2", "mesh.dp_shard=2", mode})));
  CHECK(runs[1] == runs[0]);
  CHECK(runs[2] == runs[0]);
}

namespace {

struct StepOutcome {
  FsdpStats counts;
  double loss = 0;
  std::vector<std::vector<float>> grads;  // this rank's gradient shards, parameter by parameter
  std::int64_t activation_bytes = 0;
};

// One forward and backward of the deck's model, parallelized as training does, on deterministic tokens.
StepOutcome one_step(MPI_Comm comm, const Deck& deck) {
  Gpt model(deck.model);
  const auto par = parallelize(model, deck, comm);
  model.to_empty();
  model.reset_parameters(deck.run.seed);
  model.zero_grad();
  const int B = deck.train.micro_batch, T = deck.model.context_length, V = deck.model.vocab_size;
  std::vector<std::int32_t> in(static_cast<std::size_t>(B) * T), tg(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    in[i] = static_cast<std::int32_t>((i * 7 + par->data_parallel_rank() * 3) % V);
    tg[i] = static_cast<std::int32_t>((i * 5 + 1) % V);
  }
  View1<std::int32_t> tokens("tokens", in.size()), targets("targets", tg.size());
  Kokkos::deep_copy(tokens, HostView1<std::int32_t>(in.data(), in.size()));
  Kokkos::deep_copy(targets, HostView1<std::int32_t>(tg.data(), tg.size()));
  par->before_micro_batch(0, 1);
  reset_fsdp_stats(model);
  Flow flow;
  flow.B = B, flow.T = T, flow.tokens = tokens, flow.targets = targets;
  model(flow);
  model(flow, Pass::backward);
  StepOutcome out;
  out.counts = fsdp_stats(model);
  out.loss = flow.loss;
  for (Parameter* p : model.parameters()) {
    std::vector<float> g(p->grad().extent(0));
    Kokkos::deep_copy(HostView1<float>(g.data(), g.size()), p->grad());
    out.grads.push_back(std::move(g));
  }
  out.activation_bytes = model.activation_bytes();
  return out;
}

}  // namespace

MPI_TEST_CASE("activation checkpointing: the recomputation adds no collective, as under FSDP2 + checkpoint_wrapper", 2) {
  const int blocks = 3, groups = blocks + 1;
  for (const char* reshard : {"fsdp.reshard_after_forward=auto", "fsdp.reshard_after_forward=false"}) {
    const std::vector<std::string> common = {"train.micro_batch=4", "train.global_batch=8", reshard};
    auto with = [&](const char* mode) {
      auto o = common;
      o.push_back(mode);
      return one_step(test_comm, tiny_deck_3_blocks(o));
    };
    const StepOutcome none = with(kModes[0]), every_2 = with(kModes[1]), full = with(kModes[2]);
    CAPTURE(reshard);
    // Every group is gathered once in forward; in backward, again only if it was resharded after forward
    // (the blocks under auto; nothing under false). Recomputation runs inside the backward, after the gather.
    const bool reshards = std::string(reshard).find("auto") != std::string::npos;
    for (const StepOutcome* s : {&none, &every_2, &full}) {
      CHECK(s->counts.forward_all_gathers == groups);
      CHECK(s->counts.backward_all_gathers == (reshards ? blocks : 0));
      CHECK(s->counts.reduce_scatters == groups);
      CHECK(s->counts.all_gather_bytes == none.counts.all_gather_bytes);
    }
    CHECK(every_2.loss == none.loss);
    CHECK(full.loss == none.loss);
    CHECK(every_2.grads == none.grads);  // bitwise, shard by shard
    CHECK(full.grads == none.grads);
    // Three blocks' recomputable sets become one shared set (full), or two (every_2: h.0 and h.2 keep theirs).
    const ModelConfig c = tiny_deck_3_blocks(common).model;
    BlockActivations acts;
    const std::int64_t set = Gpt(c).blocks()[0]->activation_table(acts, 4, c.context_length).bytes();
    CHECK(none.activation_bytes - full.activation_bytes == 2 * set);
    CHECK(none.activation_bytes - every_2.activation_bytes == 0);  // one own set given up, one shared set taken
    CHECK(full.activation_bytes == Gpt(c).activation_bytes_for(4, c.context_length, blocks));
    CHECK(every_2.activation_bytes == Gpt(c).activation_bytes_for(4, c.context_length, 1));
  }
}

MPI_TEST_CASE("activation checkpointing: fsdpp plan predicts the measured per-rank peak within 1%", 2) {
  for (const char* mode : kModes)
    for (const char* layout : {"fsdp.strategy=full_shard", "fsdp.strategy=shard_grad_op", "fsdp.strategy=no_shard"}) {
      const Deck deck = tiny_deck_3_blocks({"model.n_layer=4", "train.steps=2", "train.eval_interval=0",
                                            "schedule.warmup_steps=1", "train.micro_batch=4", mode, layout});
      const MemoryPlan plan = plan_memory(deck, test_nb_procs);
      TrainOptions o;
      o.quiet = true;
      o.measure_peak = false;
      const std::int64_t measured = train(test_comm, deck, o).measured_peak_bytes;
      CAPTURE(mode);
      CAPTURE(layout);
      CAPTURE(plan.memory.total());
      CAPTURE(measured);
      CHECK(std::abs(static_cast<double>(plan.memory.total() - measured)) <= 0.01 * static_cast<double>(measured));
      if (deck.train.activation_checkpointing.kind != ActivationCheckpointing::Kind::none)
        CHECK(plan.memory.activations < plan.activations_without_checkpointing);
    }
  // Document masks (data.document_mask) add the micro-batch's document starts, one int32 per token: in the plan
  // exactly, and the plan still within 1% of the measured peak.
  const std::vector<std::string> keys = {"model.n_layer=4", "train.steps=2", "train.eval_interval=0",
                                         "schedule.warmup_steps=1", "train.micro_batch=4",
                                         "train.activation_checkpointing=full"};
  std::vector<std::string> masked_keys = keys;
  masked_keys.insert(masked_keys.end(), {"data.document_mask=true", "data.eot_id=3"});
  const Deck masked = tiny_deck_3_blocks(masked_keys);
  const MemoryPlan plan = plan_memory(masked, test_nb_procs);
  CHECK(plan.memory.activations - plan_memory(tiny_deck_3_blocks(keys), test_nb_procs).memory.activations ==
        std::int64_t{4} * masked.train.micro_batch * masked.model.context_length);
  TrainOptions o;
  o.quiet = true;
  o.measure_peak = false;
  const std::int64_t measured = train(test_comm, masked, o).measured_peak_bytes;
  CAPTURE(plan.memory.total());
  CAPTURE(measured);
  CHECK(std::abs(static_cast<double>(plan.memory.total() - measured)) <= 0.01 * static_cast<double>(measured));
}
