#include "fsdpp/nn/qwen3.hpp"

namespace fsdpp {

Qwen3::Qwen3(const ModelConfig& c)
    : CausalLM(c, llama_layout(c.arch == ModelArch::qwen3 ? "Qwen3" : "Qwen3Moe"), llama_dims(c, c.arch)) {
  add_blocks<Qwen3Block>();
}

std::string Qwen3::describe() const {
  return describe_llama_family(config().arch == ModelArch::qwen3 ? "Qwen3" : "Qwen3-MoE", config());
}

}  // namespace fsdpp
