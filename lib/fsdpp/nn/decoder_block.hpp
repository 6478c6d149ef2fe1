#pragma once
// DecoderBlock: the transformer block every decoder-only model here shares (pre-norm, causal self-attention with
// grouped-query heads, a gated or plain MLP, two residual adds):
//
//   r   = x + Wo · attention(rotate(qkv(norm1(x))))          qkv: the packed row [q | k | v], rotate: RoPE or none
//   out = r + Wd · act(branches(norm2(r)))                   branches: GPT-2's c_fc; SwiGLU's gate and up
//
// It owns what the models share: the order of the kernels, forward and backward side by side; Megatron's tensor
// parallelism (the qkv projections and the MLP's branches column-parallel, Wo and Wd row-parallel) and sequence
// parallelism around it (tensor_parallel.hpp); activation checkpointing (module.hpp); and its activation and
// scratch buffers, declared once in tables (buffers.hpp) that both allocate them and count them for the planner.
//
// A model's block (gpt.hpp, llama.hpp, qwen2.hpp, qwen3.hpp, mixtral.hpp) supplies its parameters in its own names
// and order (a sparse block's MLP is a MoeFeedForward, moe.hpp), handing
// them over with assemble(), and the MLP's nonlinearity: mlp_activation and its backward. Whether q and k are
// rotated is the model's choice of positions (causal_lm.hpp), taken by the context the blocks share.
//
// Dimensions: B batch, T sequence, N = B*T token rows, C channels. Under tensor parallelism a rank computes
// NHl = NH/tp query heads, NKVl = NKV/tp key/value heads and Fl = F/tp MLP features; under sequence parallelism
// the residual stream holds Nl = N/tp rows (N otherwise).
#include "fsdpp/nn/attention_kind.hpp"
#include "fsdpp/nn/buffers.hpp"
#include "fsdpp/nn/context_parallel.hpp"
#include "fsdpp/nn/kernels/rope.hpp"
#include "fsdpp/nn/kv_cache.hpp"
#include "fsdpp/nn/layers.hpp"
#include "fsdpp/nn/module.hpp"
#include "fsdpp/nn/moe.hpp"
#include "fsdpp/nn/tensor_parallel.hpp"

#include <array>
#include <memory>
#include <vector>

namespace fsdpp {

class DecoderBlock;

// A block's dimensions, the whole model's (before tensor parallelism splits them).
struct BlockDims {
  int C = 0;           // residual stream width
  int heads = 0;       // NH query heads
  int kv_heads = 0;    // NKV key/value heads (NH without grouped-query attention)
  int head_size = 0;   // hs
  int mlp_width = 0;   // F: the MLP's hidden width (GPT-2: 4C)
};

// The MLP's input branches: one (GPT-2's c_fc) or two (SwiGLU's gate and up).
inline constexpr int kMaxMlpBranches = 2;

// What a block's backward needs that its forward can rebuild from the block's input (module.hpp, "Activation
// checkpointing"): a block's own, or, for blocks that recompute in backward, one set the model shares. Grow-only.
struct BlockActivations {
  View1<float> ln1, qkv, att, atty, res2, ln2, h;  // see DecoderBlock::activation_table for shapes
  View1<float> qk_raw, qk_rstd;  // Qwen3's q/k norms' input and statistics (empty without them)
  NormStats ln1_stats, ln2_stats;
  std::array<View1<float>, kMaxMlpBranches> branches;
  Buffers buffers{Growth::grow_only};

  void ensure(const std::string& label, const DecoderBlock& block, int B, int T);
  std::int64_t bytes() const { return buffers.bytes(); }
};

// Gradient buffers of the blocks' backward passes, shared: blocks run one at a time. Exact.
struct BlockScratch {
  View1<float> dres2, dln, dqkv, datty, datt, dh, workspace;
  std::array<View1<float>, kMaxMlpBranches> dbranches;
  // Sequence parallelism only (empty otherwise): dres2 then holds the gathered (N,C) gradient, this rank's rows in
  // its own block.
  View1<float> gathered, dln_local, norm_grads, qk_norm_grads;
  Buffers buffers{Growth::exact};
};

// RoPE's cos and sin tables (context_length, hs/2), filled once, for models whose positions are rotary.
struct RotaryTables {
  bool enabled = false;
  int context_length = 0, head_size = 0;
  double theta = 10000.0;
  kernels::RopeScaling scaling;
  View1<float> cos, sin;
  Buffers buffers{Growth::exact};

