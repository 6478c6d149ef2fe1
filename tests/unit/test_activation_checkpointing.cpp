// Activation checkpointing on one rank: a block that recomputes in backward gives bitwise the gradients of one
// that keeps its activations, the recomputation runs no hook, checkpointed blocks share one activation set
// (activation_bytes_for predicts it), the deck key parses and refuses nonsense, and fsdpp plan shows the saving.
#include "input_decks.hpp"
#include "mpi_test.hpp"
#include "test_helpers.hpp"

#include "fsdpp/config/deck.hpp"
#include "fsdpp/nn/gpt.hpp"
#include "fsdpp/parallel/parallelize.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/plan/memory_plan.hpp"

#include <string>
#include <vector>

using namespace fsdpp;

namespace {

using fsdpp::test::to_host;

ModelConfig small_config() {
  ModelConfig c;
  c.vocab_size = 29, c.context_length = 9, c.n_embd = 12, c.n_layer = 4, c.n_head = 3;
  return c;
}

struct Pass1 {
  double loss = 0;
  std::vector<std::vector<float>> grads;
  std::int64_t activation_bytes = 0;
  std::vector<std::string> hook_log;
};

// Three forward/backward passes (batch shapes 3, 2, 3: the activation sets, grow-only, are cut smaller in the
// middle one) of the same model with the blocks `recompute` names set to recompute in backward; the gradients
// are those of every pass, accumulated.
Pass1 three_passes(const std::vector<bool>& recompute) {
  const ModelConfig c = small_config();
  Gpt model(c);
  model.to_empty();
  model.reset_parameters(7);
  model.zero_grad();
  struct Recorder : ModuleHooks {
    std::vector<std::string>* log;
    void before(Module& m, Pass p, Flow&) override { log->push_back((p == Pass::forward ? "F>" : "B>") + m.display_name()); }
  };
  Pass1 out;
  for (std::size_t l = 0; l < recompute.size(); ++l) {
    model.blocks()[l]->set_recompute_in_backward(recompute[l]);
    auto r = std::make_shared<Recorder>();
    r->log = &out.hook_log;
    model.blocks()[l]->add_hooks(r);
  }
  for (int B : {3, 2, 3}) {
    const int T = 8, N = B * T;
    View1<std::int32_t> tokens("tokens", N), targets("targets", N);
    auto ht = Kokkos::create_mirror_view(tokens), hg = Kokkos::create_mirror_view(targets);
    for (int i = 0; i < N; ++i) ht(i) = (i * 11 + B) % c.vocab_size, hg(i) = (i * 5 + 3) % c.vocab_size;
    Kokkos::deep_copy(tokens, ht);
    Kokkos::deep_copy(targets, hg);
    Flow flow;
    flow.B = B, flow.T = T, flow.tokens = tokens, flow.targets = targets;
    model(flow);
    model(flow, Pass::backward);
    out.loss += flow.loss;
  }
  for (Parameter* p : model.parameters()) out.grads.push_back(to_host(p->grad()));
  out.activation_bytes = model.activation_bytes();
  return out;
}

std::string error_of(const std::vector<std::string>& overrides) {
  try {
    test::input_deck("small.yaml", overrides);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("activation checkpointing: recomputed blocks give bitwise the gradients of blocks that keep activations") {
  const Pass1 none = three_passes({false, false, false, false});
  for (const std::vector<bool>& recompute :
       {std::vector<bool>{true, true, true, true}, {false, true, false, true}, {true, false, false, false}}) {
    const Pass1 ac = three_passes(recompute);
    CHECK(ac.loss == none.loss);
    REQUIRE(ac.grads.size() == none.grads.size());
    for (std::size_t i = 0; i < ac.grads.size(); ++i) {
      CAPTURE(i);
      CHECK(ac.grads[i] == none.grads[i]);
    }
    // The recomputation runs forward() only: every hook still runs once per pass.
    CHECK(ac.hook_log == none.hook_log);
    int recomputing = 0;
    for (bool r : recompute) recomputing += r;
    CHECK(ac.activation_bytes == Gpt(small_config()).activation_bytes_for(3, 8, recomputing));
  }
  CHECK(none.activation_bytes == Gpt(small_config()).activation_bytes_for(3, 8));
  // Full: L recomputable sets become one; every block keeps its output.
  const Gpt model(small_config());
  BlockActivations set;
  CHECK(model.activation_bytes_for(3, 8) - model.activation_bytes_for(3, 8, 4) ==
        3 * model.blocks()[0]->activation_table(set, 3, 8).bytes());
}

TEST_CASE("activation checkpointing: the deck key takes none, full and every_<k>, and refuses anything else") {
  using Kind = ActivationCheckpointing::Kind;
  CHECK(test::input_deck("small.yaml", {}).train.activation_checkpointing.kind == Kind::none);
  const Deck full = test::input_deck("small.yaml", {"train.activation_checkpointing=full"});
  CHECK(full.train.activation_checkpointing.kind == Kind::full);
  const Deck every = test::input_deck("small.yaml", {"train.activation_checkpointing=every_2"});
  CHECK(every.train.activation_checkpointing.kind == Kind::every);
  CHECK(every.train.activation_checkpointing.every == 2);
  CHECK(to_string(every.train.activation_checkpointing) == "every_2");
  CHECK(resolved_deck_yaml(every).find("activation_checkpointing: every_2") != std::string::npos);
  // every_2 is h.1 and h.3 of 4 (every second block, counting from 1), as torchtitan's layer-selective AC.
  std::vector<bool> which;
  for (int l = 0; l < 4; ++l) which.push_back(every.train.activation_checkpointing.recomputes(l));
  CHECK(which == std::vector<bool>{false, true, false, true});
  CHECK(test::input_deck("small.yaml", {"train.activation_checkpointing=every_1"}).train.activation_checkpointing.kind ==
        Kind::full);

  CHECK(error_of({"train.activation_checkpointing=partial"}) ==
        "override 'train.activation_checkpointing=partial': expected none, full or every_<k> with an integer k >= 2 "
        "(every_2 checkpoints every second block), got 'partial'");
  CHECK(error_of({"train.activation_checkpointing=every_0"}).find("got 'every_0'") != std::string::npos);
  CHECK(error_of({"train.activation_checkpointing=every_two"}).find("got 'every_two'") != std::string::npos);
  CHECK(error_of({"train.activation_checkpointing=every_5"}) ==
        "override 'train.activation_checkpointing=every_5': train.activation_checkpointing every_5 checkpoints blocks "
        "h.4, h.9, ..., but the model has only 4 (model.n_layer): none would be; use every_<k> with k <= 4, or full");
  CHECK(deck_help().find("train.activation_checkpointing") != std::string::npos);
}

TEST_CASE("activation checkpointing: parallelize marks the blocks, and fsdpp plan shows the saving") {
  const Deck deck = test::input_deck("small.yaml", {"train.micro_batch=2", "train.activation_checkpointing=every_2"});
  Gpt model(small_config());
  CHECK(apply_activation_checkpointing(model, deck.train.activation_checkpointing) == 2);  // h.1 and h.3
  CHECK(model.blocks()[1]->recomputes_in_backward());
  CHECK(!model.blocks()[2]->recomputes_in_backward());
  const MemoryPlan none = plan_memory(test::input_deck("small.yaml", {"train.micro_batch=2"}), 2);
  const MemoryPlan every_2 = plan_memory(deck, 2);
  const MemoryPlan full = plan_memory(test::input_deck("small.yaml", {"train.micro_batch=2",
                                                                      "train.activation_checkpointing=full"}), 2);
  CHECK(none.recomputing_blocks == 0);
  CHECK(every_2.recomputing_blocks == 2);
  CHECK(full.recomputing_blocks == 4);
  const std::int64_t set = none.memory.activations - full.memory.activations;  // 3 sets of 4 given up
  CHECK(set % 3 == 0);
  CHECK(none.memory.activations - every_2.memory.activations == set / 3);
  CHECK(full.activations_without_checkpointing == none.memory.activations);
  // Only the activations change: the sharded states and fully_shard's buffers are the same.
  CHECK(full.memory.total() - full.memory.activations == none.memory.total() - none.memory.activations);
  CHECK(full.per_sequence_bytes < none.per_sequence_bytes);
  const std::string text = format_memory_plan(deck, every_2, std::nullopt);
  CHECK(text.find("activation checkpointing every_2 (2 of 4 blocks recompute in backward)") != std::string::npos);
}
