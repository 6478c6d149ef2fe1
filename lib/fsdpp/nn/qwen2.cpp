#include "fsdpp/nn/qwen2.hpp"

namespace fsdpp {

Qwen2::Qwen2(const ModelConfig& c) : CausalLM(c, llama_layout("Qwen2"), llama_dims(c, ModelArch::qwen2)) {
  add_blocks<Qwen2Block>();
}

}  // namespace fsdpp