  BufferTable table();  // empty unless enabled
  void ensure();        // allocates and fills on the first call (after to_empty: nothing on meta)
};

// A decode forward's buffers (kv_cache.hpp), shared by the blocks, for N rows over a cache of `capacity`
// positions. Grow-only: a prefill's rows serve every decode step after it.
struct DecodeBuffers {
  View1<float> ln1, qkv, atty, res2, ln2, h, scores;  // see DecoderBlock::decode_table for shapes
  NormStats ln1_stats, ln2_stats;
  std::array<View1<float>, kMaxMlpBranches> branches;
  std::array<View1<float>, 2> x;  // the residual stream: the embedding's output, then each block's, alternating
  Buffers buffers{Growth::grow_only};
};

// What a model's blocks share.
struct BlockContext {
  AttentionKind attention = AttentionKind::automatic;
  std::shared_ptr<TensorParallelGroup> tp = std::make_shared<TensorParallelGroup>();
  BlockScratch scratch;
  BlockActivations recomputed;  // the set of the blocks that recompute in backward
  RotaryTables rotary;
  DecodeBuffers decode;
  // Document masks (kernels/document.hpp): each row's document start in the batch the model's forward is on,
  // set by it before the blocks run (empty without data.document_mask); reset_positions: RoPE reads them too.
  View1<std::int32_t> document_starts;
  bool reset_positions = false;
  // Context parallelism (context_parallel.hpp): the ring, and the global position of each local row (set by the
  // model's forward; empty without cp, where row b*T + t sits at t).
  std::shared_ptr<ContextParallelGroup> cp = std::make_shared<ContextParallelGroup>();
  View1<std::int32_t> positions;
  // Reproducible mode's token chunks (gradient_chunks.hpp): off unless train.reproducible_chunks > 1.
  GradientChunks chunks;
  // Mixture-of-experts blocks (moe.hpp). dense_mlp: some block has a dense MLP, whose rows the shared tables
  // (scratch, recomputation, decode) then hold; a model of sparse blocks only leaves them out. router: the
  // balancing losses of a forward over every sparse block; recording: set by the model during a training
  // forward, so the blocks record into it (a recomputation, an evaluation or a decode does not).
  bool dense_mlp = true;
  std::shared_ptr<RouterStatistics> router;
  RouterStatistics* recording = nullptr;
  std::shared_ptr<ExpertParallelGroup> ep;  // mesh.ep > 1: the sparse blocks' exchange (expert_parallel.hpp)
  MoeScratch moe_scratch;
  MoeActivations recomputed_moe;  // the set of the sparse blocks that recompute in backward
  MoeActivations decode_moe;
  const std::int32_t* attention_starts() const {
    return document_starts.extent(0) ? document_starts.data() : nullptr;
  }
  const std::int32_t* rope_starts() const { return reset_positions ? attention_starts() : nullptr; }
  // Each row's global position under cp (RoPE's angle, or the row of GPT-2's position table); nullptr: t.
  const std::int32_t* rope_positions() const { return positions.extent(0) ? positions.data() : nullptr; }
};

// One column slice of the packed [q | k | v] row: a projection and how tensor parallelism splits its rows
// (GPT-2's c_attn holds q, k and v stacked: 3 blocks, each split alike; Llama's q_proj one block).
struct QkvProjection {
  Linear* linear;
  int tp_blocks = 1;
};

// A model's block parameters, in the roles the skeleton computes with.
struct BlockParts {
  Norm* attention_norm = nullptr;
  std::vector<QkvProjection> qkv;  // in column order
  Linear* attention_out = nullptr;  // row-parallel
  Norm* mlp_norm = nullptr;
  std::vector<Linear*> mlp_in;      // column-parallel branches, their outputs into act()
  Linear* mlp_out = nullptr;        // row-parallel
  MoeFeedForward* moe = nullptr;    // instead of the three above: a mixture of experts (moe.hpp)
  // Qwen3: RMSNorm over each head's hs channels of q and of k, before RoPE (one weight (hs) per norm).
  Norm* q_norm = nullptr;
  Norm* k_norm = nullptr;
};
class DecoderBlock : public Module {
 public:
  // This rank's widths (tensor parallelism divides the heads and the MLP width).
  struct Local {
    int heads, kv_heads, head_size, attention_width, qkv_width, mlp_width;  // NHl, NKVl, hs, NHl*hs, W, Fl
  };
  Local local() const;
  const BlockDims& dims() const { return dims_; }
  const BlockParts& parts() const { return parts_; }
  // Backward's replay of forward (activation checkpointing) stops before this layer: it and the residual add after
  // it only make the block's output, which backward does not read (forward() in decoder_block.cpp).
  // A sparse block's replay runs its experts too (the combine weights' gradient reads their outputs): nullptr.
  const Linear* recompute_stops_before() const { return parts_.mlp_out; }
  MoeFeedForward* moe() const { return parts_.moe; }
  int sparse_index() const { return sparse_index_; }  // among the model's sparse blocks; -1: dense

  // The tables: what each buffer is, for a batch of B sequences of T tokens (allocated by ensure, counted by
  // the planner from the same rows).
  BufferTable activation_table(BlockActivations& a, int B, int T) const;
  BufferTable scratch_table(BlockScratch& s, int B, int T) const;
  BufferTable decode_table(DecodeBuffers& d, int N, int capacity) const;
  // The dense MLP's width in the tables above: this rank's F when some block of the model is dense, else 0.
  int dense_mlp_table_width() const;
  std::int64_t output_bytes(int B, int T) const;  // the block's output, kept for the next block
  // The floats a backward of B sequences of T tokens leaves in a weight-gradient stash (zero_bubble's I).
  std::int64_t weight_stash_elements(int B, int T) const;
  // Held by this block now: its output and, unless it recomputes, its own activation set.
  std::int64_t activation_bytes() const;

