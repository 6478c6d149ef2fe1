#include "fsdpp/nn/mixtral.hpp"

#include <fmt/format.h>

namespace fsdpp {

Mixtral::Mixtral(const ModelConfig& c) : CausalLM(c, llama_layout("Mixtral"), llama_dims(c, ModelArch::mixtral)) {
  add_blocks<MixtralBlock>();
}

std::string Mixtral::describe() const { return describe_llama_family("Mixtral", config()); }

}  // namespace fsdpp
