#pragma once
// Decoding with a KV cache: what a forward pass of a CausalLM computes when Flow::decode is set, instead of
// the training forward (causal_lm.hpp, decoder_block.hpp).
//
// A decode forward runs a ragged batch of rows (kernels/decode.hpp): row n is token tokens[n] of sequence
// sequence[n] at position position[n]. A prefill passes every prompt token of every sequence at once (prompts of
// any lengths, no padding); a decode step passes one row per sequence. Each block appends the rows' keys and
// values to its cache and attends each row over its sequence's positions 0..position[n]; the model then leaves
// the logits of each sequence's last row, over the whole vocabulary, in DecodeStep::logits.
//
// It goes through the modules' one door, like evaluation, so fully_shard's hooks gather the parameters as they
// do for any forward (sampling during training runs on the sharded model). Under tensor parallelism each rank
// caches its own key/value heads; sequence parallelism is not used (the rows are few).
#include "fsdpp/tensor/types.hpp"

#include <cstdint>
#include <vector>

namespace fsdpp {

// The keys and values of every block: k, v (sequences, capacity, this rank's NKV*hs) each.
class KvCache {
 public:
  KvCache() = default;
  // Storage for `sequences` of up to `capacity` positions in `blocks` blocks of `kv_width` channels; with `kept`
  // (a pipeline stage's blocks: kept[b] for each of the model's), only those blocks get storage.
  KvCache(int blocks, int sequences, int capacity, int kv_width, const std::vector<bool>* kept = nullptr);
  // What such a cache takes: 2 (k, v) x blocks x sequences x capacity x kv_width floats (`fsdpp plan --generate`).
  static std::int64_t bytes_for(int blocks, int sequences, int capacity, int kv_width);

  int sequences() const { return sequences_; }
  int capacity() const { return capacity_; }
  const View1<float>& k(int block) const { return k_[static_cast<std::size_t>(block)]; }
  const View1<float>& v(int block) const { return v_[static_cast<std::size_t>(block)]; }
  std::int64_t bytes() const { return bytes_for(stored_, sequences_, capacity_, kv_width_); }

 private:
  int sequences_ = 0, capacity_ = 0, kv_width_ = 0, stored_ = 0;
  std::vector<View1<float>> k_, v_;
};

// Under a pipeline (parallel/pipeline_parallel.hpp), how a stage's decode forward gets its rows' residual stream
// from the stage before each of its chunks, hands it on after, and gets the last stage's logits.
class DecodeStageLink {
 public:
  virtual ~DecodeStageLink() = default;
  virtual void receive(const View1<float>& x, std::size_t count, int chunk) = 0;  // (N, C) into x
  virtual void send(const View1<float>& x, std::size_t count, int chunk) = 0;
  virtual void share_logits(std::vector<float>& logits) = 0;  // the last stage's, sized alike on every stage
};

// One decode forward: the rows in, the logits out.
struct DecodeStep {
  int N = 0;                                 // rows
  View1<const std::int32_t> tokens;          // (N)
  View1<const std::int32_t> sequence;        // (N) in [0, cache->sequences())
  View1<const std::int32_t> position;        // (N) in [0, cache->capacity())
  View1<const std::int32_t> last_row;        // (S) the row whose logits each sequence gets
  KvCache* cache = nullptr;
  DecodeStageLink* stage_link = nullptr;     // a pipeline stage's; null for the whole model
  // Out: (S, V) logits of each sequence's last row, whole vocabulary (gathered over tensor parallelism), on the
  // host: sampling reads them there.
  std::vector<float> logits;
};

}  // namespace fsdpp