  // Megatron's placements of this block's parameters over `tp` (context's group): the qkv projections and the
  // MLP branches Shard(0) (c_attn strided by q, k, v), Wo and Wd Shard(1); norms and Wo/Wd biases replicated.
  void apply_tensor_parallel(const TensorParallelGroup& tp);
  int index() const { return index_; }  // among the model's blocks: its KV cache's
  // The MLP's nonlinearity by name ("gelu", "swiglu"): the kernel family the performance model prices it as
  // (plan/machine.hpp, kernel_family_names).
  virtual const char* mlp_activation_name() const = 0;


 protected:
  DecoderBlock(std::string type_name, const BlockDims& dims, std::shared_ptr<BlockContext> context);
  // Called by the model's block at the end of its constructor, once its parameters are registered.
  void assemble(BlockParts parts);

  // The MLP's nonlinearity, forward and backward, over n elements: h from the branches' outputs; the branches'
  // gradients (which it overwrites) from dh.
  using Branches = std::array<View1<float>, kMaxMlpBranches>;
  virtual void mlp_activation(const View1<float>& h, const Branches& branches, std::int64_t n) const = 0;
  virtual void mlp_activation_backward(const Branches& dbranches, const View1<float>& dh, const Branches& branches,
                                       std::int64_t n) const = 0;

  void forward(Flow& flow) override;
  void backward(Flow& flow) override;
  void backward_weight(Flow& flow) override;

 private:
  friend class CausalLM;  // numbers the blocks
  // Flow::decode set: the rows' keys and values into the cache, attention over it (kv_cache.hpp).
  void decode_forward(Flow& flow);
  BlockScratch& scratch_for(int B, int T);
  MoeScratch& moe_scratch_for(int N);
  void ensure_output(int B, int T);
  // out = inp @ W^T (+ b) for a Linear whose input features are split over tp: the partial products summed over
  // tp (reduce_row_parallel), then the replicated bias added once.
  void row_parallel_forward(const View1<float>& out, const View1<float>& inp, const Linear& l, int N, int in);
  // norm(in) into this rank's rows of `out` ((N,C); own block under sequence parallelism), then gathered.
  void norm_forward(const Norm& norm, const View1<float>& out, const NormStats& stats, const View1<float>& in, int N);
  // Qwen3's q/k norms' backward under reproducible chunks (gradient_chunks.hpp).
  void qk_norm_chunked_backward(const View1<float>& dqkv, const BlockActivations& a, int N, int W, const Local& l);
  // backward's phases, in its order (flow.dx holds d(out) until the last writes d(in) there):
  // the MLP's (or the experts') backward and its norm's: d(res2), this rank's rows of s.dres2, returned;
  View1<float> mlp_backward(Flow& flow, BlockScratch& s, const BlockActivations& a, const Local& l);
  // attention from Wo's output gradient back to the packed q/k/v rows' gradient in s.dqkv (rotary, q/k norms);
  void attention_backward_to_qkv(Flow& flow, BlockScratch& s, const BlockActivations& a, const Local& l);
  // the q/k/v projections' and Wo's gradients, and the attention norm's: d(in) = d(res2) + the norm's, in flow.dx.
  void qkv_backward(Flow& flow, BlockScratch& s, const BlockActivations& a, const Local& l, const View1<float>& dres2);
  // Parts of them: the dense MLP's input projections' weight gradients; Qwen3's q/k norms' backward without
  // reproducible chunks (their weight gradients summed over tp).
  void mlp_in_weight_gradients(const Flow& flow, BlockScratch& s, const BlockActivations& a, const Local& l, int N);
  void qk_norm_backward_unchunked(BlockScratch& s, const BlockActivations& a, int N, const Local& l);

  BlockDims dims_;
  int index_ = 0;
  BlockParts parts_;
  std::shared_ptr<BlockContext> context_;
  RecomputableActivations<BlockActivations> acts_;
  RecomputableActivations<MoeActivations> moe_acts_;
  int sparse_index_ = -1;
  int B_ = 0, T_ = 0;
  View1<float> in_;   // (Nl,C) residual input (the previous module's output, not a copy)
  View1<float> out_;  // (Nl,C) block output, the next block's input (also holds Wo's output before the residual)
  // Activation slots (module.hpp): the own activations, input and output of the micro-batches not computed now.
  struct SlotState {
    BlockActivations acts;
    MoeActivations moe_acts;               // a sparse block's
    MoeFeedForward::ForwardState moe;      // its route and exchange
    View1<float> in, out;
    int B = 0, T = 0;
  };
  SlotStates<SlotState> slots_;
  void swap_activation_slot(int from, int to) override;
};

}  // namespace fsdpp
