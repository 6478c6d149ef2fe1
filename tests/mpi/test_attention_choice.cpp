// model.attention: the fused (flash-style) and batched kernels train like the reference ones (losses within
// 1e-5 relative on GPT-2 tiny and llama-tiny, 1 and 2 ranks), activation checkpointing stays bitwise neutral
// with them, the deck key parses and refuses nonsense, and activation_bytes_for (fsdpp plan) follows the choice:
// fused keeps no B*NH*T^2 buffer.
#include "input_decks.hpp"
#include "mpi_test.hpp"
#include "train_runs.hpp"

#include "fsdpp/config/deck.hpp"
#include "fsdpp/nn/gpt.hpp"
#include "fsdpp/nn/llama.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/parallel/build_model.hpp"
#include "fsdpp/train/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

using namespace fsdpp;

namespace {

using test::losses_on;

double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / std::abs(b[i]));
  return worst;
}

std::string error_of(const std::vector<std::string>& overrides) {
  try {
    test::input_deck("tiny.yaml", overrides);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

MPI_TEST_CASE("model.attention fused and batched train like the reference kernels: GPT-2 and Llama tiny, 1 and 2 ranks", 2) {
  for (const std::string deck : {"tiny.yaml", "llama-tiny.yaml"})
    for (int n : {1, 2}) {
      const std::vector<std::string> common = {"train.steps=4", "train.eval_interval=0", "schedule.warmup_steps=1",
                                               "train.global_batch=4", "train.micro_batch=" + std::to_string(4 / n)};
      auto with = [&](std::vector<std::string> extra) {
        extra.insert(extra.begin(), common.begin(), common.end());
        return losses_on(test_comm, test_rank, n, test::input_deck(deck, extra));
      };
      const auto reference = with({"model.attention=reference"});
      CAPTURE(deck);
      CAPTURE(n);
      for (const std::string kind : {"fused", "batched"}) {
        const auto losses = with({"model.attention=" + kind});
        const auto checkpointed = with({"model.attention=" + kind, "train.activation_checkpointing=full"});
        const double diff = max_rel_diff(losses, reference);
        MESSAGE(deck << " on " << n << " rank(s): " << kind << " vs reference losses, max rel diff " << diff);
        CAPTURE(kind);
        CHECK(diff <= 1e-5);
        CHECK(checkpointed == losses);  // recomputation is bitwise neutral with these kernels too
        CHECK(std::isfinite(losses.back()));
      }
      // auto is the build's choice (reference on host builds: the losses stay bitwise those from before).
      const std::string resolved = std::string(to_string(resolve_attention(AttentionKind::automatic)));
      CHECK(with({}) == with({"model.attention=" + resolved}));
    }
}

MPI_TEST_CASE("model.attention: auto, fused, batched and reference parse; anything else is refused with the choices", 1) {
  CHECK(test::input_deck("tiny.yaml", {}).model.attention == AttentionKind::automatic);
  CHECK(test::input_deck("tiny.yaml", {"model.attention=fused"}).model.attention == AttentionKind::fused);
  CHECK(test::input_deck("tiny.yaml", {"model.attention=reference"}).model.attention == AttentionKind::reference);
  CHECK(test::input_deck("tiny.yaml", {"model.attention=batched"}).model.attention == AttentionKind::batched);
  const std::string e = error_of({"model.attention=flash"});
  CAPTURE(e);
  CHECK(e.find("model.attention") != std::string::npos);
  CHECK(e.find("fused") != std::string::npos);
  CHECK(e.find("reference") != std::string::npos);
}

MPI_TEST_CASE("model.attention: activation_bytes_for follows the choice and matches a real step", 1) {
  for (const char* arch : {"gpt2", "llama"})
    for (const char* kind : {"fused", "batched", "reference"})
      for (int recompute : {0, 1}) {
        Deck deck = test::input_deck(std::string(arch) == "gpt2" ? "tiny.yaml" : "llama-tiny.yaml",
                                     {std::string("model.attention=") + kind});
        const auto model = make_model(deck.model);
        if (recompute) model->block_modules()[0]->set_recompute_in_backward(true);
        model->to_empty();
        model->reset_parameters(5);
        const int B = 2, T = std::min(deck.model.context_length, 16);
        View1<std::int32_t> tokens("tokens", B * T);
        auto h = Kokkos::create_mirror_view(tokens);
        for (int i = 0; i < B * T; ++i) h(i) = (5 * i + 1) % deck.model.vocab_size;
        Kokkos::deep_copy(tokens, h);
        Flow flow;
        flow.B = B, flow.T = T, flow.tokens = tokens, flow.targets = tokens;
        (*model)(flow);
        (*model)(flow, Pass::backward);
        CAPTURE(arch);
        CAPTURE(kind);
        CAPTURE(recompute);
        CHECK(model->activation_bytes() == model->activation_bytes_for(B, T, recompute));
      }
  // The difference is exactly the two B*NH*T^2 buffers (saved probabilities and their gradient scratch),
  // less the B*NH*T floats the fused kernels keep in their place, in every block's set.
  Deck fused = test::input_deck("tiny.yaml", {"model.attention=fused"});
  Deck reference = test::input_deck("tiny.yaml", {"model.attention=reference"});
  const auto mf = make_model(fused.model), mr = make_model(reference.model);
  const std::int64_t B = 4, T = 32, NH = fused.model.n_head, L = fused.model.n_layer;
  CHECK(mr->activation_bytes_for(B, T, 0) - mf->activation_bytes_for(B, T, 0) == 4 * (L + 1) * B * NH * (T * T - T));
}
