#pragma once
// GPT-2, exactly: learned token and position embeddings, L pre-LayerNorm blocks (causal self-attention and a
// GELU MLP, each with a residual add), a final LayerNorm, and an LM head tied to the token embedding unless
// tie_embeddings is false. Parameter names are GPT-2's own (wte.weight, h.0.attn.c_attn.weight, ...).
//
// The model is a tree of Modules: the root GPT owns the embeddings, ln_f and the LM head; each transformer
// block h.<l> is a child Module, the unit fully_shard wraps. Dimensions: B batch, T sequence, C channels,
// NH heads, hs = C/NH, V vocabulary, L layers, N = B*T rows.
#include "fsdpp/nn/language_model.hpp"

#include <memory>
#include <vector>

namespace fsdpp {

struct GptConfig {
  int vocab_size = 256;       // V
  int context_length = 64;    // maximum T (rows of wpe)
  int n_embd = 64;            // C
  int n_layer = 2;            // L
  int n_head = 4;             // NH
  bool tie_embeddings = true; // LM head shares wte.weight

  std::int64_t parameter_count() const;
  // Training FLOPs per token (PaLM, appendix B): 6 x the parameters that multiply (forward 2, backward 4 per
  // weight; wpe is a lookup, and so is wte when the head is untied) plus 12 x L x T x C for the attention
  // score and value products (forward 4 L T C, backward twice that), counted without the causal saving.
  double flops_per_token(int T) const;
  void validate() const;  // UsageError naming the field when the shape is impossible
};

// Gradient buffers of the blocks' backward passes; blocks run one at a time, so they share one set.
struct BlockScratch;

class Block final : public Module {
 public:
  Block(const GptConfig& config, std::shared_ptr<BlockScratch> scratch);
  std::int64_t activation_bytes() const;  // saved activations of the last forward

  // Parameters, shapes (out, in) as GPT-2 stores Linear weights.
  Parameter& ln_1_weight;     // (C)
  Parameter& ln_1_bias;       // (C)
  Parameter& c_attn_weight;   // (3C, C)
  Parameter& c_attn_bias;     // (3C)
  Parameter& attn_proj_weight;// (C, C)
  Parameter& attn_proj_bias;  // (C)
  Parameter& ln_2_weight;     // (C)
  Parameter& ln_2_bias;       // (C)
  Parameter& c_fc_weight;     // (4C, C)
  Parameter& c_fc_bias;       // (4C)
  Parameter& mlp_proj_weight; // (C, 4C)
  Parameter& mlp_proj_bias;   // (C)

 protected:
  void forward(Flow& flow) override;
  void backward(Flow& flow) override;

 private:
  void ensure_activations(int B, int T);

  GptConfig config_;
  std::shared_ptr<BlockScratch> scratch_;
  int B_ = 0, T_ = 0;
  // Saved activations of the last forward: what backward needs.
  View1<float> in_;                  // (B,T,C) residual input (the previous module's output, not a copy)
  View1<float> ln1_, ln1_mean_, ln1_rstd_;  // (B,T,C), (B,T), (B,T)
  View1<float> qkv_;                 // (B,T,3C)
  View1<float> att_;                 // (B,NH,T,T) attention probabilities
  View1<float> atty_;                // (B,T,C) attention output before c_proj
  View1<float> res2_;                // (B,T,C) residual after attention
  View1<float> ln2_, ln2_mean_, ln2_rstd_;
  View1<float> fch_, fch_gelu_;      // (B,T,4C)
  View1<float> out_;                 // (B,T,C) block output (also holds c_proj output before the residual add)
};

class Gpt final : public LanguageModel {
 public:
  explicit Gpt(const GptConfig& config);  // on "meta": shapes and init rules only, no storage
  const GptConfig& config() const { return config_; }
  std::vector<Block*> blocks() const;

  Parameter& wte;         // (V, C)
  Parameter& wpe;         // (maxT, C)
  Parameter& ln_f_weight; // (C)
  Parameter& ln_f_bias;   // (C)
  Parameter* lm_head;     // (V, C) when embeddings are untied, else nullptr (wte serves)

  // LanguageModel
  std::vector<Module*> block_modules() const override;
  View1<float> losses() const override { return losses_; }
  std::int64_t activation_bytes() const override;
  std::int64_t activation_bytes_for(int B, int T) const override { return activation_bytes_for(config_, B, T); }
  std::int64_t parameter_count() const override { return config_.parameter_count(); }
  double flops_per_token(int T) const override { return config_.flops_per_token(T); }
  int vocab_size() const override { return config_.vocab_size; }
  int context_length() const override { return config_.context_length; }
  std::string describe() const override;

  // activation_bytes_for from a config alone: saved activations, logits, and the backward scratch the
  // blocks share.
  static std::int64_t activation_bytes_for(const GptConfig& config, int B, int T);

 protected:
  void forward(Flow& flow) override;
  void backward(Flow& flow) override;

 private:
  void ensure_activations(int B, int T);
  Parameter& head() { return lm_head ? *lm_head : wte; }

  GptConfig config_;
  std::shared_ptr<BlockScratch> scratch_;
  std::vector<std::unique_ptr<Block>> blocks_;
  int B_ = 0, T_ = 0;
  View1<float> x0_;                          // (B,T,C) embedding output
  View1<float> lnf_, lnf_mean_, lnf_rstd_;   // (B,T,C), (B,T), (B,T)
  View1<float> final_x_;                     // (B,T,C) alias of the last block's output
  View1<float> logits_;                      // (B*T,V); holds dlogits after a training forward
  View1<float> losses_;                      // (B*T)
  View1<float> dlnf_;                        // (B,T,C)
  View1<float> dx_;                          // (B,T,C) gradient of the residual stream
};

}  // namespace fsdpp
