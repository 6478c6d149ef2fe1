#include "fsdpp/data/sampler.hpp"

#include <algorithm>

#include "fsdpp/config/deck_rules.hpp"
#include "fsdpp/data/random.hpp"
#include "fsdpp/runtime/error.hpp"

#include <cmath>
#include <limits>

namespace fsdpp {
namespace {
constexpr std::uint64_t kSamplerStream = 3;  // distinct from the synthetic corpus's streams (same run.seed)
}  // namespace

WindowSampler::WindowSampler(std::vector<std::uint32_t> tokens, std::int64_t seq_len, double val_fraction,
                             std::uint64_t seed, SampleOrder order)
    : tokens_(std::move(tokens)),
      seq_len_(seq_len),
      seed_(seed),
      key_(data_random::stream_key(seed, kSamplerStream)),
      order_(order) {
  FSDPP_REQUIRE(seq_len >= 1, "sequence length must be at least 1, got {}", seq_len);
  FSDPP_REQUIRE(val_fraction >= 0.0 && val_fraction < 1.0, "validation fraction must be in [0, 1), got {}",
                val_fraction);
  // Batches hold int32 (what the embedding kernels index with); catch a stray huge token here, once.
  for (std::size_t i = 0; i < tokens_.size(); ++i)
    FSDPP_REQUIRE(tokens_[i] <= static_cast<std::uint32_t>(std::numeric_limits<std::int32_t>::max()),
                  "token {} at position {} does not fit a signed 32-bit token id", tokens_[i], i);
  const std::int64_t n = num_tokens();
  const std::int64_t val_tokens = static_cast<std::int64_t>(std::floor(val_fraction * static_cast<double>(n)));
  val_begin_ = n - val_tokens;
  FSDPP_REQUIRE(val_begin_ >= seq_len + 1,
                "the training split has {} tokens, fewer than one window of sequence length + 1 = {}; use more data, "
                "a shorter sequence length or a smaller validation fraction",
                val_begin_, seq_len + 1);
  // Windows of T + 1 tokens with stride T: the validation inputs tile the region without overlap.
  val_windows_ = val_tokens > seq_len ? (val_tokens - 1) / seq_len : 0;
  FSDPP_REQUIRE(val_fraction == 0.0 || val_windows_ > 0,
                "the validation split has {} tokens, fewer than one window of sequence length + 1 = {}; raise the "
                "validation fraction or use more data",
                val_tokens, seq_len + 1);
}

void check_batch_request(Split split, bool has_val, std::int64_t step, std::int64_t global_batch,
                         std::int64_t first_sequence, std::int64_t count) {
  FSDPP_REQUIRE(step >= 0 && global_batch >= 1, "batch {} of size {}: step must be >= 0 and the batch >= 1", step,
                global_batch);
  FSDPP_REQUIRE(first_sequence >= 0 && count >= 0 && first_sequence + count <= global_batch,
                "sequences {}..{} are not inside a global batch of {}", first_sequence, first_sequence + count - 1,
                global_batch);
  FSDPP_REQUIRE(split == Split::train || has_val,
                "validation batches were requested but there is no validation split (validation fraction 0)");
}

std::vector<std::int64_t> WindowSampler::window_offsets(Split split, std::int64_t step, std::int64_t global_batch,
                                                        std::int64_t first_sequence, std::int64_t count) const {
  check_batch_request(split, has_val(), step, global_batch, first_sequence, count);
  std::vector<std::int64_t> offsets(static_cast<std::size_t>(count));
  const std::uint64_t first = static_cast<std::uint64_t>(step) * static_cast<std::uint64_t>(global_batch) +
                              static_cast<std::uint64_t>(first_sequence);
  for (std::int64_t b = 0; b < count; ++b) offsets[b] = offset_of(split, first + static_cast<std::uint64_t>(b));
  return offsets;
}

std::int64_t WindowSampler::offset_of(Split split, std::uint64_t i) const {
  if (split == Split::train && order_ == SampleOrder::sequential)
    return static_cast<std::int64_t>(i % static_cast<std::uint64_t>(sequential_windows())) * seq_len_;
  if (split == Split::train) {
    // Modulo bias is below n / 2^64, far under any statistical effect for offsets counted in tokens.
    const std::uint64_t h = data_random::mix64(key_ ^ data_random::mix64(i));
    return static_cast<std::int64_t>(h % static_cast<std::uint64_t>(train_offsets()));
  }
  return val_begin_ + static_cast<std::int64_t>(i % static_cast<std::uint64_t>(val_windows_)) * seq_len_;
}

void WindowSampler::copy_window(std::int64_t offset, std::int32_t* inputs, std::int32_t* targets) const {
  const std::uint32_t* w = tokens_.data() + offset;  // T + 1 tokens
  for (std::int64_t t = 0; t < seq_len_; ++t) {
    inputs[t] = static_cast<std::int32_t>(w[t]);
    targets[t] = static_cast<std::int32_t>(w[t + 1]);
  }
}

void WindowSampler::fill_batch(Split split, std::int64_t step, std::int64_t global_batch, std::int64_t first_sequence,
                               std::int64_t count, std::int32_t* inputs, std::int32_t* targets) const {
  const std::vector<std::int64_t> offsets = window_offsets(split, step, global_batch, first_sequence, count);
  for (std::size_t b = 0; b < offsets.size(); ++b)
    copy_window(offsets[b], inputs + b * seq_len_, targets + b * seq_len_);
}

std::int64_t WindowSampler::sequential_windows() const {
  // Window k covers tokens [k T, k T + T]; it must end before the validation split.
  return std::max<std::int64_t>(1, (val_begin_ - 1) / seq_len_);
}

std::int64_t WindowSampler::epoch_of(std::int64_t step, std::int64_t global_batch) const {
  return step * global_batch / sequential_windows();
}

SamplerState WindowSampler::state() const { return {seed_, next_step_, num_tokens(), seq_len_}; }

void WindowSampler::set_state(const SamplerState& state) {
  FSDPP_REQUIRE(state.num_tokens == num_tokens() && state.seq_len == seq_len_,
                "the saved data loader state is for {} tokens with sequence length {}, but this run has {} tokens "
                "with sequence length {}; resume with the same data and model.seq_len, or start a new run",
                state.num_tokens, state.seq_len, num_tokens(), seq_len_);
  FSDPP_REQUIRE(state.next_step >= 0, "the saved data loader state has a negative step {}", state.next_step);
  seed_ = state.seed;
  key_ = data_random::stream_key(state.seed, kSamplerStream);
  next_step_ = state.next_step;
}

std::int64_t micro_batch_first_sequence(std::int64_t global_batch, std::int64_t micro_batch, int dp_size,
                                        int dp_rank, std::int64_t micro_step) {
  const std::int64_t accum = grad_accum_steps(global_batch, micro_batch, dp_size);
  FSDPP_REQUIRE(dp_rank >= 0 && dp_rank < dp_size, "data-parallel rank {} is outside 0..{}", dp_rank, dp_size - 1);
  FSDPP_REQUIRE(micro_step >= 0 && micro_step < accum, "micro-step {} is outside 0..{}", micro_step, accum - 1);
  return dp_rank * (global_batch / dp_size) + micro_step * micro_batch;
}

}  // namespace fsdpp
