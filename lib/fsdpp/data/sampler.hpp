#pragma once
// WindowSampler: training and validation sequences from one token stream.
//
// Splits. The last floor(val_fraction * N) tokens form the validation region; training windows lie wholly in the
// tokens before it, so no training target is ever a validation token.
//
// Sequences. A sequence is a window of T + 1 tokens at offset o: inputs tokens[o .. o+T-1], targets
// tokens[o+1 .. o+T]. The sample order is global and depends only on (seed, split, data): global batch s is made
// of the sequences with global indices s*G .. s*G + G-1, and
//   train: sequence i starts at mix(seed, i) mod (number of training offsets): random windows, with replacement,
//          at any token offset (counter-based, so any rank jumps straight to its sequences);
//   val:   sequence i is the (i mod W)-th of the W windows that tile the validation region with stride T, so an
//          evaluation of the first few val batches sees the same sequences every time and val losses compare.
//
// Data parallelism. A rank never draws its own samples: it takes a contiguous part of each global batch
// (micro_batch_first_sequence), so the union over ranks of global batch s is the same for 1 rank or 64, and
// ranks are disjoint within it. With the loss averaged over the global batch, the same deck trains the same model
// at any data-parallel size.
//
// Resumable state. Because draws are counter-based, the whole generator state is (seed, next_step):
// SamplerState, which the checkpoint stores. Restoring it makes the next batch exactly the one the saved run
// would have drawn.
#include <cstdint>
#include <vector>

namespace fsdpp {

enum class Split { train, val };

// shuffled: window i of the global order starts at a seeded hash of i; sequential: at (i mod W) * T, the W
// windows of T+1 tokens at stride T that fit before the validation split (llm.c / nanoGPT loaders).
enum class SampleOrder { shuffled, sequential };

struct SamplerState {
  std::uint64_t seed = 0;
  std::int64_t next_step = 0;  // the next training global batch to draw
  // Identity of the data, checked on restore: resuming on other data or another T would silently change the run.
  std::int64_t num_tokens = 0;
  std::int64_t seq_len = 0;
};

// What every sampler checks of a request for sequences first_sequence .. first_sequence+count-1 of global batch
// `step`: a step >= 0, a batch >= 1, the sequences inside it, and a validation split when one is asked for
// (`has_val`). UsageError otherwise.
void check_batch_request(Split split, bool has_val, std::int64_t step, std::int64_t global_batch,
                         std::int64_t first_sequence, std::int64_t count);

class WindowSampler {
 public:
  // tokens: the whole stream (moved in); seq_len: T >= 1; val_fraction in [0, 1). UsageError when a split is
  // too short to hold one window of T + 1 tokens.
  WindowSampler(std::vector<std::uint32_t> tokens, std::int64_t seq_len, double val_fraction, std::uint64_t seed,
                SampleOrder order = SampleOrder::shuffled);
  SampleOrder order() const { return order_; }
  std::int64_t sequential_windows() const;  // training windows in sequential order
  // Sequential order: the pass over the training windows that global batch `step` falls in (0-based).
  std::int64_t epoch_of(std::int64_t step, std::int64_t global_batch) const;

  std::int64_t seq_len() const { return seq_len_; }
  std::int64_t num_tokens() const { return static_cast<std::int64_t>(tokens_.size()); }
  std::int64_t val_begin() const { return val_begin_; }  // first validation token; == num_tokens() if no split
  std::int64_t train_offsets() const { return val_begin_ - seq_len_; }  // distinct training window offsets
  std::int64_t val_windows() const { return val_windows_; }              // 0 when val_fraction is 0
  bool has_val() const { return val_windows_ > 0; }
  const std::vector<std::uint32_t>& tokens() const { return tokens_; }

  // Offsets of sequences first_sequence .. first_sequence+count-1 of global batch `step` (0 <= first_sequence,
  // first_sequence + count <= global_batch). For Split::val, `step` counts batches within one evaluation.
  std::vector<std::int64_t> window_offsets(Split split, std::int64_t step, std::int64_t global_batch,
                                           std::int64_t first_sequence, std::int64_t count) const;

  // The offset of sequence `i` of the split's order (the rule above); window_offsets asks it for each sequence.
  std::int64_t offset_of(Split split, std::uint64_t i) const;
  // The window at `offset` as T inputs and T targets.
  void copy_window(std::int64_t offset, std::int32_t* inputs, std::int32_t* targets) const;

  // The same sequences as tokens: inputs [count, T] and targets [count, T] (row b, column t: tokens[o_b + t] and
  // tokens[o_b + t + 1]), written into caller buffers of count * T int32 each.
  void fill_batch(Split split, std::int64_t step, std::int64_t global_batch, std::int64_t first_sequence,
                  std::int64_t count, std::int32_t* inputs, std::int32_t* targets) const;

  // The training cursor: fill_train_batch draws from global batch next_step(); advance() after each optimizer
  // step (once per global batch, not per micro-batch).
  std::int64_t next_step() const { return next_step_; }
  void advance() { ++next_step_; }
  void fill_train_batch(std::int64_t global_batch, std::int64_t first_sequence, std::int64_t count,
                        std::int32_t* inputs, std::int32_t* targets) const {
    fill_batch(Split::train, next_step_, global_batch, first_sequence, count, inputs, targets);
  }

  SamplerState state() const;
  void set_state(const SamplerState& state);  // UsageError if the data or T differ from the saved run's

 private:
  std::vector<std::uint32_t> tokens_;
  std::int64_t seq_len_;
  std::int64_t val_begin_;
  std::int64_t val_windows_;
  std::uint64_t seed_;
  std::uint64_t key_;  // counter-based generator key derived from seed_
  std::int64_t next_step_ = 0;
  SampleOrder order_ = SampleOrder::shuffled;
};

// The first sequence (within its global batch) of micro-step `micro_step` on data-parallel rank `dp_rank`: the
// rank owns the contiguous block [dp_rank * G/R, (dp_rank+1) * G/R) and walks it micro_batch at a time, in
// grad_accum_steps (config/deck_rules.hpp: the deck's batch split, a DeckRuleError when it does not divide).
std::int64_t micro_batch_first_sequence(std::int64_t global_batch, std::int64_t micro_batch, int dp_size,
                                        int dp_rank, std::int64_t micro_step);

}  // namespace fsdpp
