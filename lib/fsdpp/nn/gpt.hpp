#pragma once
// GPT-2, exactly: learned token and position embeddings, L pre-LayerNorm blocks (causal self-attention and a
// GELU MLP, each with a residual add), a final LayerNorm, and an LM head tied to the token embedding unless
// tie_embeddings is false. Parameter names are GPT-2's own (wte.weight, h.0.attn.c_attn.weight, ...).
//
// The model is a tree of Modules: the root GPT owns the embeddings, ln_f and the LM head; each transformer
// block h.<l> is a child Module, the unit fully_shard wraps. Dimensions: B batch, T sequence, C channels,
// NH heads, hs = C/NH, V vocabulary, L layers, N = B*T rows.
#include "fsdpp/nn/attention_kind.hpp"
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
  AttentionKind attention = AttentionKind::automatic;  // model.attention (nn/attention_kind.hpp)
  // Tensor-parallel ranks (mesh.tp; Gpt::apply_tensor_parallel sets it): each computes NH/tp heads, 4C/tp MLP
  // features and about V/tp vocabulary rows. The shapes below are one rank's.
  int tp = 1;
  // Sequence parallelism (mesh.tp_sequence_parallel): outside the tensor-parallel regions a rank holds N/tp of
  // the N = B*T token rows (the residual stream, norms' statistics, block outputs).
  bool sequence_parallel = false;
  std::int64_t local_rows(std::int64_t N) const { return sequence_parallel ? N / tp : N; }  // Nl
  int local_heads() const { return n_head / tp; }          // NHl
  int local_width() const { return n_embd / tp; }          // Cl = NHl * hs: attention and c_proj input width
  int local_vocab() const { return static_cast<int>((vocab_size + tp - 1) / tp); }  // Vl, the largest (rank 0's)

  std::int64_t parameter_count() const;
  // Training FLOPs per token (PaLM, appendix B): 6 x the parameters that multiply (forward 2, backward 4 per
  // weight; wpe is a lookup, and so is wte when the head is untied) plus 12 x L x T x C for the attention
  // score and value products (forward 4 L T C, backward twice that), counted without the causal saving.
  double flops_per_token(int T) const;
  void validate() const;  // UsageError naming the field when the shape is impossible
};

// Gradient buffers of the blocks' backward passes; blocks run one at a time, so they share one set.
struct BlockScratch;

// What a block's backward needs that its forward can rebuild (module.hpp, "Activation checkpointing"): a
// block's own, or, for blocks that recompute in backward, one set the model shares among them. Grow-only:
// allocated for the largest batch shape seen, the views cut to the current one.
struct BlockActivations {
  View1<float> ln1, ln1_mean, ln1_rstd;  // (B,T,C), (B,T), (B,T)
  View1<float> qkv;                      // (B,T,3C)
  View1<float> att;                      // (B,NH,T,T) attention probabilities; fused: (B,NH,T) logsumexp
  View1<float> atty;                     // (B,T,C) attention output before c_proj
  View1<float> res2;                     // (B,T,C) residual after attention
  View1<float> ln2, ln2_mean, ln2_rstd;  // (B,T,C), (B,T), (B,T)
  View1<float> fch, fch_gelu;            // (B,T,4C)

  void ensure(const std::string& label, const GptConfig& config, int B, int T);
  std::int64_t bytes() const;  // allocated
  static std::int64_t bytes_for(const GptConfig& config, int B, int T);

 private:
  std::vector<View1<float>> storage_;  // the allocations behind the views, in member order
};

class Block final : public Module {
 public:
  // `recomputed`: the set every block of the model that recomputes in backward draws from.
  Block(const GptConfig& config, std::shared_ptr<BlockScratch> scratch, std::shared_ptr<BlockActivations> recomputed);
  // Activations held by this block: its output, and its own recomputable set unless it recomputes.
  std::int64_t activation_bytes() const;
  // Megatron's plan for the block (tensor_parallel.hpp): c_attn by heads, c_fc column-parallel, both c_proj
  // row-parallel; norms and the c_proj biases replicated.
  void apply_tensor_parallel(std::shared_ptr<TensorParallelGroup> tp);

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
  void ensure_output(int B, int T);
  BlockScratch& scratch_for(int B, int T);
  void row_parallel_forward(const View1<float>& out, const View1<float>& inp, const Parameter& weight,
                            const Parameter& bias, int N, int in, int OC);

  GptConfig config_;
  std::shared_ptr<BlockScratch> scratch_;
  std::shared_ptr<TensorParallelGroup> tp_;
  RecomputableActivations<BlockActivations> acts_;
  int B_ = 0, T_ = 0;
  View1<float> in_;   // (B,T,C) residual input (the previous module's output, not a copy)
  View1<float> out_;  // (B,T,C) block output, the next block's input (also holds c_proj output before the residual add)
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
  std::int64_t activation_bytes_for(int B, int T, int recomputing_blocks) const override {
    return activation_bytes_for(config_, B, T, recomputing_blocks);
  }
  std::int64_t parameter_count() const override { return config_.parameter_count(); }
  double flops_per_token(int T) const override { return config_.flops_per_token(T); }
  int vocab_size() const override { return config_.vocab_size; }
  int context_length() const override { return config_.context_length; }
  std::string describe() const override;
  // Vocabulary-parallel wte (and lm_head), every block's Megatron plan; wpe and ln_f replicated.
  void apply_tensor_parallel(std::shared_ptr<TensorParallelGroup> tp) override;
  TensorParallelGroup& tensor_parallel() override { return *tp_; }

  // activation_bytes_for from a config alone: saved activations, logits, and the backward scratch the
  // blocks share; `recomputing_blocks` of the L blocks recompute in backward and share one recomputable set.
  static std::int64_t activation_bytes_for(const GptConfig& config, int B, int T, int recomputing_blocks = 0);

 protected:
  void forward(Flow& flow) override;
  void backward(Flow& flow) override;

 private:
  void ensure_activations(int B, int T);
  Parameter& head() { return lm_head ? *lm_head : wte; }

  GptConfig config_;
  std::shared_ptr<BlockScratch> scratch_;
  std::shared_ptr<BlockActivations> recomputed_;  // shared by the blocks that recompute in backward
  std::shared_ptr<TensorParallelGroup> tp_;
  std::vector<std::unique_ptr<Block>> blocks_;
  int B_ = 0, T_ = 0;
  View1<float> x0_;                          // (B,T,C) embedding output
  View1<float> lnf_, lnf_mean_, lnf_rstd_;   // (B,T,C), (B,T), (B,T)
  View1<float> final_x_;                     // (B,T,C) alias of the last block's output
  View1<float> logits_;                      // (B*T,V); holds dlogits after a training forward
  View1<float> losses_;                      // (B*T)
  View1<float> dlnf_;                        // (B,T,C)
  View1<float> dx_;                          // (B,T,C) gradient of the residual stream
  // Sequence parallelism: the residual stream, x0_, dx_ and the final norm's statistics hold this rank's Nl rows;
  // lnf_ and dlnf_ stay (N,C) (gathered, and partial sums before their reduce-scatter).
  View1<float> dlnf_local_;                  // (Nl,C)
  View1<float> norm_grads_;                  // (2C): ln_f's gradients of one backward, before their all-reduce
  // Tensor parallelism only: tokens - v0 (this rank's rows of wte), and the cross-entropy's row statistics.
  View1<std::int32_t> local_tokens_;         // (B*T)
  View1<float> ce_stats_;                    // (3*B*T): max, sum of exp, target logit
};

}  // namespace fsdpp
