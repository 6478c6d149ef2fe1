// zero_bubble's split backward on one rank, without a pipeline (nn/weight_gradient_stash.hpp): a backward with a
// stash leaves every Linear weight gradient (the head's too) at zero and the norms' and embedding's computed; the
// weight pass then gives bitwise the gradients of a whole backward, for GPT-2 (tied head, packed qkv) and Llama
// (separate q, k, v sharing one copy; SwiGLU's two branches), with a block recomputing in backward (its inputs
// copied too); the stash holds exactly the floats DecoderBlock::weight_stash_elements says, and a weight pass
// that skips a module is refused.
#include "model_shapes.hpp"

#include "fsdpp/nn/causal_lm.hpp"
#include "fsdpp/nn/make_model.hpp"
#include "fsdpp/nn/weight_gradient_stash.hpp"
#include "fsdpp/runtime/error.hpp"

#include "mpi_test.hpp"

#include <string>
#include <vector>

using namespace fsdpp;
using namespace fsdpp::test;

namespace {

struct Gradients {
  std::vector<std::string> names;
  std::vector<std::vector<float>> values;
};

Gradients gradients_of(Module& model) {
  Gradients g;
  for (Parameter* p : model.parameters()) g.names.push_back(p->name()), g.values.push_back(to_host(p->grad()));
  return g;
}

// One forward of B x T tokens; then a whole backward, or (stash set) I, then W; `after_input_pass` gets the
// gradients between the two.
std::unique_ptr<LanguageModel> trained(ModelArch arch, int recomputing_block, WeightGradientStash* stash,
                                       Gradients* after_input_pass = nullptr) {
  const ModelConfig c = model_config(arch, 37, 8, 16, 3, 4, arch == ModelArch::gpt2);
  std::unique_ptr<LanguageModel> model = make_model(c);
  model->to_empty();
  model->reset_parameters(11);
  model->zero_grad();
  if (recomputing_block >= 0) model->block_modules()[static_cast<std::size_t>(recomputing_block)]->set_recompute_in_backward(true);
  const int B = 2, T = 8;
  std::vector<std::int32_t> tokens(B * T), targets(B * T);
  for (int i = 0; i < B * T; ++i) tokens[i] = (i * 7 + 3) % 37, targets[i] = (i * 5 + 1) % 37;
  const View1<std::int32_t> tokens_v = tokens_view(tokens), targets_v = tokens_view(targets);
  Flow flow;
  flow.B = B, flow.T = T, flow.tokens = tokens_v, flow.targets = targets_v;
  (*model)(flow);
  flow.weight_stash = stash;
  (*model)(flow, Pass::backward);
  if (stash) {
    if (after_input_pass) *after_input_pass = gradients_of(*model);
    CHECK(stash->elements() == model->weight_stash_elements(B, T));
    (*model)(flow, Pass::backward_weight);
    stash->finish();
  }
  return model;
}

bool all_zero(const std::vector<float>& v) {
  for (float x : v)
    if (x != 0.0f) return false;
  return true;
}

}  // namespace

TEST_CASE("weight gradient stash: I then W gives bitwise a whole backward's gradients") {
  for (ModelArch arch : {ModelArch::gpt2, ModelArch::llama})
    for (int recomputing : {-1, 1}) {
      CAPTURE(static_cast<int>(arch));
      CAPTURE(recomputing);
      const Gradients whole = gradients_of(*trained(arch, recomputing, nullptr));
      WeightGradientStash stash;
      Gradients input_only;
      const Gradients split = gradients_of(*trained(arch, recomputing, &stash, &input_only));
      REQUIRE(split.names == whole.names);
      for (std::size_t i = 0; i < whole.names.size(); ++i) {
        CAPTURE(whole.names[i]);
        CHECK(split.values[i] == whole.values[i]);  // the same calls on the same values, later
        const std::string& name = whole.names[i];
        const bool deferred = (name.find(".weight") != std::string::npos || name.find(".bias") != std::string::npos) &&
                              name.find("ln") == std::string::npos && name.find("norm") == std::string::npos &&
                              name.find("wte") == std::string::npos && name.find("wpe") == std::string::npos &&
                              name.find("embed_tokens") == std::string::npos;
        CHECK(all_zero(input_only.values[i]) == deferred);  // after I: the Linears' wait, the rest is there
      }
    }
}

TEST_CASE("weight gradient stash: a weight pass that leaves a record is refused, naming it") {
  WeightGradientStash stash;
  const ModelConfig c = model_config(ModelArch::gpt2, 37, 8, 16, 2, 4, true);
  std::unique_ptr<LanguageModel> model = make_model(c);
  model->to_empty();
  model->reset_parameters(3);
  const Parameter& w = *model->parameters().back();
  const Linear linear{*model->parameters().back(), nullptr};
  GradientChunks off;
  const View1<float> dout("dout", 4), inp("inp", 4);
  stash.record(*model->block_modules()[0], linear, off, dout, inp, 1, 4, 4, 4, 0);
  CHECK(stash.elements() == 4);
  const std::string want = "the weight pass left h.0's weight gradient of '" + w.name() + "' uncomputed";
  CHECK_THROWS_WITH(stash.finish(), doctest::Contains(want.c_str()));
}
