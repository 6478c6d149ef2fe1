#pragma once
// Qwen2 and Qwen2.5 (model.arch: qwen2): Llama's block (llama.hpp) with biases on q_proj, k_proj and v_proj, RMSNorm
// epsilon 1e-6 and RoPE theta 1e6 by default, the embedding tied to the head in the small sizes (0.5B, 1.5B, 3B).
// Hugging Face's Qwen2ForCausalLM names, as Llama's plus the biases:
//   layers.<l>.self_attn.q_proj.bias (NH*hs)   k_proj.bias (NKV*hs)   v_proj.bias (NKV*hs)
// Qwen2's sliding-window attention is off in every released checkpoint and is not implemented.
#include "fsdpp/nn/llama.hpp"

namespace fsdpp {

class Qwen2Block final : public LlamaBlock {
 public:
  Qwen2Block(const ModelConfig& config, const BlockDims& dims, std::shared_ptr<BlockContext> context)
      : LlamaBlock("Qwen2Block", config, dims, std::move(context), LlamaBlockKind{/*qkv_bias=*/true}) {}
};

class Qwen2 final : public CausalLM {
 public:
  explicit Qwen2(const ModelConfig& config);  // on "meta": shapes and init rules only, no storage
  std::vector<Qwen2Block*> blocks() const { return blocks_as<Qwen2Block>(); }
  std::string describe() const override { return describe_llama_family("Qwen2", config()); }
};

}  // namespace fsdpp
