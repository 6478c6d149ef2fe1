#pragma once
// Context parallelism (mesh.cp): one sequence's positions split over the cp ranks, attention as a ring.
//
//   chunks of c = T / 2cp positions:   | 0 | 1 | 2 | 3 | 4 | 5 | 6 | 7 |     (cp = 4)
//   rank r holds chunks r, 2cp-1-r:      r0  r1  r2  r3  r3  r2  r1  r0
//
// Under the causal mask chunk k attends to k+1 chunks, so the pairs (r, 2cp-1-r) give every rank the same work
// (2cp + 1 chunk pairs): the load-balanced layout of Megatron-CP and torchtitan. A rank's Tl = 2c local rows are
// [chunk r | chunk 2cp-1-r]; embeddings, norms, MLPs and the loss work on them as on any rows, RoPE rotates them
// at their global positions, and the loss is each rank's local mean, which fully_shard's average over dp_shard x cp
// (every rank the same count of tokens) turns into the mean over the global batch, as at cp 1.
//
// The model's forward hands the whole sequences' tokens to localize(), which picks this rank's rows (tokens,
// targets, global positions and, with document masks, each row's document start as a global position, computed
// over the whole row first) and the flow then carries T/cp.
//
// Attention: each rank packs its [k | v] rows into a block and the blocks travel round the cp ring (to rank+1,
// from rank-1; grouped-query attention sends only the KV heads). At step s a rank holds the block of rank r-s:
// the exchange of the next block is issued before this block's attention (kernels/ring_attention.hpp) and waited
// after, so it overlaps; the partial results merge by the online-softmax (log-sum-exp) rule. Backward sends the
// blocks round again, and with them each block's dk, dv: every rank adds its queries' contribution to the partial
// sums it received and passes them on, and after cp hops they are home. Blocks above the causal diagonal, and
// those a document mask makes empty, are skipped inside the kernels (chunk pairs with nothing visible cost no
// work). The exchanges are all_to_all_v calls on the cp communicator with one peer each way: counted, traced and
// watched like every collective.
//
// All buffers are allocated once per shape (tables below), so a step allocates nothing.
//
// Reproducible chunks (train.reproducible_chunks, set_fixed_order): the ring's merge order depends on cp, so
// instead every rank all-gathers the whole sequences' rows (forward: [q | k | v]; backward: those, the output, its
// gradient and the log-sum-exp) and runs the fused kernels of cp 1 on them, keeping its own rows: each row's bits
// are then those of cp 1. This costs cp times the attention work and whole-sequence buffers for attention; the
// rest of the model keeps its 1/cp rows.
#include "fsdpp/comm/communicator.hpp"
#include "fsdpp/config/deck.hpp"
#include "fsdpp/nn/buffers.hpp"
#include "fsdpp/nn/kernels/attention.hpp"
#include "fsdpp/tensor/types.hpp"

#include <cstdint>
#include <vector>

namespace fsdpp {

namespace kernels {
struct RingBlock;
}

// The exchanges and their bytes, for logs and benchmarks.
struct ContextParallelStats {
  std::uint64_t exchanges = 0;    // ring hops issued (forward and backward)
  std::uint64_t bytes_sent = 0;   // to the next rank
  double compute_seconds = 0;     // the ring's attention kernels (fenced), forward and backward
  double wait_seconds = 0;        // time spent waiting for a hop after the block's compute: the exposed part
};

class ContextParallelGroup {
 public:
  ContextParallelGroup() = default;  // one rank: no context parallelism
  // `comm` may refuse to communicate (a planning mesh): the model is then only shaped, never run.
  ContextParallelGroup(int ranks, int rank, Communicator* comm);

  int ranks() const { return ranks_; }
  int rank() const { return rank_; }
  bool active() const { return ranks_ > 1; }
  // Rows of a sequence of T positions this rank holds: T / cp.
  int local_length(int T) const { return T / ranks_; }
  // The global chunk index of part p (0 or 1) of rank r's rows, of 2 cp chunks.
  static int sequence_chunk_of(int rank, int part, int ranks) { return part == 0 ? rank : 2 * ranks - 1 - rank; }

  // This rank's rows of a batch's sequences: tokens, targets and global positions of the (B, T/cp) local rows, and
  // with document masks their documents' starts, as global positions, here and over the whole rows (the fixed
  // order's attention reads those). Per micro-batch: the model keeps them with its activations (its activation
  // slots, so a pipeline's backward finds its forward's rows) and hands the current ones back with use_rows.
  struct LocalRows {
    View1<std::int32_t> tokens, targets, positions;
    View1<std::int32_t> starts, full_starts;  // empty without document masks
  };
  // `rows`' buffers for a (B, T/cp) local batch, into the model's table `t`.
  void add_rows(BufferTable& t, LocalRows& rows, int B, int T_local) const;
  // Forward's entry: from the whole (B,T) `tokens` and `targets`, this rank's rows into `rows` (add_rows' buffers,
  // eot_id >= 0 exactly when configured with document masks), which become the ones attention reads.
  void localize(const LocalRows& rows, const View1<const std::int32_t>& tokens,
                const View1<const std::int32_t>& targets, int B, int T, int eot_id);
  void use_rows(const LocalRows& rows) { rows_ = rows; }

