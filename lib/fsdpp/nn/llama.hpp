#pragma once
// Llama (Llama 2 / Llama 3 family): token embedding, L pre-RMSNorm blocks (grouped-query causal self-attention
// with rotary position embeddings, and a SwiGLU MLP, each with a residual add), a final RMSNorm and an LM head,
// untied by default. No biases, no position table.
//
// Parameter names are Hugging Face's LlamaForCausalLM names without the leading "model." (lm_head.weight keeps
// its own), so import/export maps them 1:1 (ckpt/hf_llama.hpp):
//   embed_tokens.weight                      (V, C)
//   layers.<l>.input_layernorm.weight        (C)
//   layers.<l>.self_attn.q_proj.weight       (NH*hs, C)     hs = C/NH
//   layers.<l>.self_attn.k_proj.weight       (NKV*hs, C)
//   layers.<l>.self_attn.v_proj.weight       (NKV*hs, C)
//   layers.<l>.self_attn.o_proj.weight       (C, NH*hs)
//   layers.<l>.post_attention_layernorm.weight (C)
//   layers.<l>.mlp.gate_proj.weight          (F, C)
//   layers.<l>.mlp.up_proj.weight            (F, C)
//   layers.<l>.mlp.down_proj.weight          (C, F)
//   norm.weight                              (C)
//   lm_head.weight                           (V, C), absent when tie_embeddings
// RoPE uses Hugging Face's half-split convention (kernels/rope.hpp), so q_proj and k_proj rows are stored
// exactly as Hugging Face stores them. Dimensions: B batch, T sequence, C channels, NH query heads, NKV key/value
// heads, F the MLP width, V vocabulary, L layers, N = B*T rows.
#include "fsdpp/nn/attention_kind.hpp"
#include "fsdpp/nn/kernels/rope.hpp"
#include "fsdpp/nn/language_model.hpp"

#include <memory>
#include <vector>

namespace fsdpp {

struct LlamaConfig {
  int vocab_size = 256;         // V
  int context_length = 64;      // maximum T (rows of the RoPE tables)
  int n_embd = 64;              // C
  int n_layer = 2;              // L
  int n_head = 4;               // NH
  int n_kv_head = 2;            // NKV, dividing NH
  int ffn_hidden = 176;         // F (the deck: model.ffn_hidden, or llama_ffn_hidden in config/deck.hpp)
  double rope_theta = 10000.0;  // RoPE base
  kernels::RopeScaling rope_scaling;  // Llama 3.1+ frequency scaling (factor 1: none)
  double norm_eps = 1e-5;       // RMSNorm eps
  bool tie_embeddings = false;  // LM head shares embed_tokens.weight
  AttentionKind attention = AttentionKind::automatic;  // model.attention (nn/attention_kind.hpp)

  // Tensor parallelism (mesh.tp; Llama::apply_tensor_parallel sets them): each rank computes NH/tp query heads,
  // NKV/tp key/value heads, F/tp MLP features and about V/tp vocabulary rows; under sequence parallelism the
  // residual stream holds N/tp of the N = B*T token rows. The local_* shapes are one rank's.
  int tp = 1;
  bool sequence_parallel = false;

  int head_size() const { return n_embd / n_head; }
  int kv_width() const { return n_kv_head * head_size(); }
  int local_heads() const { return n_head / tp; }                    // NHl
  int local_kv_heads() const { return n_kv_head / tp; }              // NKVl
  int local_width() const { return local_heads() * head_size(); }    // Cl: q and o_proj's input
  int local_kv_width() const { return local_kv_heads() * head_size(); }
  int local_ffn() const { return ffn_hidden / tp; }                  // Fl
  int local_vocab() const { return static_cast<int>((vocab_size + tp - 1) / tp); }  // Vl, the largest (rank 0's)
  std::int64_t local_rows(std::int64_t N) const { return sequence_parallel ? N / tp : N; }  // Nl
  std::int64_t parameter_count() const;
  // Training FLOPs per token: 6 x the matmul parameters (the projections and the LM head; the embedding is a
  // lookup unless it is the tied head, the norms are not matmuls) + 12 x L x T x C for the attention products.
  double flops_per_token(int T) const;
  void validate() const;  // UsageError naming the field when the shape is impossible
};

struct LlamaScratch;  // gradient buffers of the blocks' backward passes, shared: blocks run one at a time
struct RopeTables;    // cos and sin (context_length, hs/2), shared by the blocks

// What a block's backward needs that its forward can rebuild from the block's input (module.hpp, "Activation
// checkpointing"): a block's own, or, for blocks that recompute in backward, one set the model shares among
// them. Grow-only: allocated for the largest batch shape seen, the views cut to the current one. The block
// output is held apart (LlamaBlock::out_).
struct LlamaActivations {
  View1<float> ln1, ln1_rstd;  // (B,T,C), (B,T)
  View1<float> qkv;            // (B,T,C+2*NKV*hs) packed [q | k | v], q and k after RoPE
  View1<float> att;            // (B,NH,T,T) attention probabilities; fused: (B,NH,T) logsumexp
  View1<float> atty;           // (B,T,C) attention output before o_proj
  View1<float> res2;           // (B,T,C) residual after attention
  View1<float> ln2, ln2_rstd;  // (B,T,C), (B,T)
  View1<float> gate, up, h;    // (B,T,F) gate_proj and up_proj outputs, silu(gate) * up

