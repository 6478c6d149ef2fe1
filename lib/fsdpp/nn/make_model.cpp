#include "fsdpp/nn/make_model.hpp"

#include "fsdpp/nn/gpt.hpp"
#include "fsdpp/nn/llama.hpp"
#include "fsdpp/nn/mixtral.hpp"
#include "fsdpp/nn/qwen2.hpp"
#include "fsdpp/nn/qwen3.hpp"
#include "fsdpp/runtime/error.hpp"

namespace fsdpp {

std::unique_ptr<LanguageModel> make_model(const ModelConfig& m) {
  switch (m.arch) {
    case ModelArch::gpt2: return std::make_unique<Gpt>(m);
    case ModelArch::llama: return std::make_unique<Llama>(m);
    case ModelArch::qwen2: return std::make_unique<Qwen2>(m);
    case ModelArch::qwen3:
    case ModelArch::qwen3_moe: return std::make_unique<Qwen3>(m);
    case ModelArch::mixtral: return std::make_unique<Mixtral>(m);
  }
  throw UsageError(fmt::format("model.arch {} is not a model fsdpp builds", static_cast<int>(m.arch)));
}

std::unique_ptr<LanguageModel> make_model(const Deck& deck) {
  auto model = make_model(deck.model);
  model->set_document_masks(document_masks(deck.data));
  return model;
}

}  // namespace fsdpp