  // Ring attention over the local rows (shape.T = T/cp), with the starts localize() made (or none: `s.starts`). Forward:
  // out (B,Tl,NH*hs), lse (B,NH,Tl) for backward, row_sums (B,NH,Tl) scratch. Backward ACCUMULATES into dinp
  // like the kernels; delta (B,NH,Tl) scratch.
  void attention_forward(const View1<float>& out, const View1<float>& lse, const View1<float>& row_sums,
                         const View1<const float>& inp, const kernels::AttentionShape& s);
  void attention_backward(const View1<float>& dinp, const View1<float>& delta, const View1<const float>& dout,
                          const View1<const float>& inp, const View1<const float>& out, const View1<const float>& lse,
                          const kernels::AttentionShape& s);

  // What the model's blocks send round the ring: `kv_width` = 2 NKV hs floats per row (this tp rank's KV heads),
  // and whether localize() makes document starts. The model sets both (apply_context_parallel, its masks).
  void configure(int kv_width, bool document_masks);
  int kv_width() const { return kv_width_; }
  // Reproducible chunks: attention in cp 1's fixed order (above), for blocks of `heads` query heads of q_width
  // floats per row (this tp rank's). After configure.
  void set_fixed_order(int q_width, int heads);
  // The buffers the ring needs for a (B, T/cp) local batch (the rows it works on are the model's: add_rows).
  BufferTable buffer_table(int B, int T_local);
  std::int64_t buffer_bytes() const { return buffers_.bytes(); }
  // Bytes one rank sends per training step for `layers` attention layers: forward cp-1 block hops, backward cp-1
  // block hops and cp hops of the blocks' gradients, each block B x T/cp x kv_width floats (the plan's, the
  // performance model's and the benchmark's one formula).
  static std::uint64_t ring_bytes_per_step(int ranks, int B, int T_local, int kv_width, int layers);
  // The floats per row a block carries for model `m` under tensor parallelism `tp`: this tp rank's K and V heads.
  static int kv_width_of(const ModelConfig& m, int tp) {
    return 2 * (is_llama_family(m.arch) ? m.n_kv_head : m.n_head) / tp * head_size(m);
  }
  // One hop: a block of B x T/cp rows of kv_width floats.
  static std::int64_t hop_bytes(int B, int T_local, int kv_width) {
    return std::int64_t{B} * T_local * kv_width * 4;
  }
  const ContextParallelStats& stats() const { return stats_; }
  // Element-wise sums over the cp ranks, in place (the router's statistics of a sequence split over them). Through
  // a device buffer, kept between calls, since an NCCL communicator moves device memory only.
  void sum_over_ranks(std::vector<double>& values);

 private:
  kernels::RingBlock block(const kernels::AttentionShape& s, int source) const;
  // Before a pass: the buffers for its shape and the hop's size; this rank's own block.
  kernels::RingBlock prepare(const kernels::AttentionShape& s);
  void ensure_buffers(int B, int T_local);
  // Starts the hop of `send` to rank + 1 while `recv` receives from rank - 1.
  WorkHandle shift(const View1<float>& send, const View1<float>& recv);
  void wait(WorkHandle& work);
  // What the backward's step k adds its part to: nothing at the first step, the partial sums received after.
  View1<const float> partial_view(int k) const { return k == 0 ? View1<const float>() : View1<const float>(dkv_in_); }
  // Runs `kernels` (one ring step's compute) and adds its time, fenced, to stats().compute_seconds.
  template <class Kernels> void timed(const Kernels& kernels);
  // The fixed order's passes (set_fixed_order) and its gather: every rank's (outer, Tl, width) rows as whole
  // sequences (outer, T, width) into `whole`.
  void fixed_order_forward(const View1<float>& out, const View1<float>& lse, const View1<const float>& inp,
                           const kernels::AttentionShape& s);
  void fixed_order_backward(const View1<float>& dinp, const View1<const float>& dout, const View1<const float>& inp,
                            const View1<const float>& out, const View1<const float>& lse,
                            const kernels::AttentionShape& s);
  void gather_whole(const View1<float>& whole, const View1<const float>& local, std::int64_t outer, int Tl, int width);
  kernels::AttentionShape whole_shape(const kernels::AttentionShape& s) const;

  int ranks_ = 1, rank_ = 0;
  Communicator* comm_ = nullptr;
  ContextParallelStats stats_;
  // all_to_all_v's per-peer layout: one peer each way
  std::vector<std::size_t> send_counts_, send_displs_, recv_counts_, recv_displs_;
  std::size_t hop_count_ = 0;
  Buffers buffers_{Growth::exact};
  LocalRows rows_;  // the micro-batch's computed now (use_rows)
  View1<float> kv_[2], dkv_in_, dkv_out_;
  View1<double> sums_;  // sum_over_ranks' buffer
  // fixed order: the all-gather's blocks, and whole sequences' rows, outputs, their gradients and row statistics
  View1<float> gathered_, whole_inp_, whole_out_, whole_dout_, whole_dinp_, whole_lse_, whole_delta_;
  int kv_width_ = 0;
  bool document_masks_ = false;
  bool fixed_order_ = false;
  int q_width_ = 0, heads_ = 0;
};

}  // namespace fsdpp
