#pragma once
// GPT-2, exactly: learned token and position embeddings, L pre-LayerNorm blocks (causal self-attention and a
// GELU MLP, every Linear with a bias), a final LayerNorm, and an LM head tied to the token embedding unless
// model.tie_embeddings is false. Parameter names are GPT-2's own, as Hugging Face's GPT2LMHeadModel has them
// without "transformer." (ckpt/hf_gpt2.hpp), shapes (out, in) as PyTorch's nn.Linear:
//   wte.weight (V, C)   wpe.weight (context_length, C)   ln_f.weight, ln_f.bias (C)   lm_head.weight (V, C) untied
//   h.<l>.ln_1.weight, .bias (C)
//   h.<l>.attn.c_attn.weight (3C, C), .bias (3C)          q, k and v stacked
//   h.<l>.attn.c_proj.weight (C, C), .bias (C)            init 0.02 / sqrt(2L): two residual adds per block
//   h.<l>.ln_2.weight, .bias (C)
//   h.<l>.mlp.c_fc.weight (4C, C), .bias (4C)
//   h.<l>.mlp.c_proj.weight (C, 4C), .bias (C)            init 0.02 / sqrt(2L)
// Everything else (the block's kernels, tensor and sequence parallelism, the head and the loss, the buffers and
// their byte counts) is the shared skeleton's: causal_lm.hpp, decoder_block.hpp.
#include "fsdpp/nn/causal_lm.hpp"

namespace fsdpp {

class Block final : public DecoderBlock {
 public:
  Block(const ModelConfig& config, const BlockDims& dims, std::shared_ptr<BlockContext> context);

  Norm ln_1;
  Linear c_attn;     // attn.c_attn: [q | k | v]
  Linear attn_proj;  // attn.c_proj
  Norm ln_2;
  Linear c_fc;       // mlp.c_fc
  Linear mlp_proj;   // mlp.c_proj
  const char* mlp_activation_name() const override { return "gelu"; }

 protected:
  void mlp_activation(const View1<float>& h, const Branches& branches, std::int64_t n) const override;
  void mlp_activation_backward(const Branches& dbranches, const View1<float>& dh, const Branches& branches,
                               std::int64_t n) const override;
};

class Gpt final : public CausalLM {
 public:
  explicit Gpt(const ModelConfig& config);  // on "meta": shapes and init rules only, no storage
  std::vector<Block*> blocks() const { return blocks_as<Block>(); }
  std::string describe() const override;

  Parameter& wte;  // token_embedding
  Parameter& wpe;  // *position_table
};

}  // namespace fsdpp
