#pragma once
// Mixtral (model.arch: mixtral): Llama's attention (llama.hpp) with a mixture-of-experts MLP in every block
// (moe.hpp): E SwiGLU experts of model.moe.expert_ffn_hidden, the top k per token (Mixtral 8x7B: 8 and 2), their
// weights always renormalised. Hugging Face's MixtralForCausalLM names, Llama's plus, per layer:
//   layers.<l>.block_sparse_moe.gate.weight          (E, C)      the router
//   layers.<l>.block_sparse_moe.experts.w1.weight    (E, F, C)   gate projections, stacked (HF: experts.<e>.w1)
//   layers.<l>.block_sparse_moe.experts.w3.weight    (E, F, C)   up projections
//   layers.<l>.block_sparse_moe.experts.w2.weight    (E, C, F)   down projections
// Mistral's sliding-window attention is off in Mixtral's releases and is not implemented.
#include "fsdpp/nn/llama.hpp"

namespace fsdpp {

class MixtralBlock final : public LlamaBlock {
 public:
  MixtralBlock(const ModelConfig& config, const BlockDims& dims, std::shared_ptr<BlockContext> context, int layer)
      : LlamaBlock("MixtralBlock", config, dims, std::move(context),
                   LlamaBlockKind{false, false, is_moe_layer(config, layer), MoeNames::mixtral()}) {}
};

class Mixtral final : public CausalLM {
 public:
  explicit Mixtral(const ModelConfig& config);  // on "meta": shapes and init rules only, no storage
  std::vector<MixtralBlock*> blocks() const { return blocks_as<MixtralBlock>(); }
  std::string describe() const override;
};

}  // namespace fsdpp
