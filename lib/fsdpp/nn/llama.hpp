#pragma once
// Llama (Llama 2 / Llama 3 family): a token embedding, L pre-RMSNorm blocks (grouped-query causal self-attention
// with rotary position embeddings, and a SwiGLU MLP, each with a residual add), a final RMSNorm and an LM head,
// untied unless model.tie_embeddings. No biases, no position table.
//
// Parameter names are Hugging Face's LlamaForCausalLM names without the leading "model." (lm_head.weight keeps
// its own), so import/export maps them 1:1 (ckpt/hf_llama.hpp); shapes (out, in), hs = C/NH:
//   embed_tokens.weight (V, C)   norm.weight (C)   lm_head.weight (V, C) untied
//   layers.<l>.input_layernorm.weight           (C)
//   layers.<l>.self_attn.q_proj.weight          (NH*hs, C)
//   layers.<l>.self_attn.k_proj.weight          (NKV*hs, C)
//   layers.<l>.self_attn.v_proj.weight          (NKV*hs, C)
//   layers.<l>.self_attn.o_proj.weight          (C, NH*hs)     init 0.02 / sqrt(2L), as GPT-2's projections
//   layers.<l>.post_attention_layernorm.weight  (C)
//   layers.<l>.mlp.gate_proj.weight             (F, C)
//   layers.<l>.mlp.up_proj.weight               (F, C)
//   layers.<l>.mlp.down_proj.weight             (C, F)         init 0.02 / sqrt(2L)
// RoPE uses Hugging Face's half-split convention (kernels/rope.hpp), so q_proj and k_proj rows are stored exactly
// as Hugging Face stores them. Qwen2 (qwen2.hpp) is this block with q/k/v biases.
#include "fsdpp/nn/causal_lm.hpp"
#include "fsdpp/nn/moe.hpp"

#include <optional>

namespace fsdpp {

// What a Llama-family block adds to Llama's: q/k/v biases (Qwen2), Qwen3's per-head RMSNorm on q and k, and a
// mixture-of-experts MLP instead of the dense one (qwen3_moe, mixtral: nn/moe.hpp) with its parameter names.
struct LlamaBlockKind {
  bool qkv_bias = false;
  bool qk_norm = false;
  bool sparse = false;
  MoeNames moe_names = MoeNames::qwen3_moe();
};

class LlamaBlock : public DecoderBlock {
 public:
  LlamaBlock(const ModelConfig& config, const BlockDims& dims, std::shared_ptr<BlockContext> context)
      : LlamaBlock("LlamaBlock", config, dims, std::move(context), LlamaBlockKind{}) {}

  Norm input_layernorm;
  Linear q_proj, k_proj, v_proj;  // self_attn.*: column slices of the packed [q | k | v] row
  Linear o_proj;
  std::optional<Norm> q_norm, k_norm;  // self_attn.q_norm, k_norm (hs): Qwen3's, shared by the heads
  Norm post_attention_layernorm;
  std::optional<Linear> gate_proj, up_proj;  // mlp.*: the two SwiGLU branches (a dense block)
  std::optional<Linear> down_proj;
  std::unique_ptr<MoeFeedForward> experts;   // a sparse block's MLP
  const char* mlp_activation_name() const override { return "swiglu"; }

 protected:
  LlamaBlock(std::string type_name, const ModelConfig& config, const BlockDims& dims,
             std::shared_ptr<BlockContext> context, const LlamaBlockKind& kind);
  void mlp_activation(const View1<float>& h, const Branches& branches, std::int64_t n) const override;
  void mlp_activation_backward(const Branches& dbranches, const View1<float>& dh, const Branches& branches,
                               std::int64_t n) const override;
};

// The Llama family's shapes and names: the blocks' dimensions (NKV key/value heads, F = model.ffn_hidden) and
// the model-level layout (embed_tokens, RoPE, norm: RMSNorm, layers.<l>).
BlockDims llama_dims(const ModelConfig& config, ModelArch arch);  // checks the config first
LmLayout llama_layout(std::string type_name);
// "Llama, V 128256 T 8192 C 4096 L 32 NH 32 NKV 8 F 14336 rope_theta 500000 (untied embeddings)", `name` first.
std::string describe_llama_family(const std::string& name, const ModelConfig& config);

class Llama final : public CausalLM {
 public:
  explicit Llama(const ModelConfig& config);  // on "meta": shapes and init rules only, no storage
  std::vector<LlamaBlock*> blocks() const { return blocks_as<LlamaBlock>(); }
  std::string describe() const override { return describe_llama_family("Llama", config()); }

  Parameter& embed_tokens;  // token_embedding
  Parameter& norm;          // final_norm.weight
};

}  // namespace fsdpp