  void ensure(const std::string& label, const LlamaConfig& config, int B, int T);
  std::int64_t bytes() const;  // allocated
  static std::int64_t bytes_for(const LlamaConfig& config, int B, int T);

 private:
  std::vector<View1<float>> storage_;  // the allocations behind the views, in member order
};

class LlamaBlock final : public Module {
 public:
  // `recomputed`: the set every block of the model that recomputes in backward draws from.
  LlamaBlock(const LlamaConfig& config, std::shared_ptr<LlamaScratch> scratch, std::shared_ptr<RopeTables> rope,
             std::shared_ptr<LlamaActivations> recomputed);
  // Activations held by this block: its output, and its own recomputable set unless it recomputes.
  std::int64_t activation_bytes() const;
  // torchtitan's plan: q, k, v, gate and up column-parallel (Shard(0)), o and down row-parallel (Shard(1)), the
  // norms replicated.
  void apply_tensor_parallel(std::shared_ptr<TensorParallelGroup> tp);

  Parameter& input_layernorm;           // (C)
  Parameter& q_proj;                    // (C, C)
  Parameter& k_proj;                    // (NKV*hs, C)
  Parameter& v_proj;                    // (NKV*hs, C)
  Parameter& o_proj;                    // (C, C)
  Parameter& post_attention_layernorm;  // (C)
  Parameter& gate_proj;                 // (F, C)
  Parameter& up_proj;                   // (F, C)
  Parameter& down_proj;                 // (C, F)


 protected:
  void forward(Flow& flow) override;
  void backward(Flow& flow) override;

 private:
  void ensure_output(int B, int T);
  void row_parallel_forward(const View1<float>& out, const View1<float>& inp, const Parameter& weight, int N, int in);

  LlamaConfig config_;
  std::shared_ptr<LlamaScratch> scratch_;
  std::shared_ptr<RopeTables> rope_;
  std::shared_ptr<TensorParallelGroup> tp_;
  int B_ = 0, T_ = 0;
  View1<float> in_;   // (B,T,C) residual input (the previous module's output, not a copy)
  RecomputableActivations<LlamaActivations> acts_;
  View1<float> out_;  // (B,T,C) block output (also holds o_proj's output before the residual add)
};

class Llama final : public LanguageModel {
 public:
  explicit Llama(const LlamaConfig& config);  // on "meta": shapes and init rules only, no storage
  const LlamaConfig& config() const { return config_; }
  std::vector<LlamaBlock*> blocks() const;

  Parameter& embed_tokens;  // (V, C)
  Parameter& norm;          // (C)
  Parameter* lm_head;       // (V, C) unless tied (embed_tokens serves)

  // LanguageModel
  std::vector<Module*> block_modules() const override;
  View1<float> losses() const override { return losses_; }
  std::int64_t activation_bytes() const override;
  std::int64_t activation_bytes_for(int B, int T, int recomputing_blocks) const override;
  std::int64_t parameter_count() const override { return config_.parameter_count(); }
  double flops_per_token(int T) const override { return config_.flops_per_token(T); }
  int vocab_size() const override { return config_.vocab_size; }
  int context_length() const override { return config_.context_length; }
  std::string describe() const override;
  // Vocabulary-parallel embed_tokens (and lm_head), every block's plan; the final norm replicated.
  void apply_tensor_parallel(std::shared_ptr<TensorParallelGroup> tp) override;
  TensorParallelGroup& tensor_parallel() override { return *tp_; }

 protected:
  void forward(Flow& flow) override;
  void backward(Flow& flow) override;

 private:
  void ensure_activations(int B, int T);
  Parameter& head() { return lm_head ? *lm_head : embed_tokens; }

  LlamaConfig config_;
  std::shared_ptr<LlamaScratch> scratch_;
  std::shared_ptr<RopeTables> rope_;
  std::shared_ptr<LlamaActivations> recomputed_;  // shared by the blocks that recompute in backward
  std::shared_ptr<TensorParallelGroup> tp_;
  std::vector<std::unique_ptr<LlamaBlock>> blocks_;
  int B_ = 0, T_ = 0;
  View1<float> x0_;                // (B,T,C) embedding output
  View1<float> lnf_, lnf_rstd_;    // (B,T,C), (B,T)
  View1<float> final_x_;           // (B,T,C) alias of the last block's output
  View1<float> logits_;            // (B*T,V); holds dlogits after a training forward
  View1<float> losses_;            // (B*T)
  View1<float> dlnf_;              // (B,T,C)
  View1<float> dx_;                // (B,T,C) gradient of the residual stream
  // Tensor parallelism (as Gpt's): local token ids, the cross-entropy's row statistics; under sequence
  // parallelism x0_, dx_ and lnf_rstd_ hold this rank's Nl rows and these two are added.
  View1<std::int32_t> local_tokens_;  // (B*T)
  View1<float> ce_stats_;             // (3*B*T)
  View1<float> dlnf_local_;           // (Nl,C)
  View1<float> norm_grads_;           // (C): the final norm's gradient of one backward, before its all-reduce
};

}  // namespace fsdpp
