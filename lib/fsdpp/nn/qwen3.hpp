#pragma once
// Qwen3 (model.arch: qwen3) and Qwen3-MoE (qwen3_moe): Llama's block (llama.hpp) without biases, with an RMSNorm
// over each head's hs channels of q and of k before RoPE (weights self_attn.q_norm.weight and
// self_attn.k_norm.weight, (hs) each, shared by the heads), and hs = model.head_dim free of n_embd / n_head. RoPE
// theta 1e6 and RMSNorm eps 1e-6 unless set. Hugging Face's Qwen3ForCausalLM / Qwen3MoeForCausalLM names, Llama's
// plus the two norms; a Qwen3-MoE block whose is_moe_layer holds has, instead of mlp.{gate,up,down}_proj:
//   layers.<l>.mlp.gate.weight                     (E, C)      the router
//   layers.<l>.mlp.experts.gate_proj.weight        (E, F, C)   stacked (HF: mlp.experts.<e>.gate_proj.weight)
//   layers.<l>.mlp.experts.up_proj.weight          (E, F, C)
//   layers.<l>.mlp.experts.down_proj.weight        (E, C, F)   F = model.moe.expert_ffn_hidden
// the others (model.moe.dense_layers, sparse_step) a dense SwiGLU MLP of model.ffn_hidden.
#include "fsdpp/nn/llama.hpp"

namespace fsdpp {

class Qwen3Block final : public LlamaBlock {
 public:
  Qwen3Block(const ModelConfig& config, const BlockDims& dims, std::shared_ptr<BlockContext> context, int layer)
      : LlamaBlock("Qwen3Block", config, dims, std::move(context),
                   LlamaBlockKind{false, true, is_moe_layer(config, layer), MoeNames::qwen3_moe()}) {}
};

class Qwen3 final : public CausalLM {
 public:
  explicit Qwen3(const ModelConfig& config);  // qwen3 or qwen3_moe; on "meta": shapes and init rules only
  std::vector<Qwen3Block*> blocks() const { return blocks_as<Qwen3Block>(); }
  std::string describe() const override;
};

}  // namespace fsdpp
