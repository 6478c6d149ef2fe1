#include "fsdpp/data/mixture.hpp"

#include "fsdpp/data/random.hpp"
#include "fsdpp/runtime/error.hpp"

#include <cmath>
#include <utility>

namespace fsdpp {
namespace {

using u128 = unsigned __int128;
constexpr u128 kOne = u128{1} << 64;                       // 1.0 in the 64-bit fixed point of u_i
constexpr std::uint64_t kInverseGolden = 0x9E3779B97F4A7C15ull;  // 2^64 / phi, odd
constexpr std::uint64_t kChoiceStream = 4;        // the source choice's offset (the sampler's windows use 3)
constexpr std::uint64_t kSourceSeedStream = 16;   // + k: the window seed of source k >= 1

// n (n - 1) / 2 exactly modulo 2^128 (halving the even factor first).
u128 pairs(u128 n) { return n % 2 == 0 ? (n / 2) * (n - 1) : n * ((n - 1) / 2); }

// sum_{i=0}^{n-1} floor((a i + b) / m), modulo 2^128 (AtCoder Library's floor_sum_unsigned, widened): each round
// swaps the roles of a and m as Euclid's algorithm does, so it takes O(log m) rounds. Only differences of two such
// sums are used, and those are counts below 2^64, so the wrap modulo 2^128 cancels.
u128 floor_sum(u128 n, u128 m, u128 a, u128 b) {
  u128 sum = 0;
  while (true) {
    if (a >= m) {
      sum += pairs(n) * (a / m);
      a %= m;
    }
    if (b >= m) {
      sum += n * (b / m);
      b %= m;
    }
    const u128 y_max = a * n + b;  // a < m <= 2^64 and n < 2^64: no overflow
    if (y_max < m) break;
    n = y_max / m;
    b = y_max % m;
    std::swap(m, a);
  }
  return sum;
}

std::uint64_t source_seed(std::uint64_t seed, int k) {
  // Source 0 keeps the run's seed, so that one source alone draws the single-source windows.
  return k == 0 ? seed : data_random::stream_key(seed, kSourceSeedStream + static_cast<std::uint64_t>(k));
}

}  // namespace

std::uint64_t source_path_hash(const std::string& path) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const unsigned char c : path) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

void SourceChoice::set_seed(std::uint64_t seed) { offset_ = data_random::stream_key(seed, kChoiceStream); }

SourceChoice::SourceChoice(const std::vector<double>& weights, std::uint64_t seed) {
  set_seed(seed);
  FSDPP_REQUIRE(!weights.empty(), "a data mixture needs at least one source");
  double total = 0;
  for (const double w : weights) {
    FSDPP_REQUIRE(std::isfinite(w) && w > 0, "a source's weight must be a positive number, got {}", w);
    total += w;
  }
  thresholds_.push_back(0);
  double cumulative = 0;
  for (std::size_t k = 0; k < weights.size(); ++k) {
    weights_.push_back(weights[k] / total);
    cumulative += weights[k];
    const double edge = std::ldexp(cumulative / total, 64);
    thresholds_.push_back(k + 1 == weights.size() || edge >= std::ldexp(1.0, 64) ? kOne : static_cast<u128>(edge));
  }
}

int SourceChoice::source_of(std::uint64_t i) const {
  const std::uint64_t u = i * kInverseGolden + offset_;  // modulo 2^64: frac(i / phi + offset)
  int k = 0;
  while (static_cast<u128>(u) >= thresholds_[static_cast<std::size_t>(k) + 1]) ++k;
  return k;
}

// [x mod M < c] = floor(x / M) - floor((x + M - c) / M) + 1 for x = i * G + offset, M = 2^64, 0 <= c <= M.
std::uint64_t SourceChoice::taken_below(u128 threshold, std::uint64_t n) const {
  const u128 at = floor_sum(n, kOne, kInverseGolden, offset_);
  const u128 shifted = floor_sum(n, kOne, kInverseGolden, u128{offset_} + kOne - threshold);
  return static_cast<std::uint64_t>(u128{n} + at - shifted);
}

std::uint64_t SourceChoice::chosen_before(int k, std::uint64_t n) const {
  if (sources() == 1) return n;
  const auto s = static_cast<std::size_t>(k);
  return taken_below(thresholds_[s + 1], n) - taken_below(thresholds_[s], n);
}

namespace {
std::vector<double> weights_of(const std::vector<MixtureInput>& inputs) {
  std::vector<double> w;
  for (const auto& in : inputs) w.push_back(in.weight);
  return w;
}
}  // namespace

MixtureSampler::MixtureSampler(std::vector<MixtureInput> inputs, std::int64_t seq_len, double val_fraction,
                               std::uint64_t seed, SampleOrder order)
    : choice_(weights_of(inputs), seed), seq_len_(seq_len), seed_(seed), drawn_(inputs.size(), 0) {
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    paths_.push_back(inputs[k].path);
    try {
      sources_.emplace_back(std::move(inputs[k].tokens), seq_len, val_fraction, source_seed(seed, static_cast<int>(k)),
                            order);
    } catch (const UsageError& e) {
      if (inputs.size() == 1) throw;
      throw UsageError(fmt::format("data source {} ({}): {}", k + 1, paths_.back(), e.what()));
    }
  }
}

std::int64_t MixtureSampler::num_tokens() const {
  std::int64_t n = 0;
  for (const auto& s : sources_) n += s.num_tokens();
  return n;
}

std::vector<MixtureSampler::Window> MixtureSampler::windows(Split split, std::int64_t step, std::int64_t global_batch,
                                                            std::int64_t first_sequence, std::int64_t count) const {
  check_batch_request(split, has_val(), step, global_batch, first_sequence, count);
  const std::uint64_t first = static_cast<std::uint64_t>(step) * static_cast<std::uint64_t>(global_batch) +
                              static_cast<std::uint64_t>(first_sequence);
  // Each source's place in its own order at the first sequence (closed form), then counted on.
  std::vector<std::uint64_t> next_in_source(sources_.size());
  for (int k = 0; k < sources(); ++k) next_in_source[static_cast<std::size_t>(k)] = choice_.chosen_before(k, first);
  std::vector<Window> out(static_cast<std::size_t>(count));
  for (std::int64_t b = 0; b < count; ++b) {
    const int k = choice_.source_of(first + static_cast<std::uint64_t>(b));
    const std::uint64_t j = next_in_source[static_cast<std::size_t>(k)]++;
    out[static_cast<std::size_t>(b)] = {k, source(k).offset_of(split, j)};
  }
  return out;
}

void MixtureSampler::fill_batch(Split split, std::int64_t step, std::int64_t global_batch,
                                std::int64_t first_sequence, std::int64_t count, std::int32_t* inputs,
                                std::int32_t* targets) const {
  const std::vector<Window> w = windows(split, step, global_batch, first_sequence, count);
  for (std::size_t b = 0; b < w.size(); ++b)
    source(w[b].source).copy_window(w[b].offset, inputs + b * seq_len_, targets + b * seq_len_);
}

void MixtureSampler::advance(std::int64_t global_batch) {
  const auto begin = static_cast<std::uint64_t>(next_step_ * global_batch);
  const auto end = begin + static_cast<std::uint64_t>(global_batch);
  for (int k = 0; k < sources(); ++k)
    drawn_[static_cast<std::size_t>(k)] +=
        static_cast<std::int64_t>(choice_.chosen_before(k, end) - choice_.chosen_before(k, begin));
  ++next_step_;
}

std::int64_t MixtureSampler::epoch_of(int k, std::int64_t step, std::int64_t global_batch) const {
  const std::uint64_t before = choice_.chosen_before(k, static_cast<std::uint64_t>(step * global_batch));
  return static_cast<std::int64_t>(before / static_cast<std::uint64_t>(source(k).sequential_windows()));
}

MixtureState MixtureSampler::state() const {
  MixtureState s{seed_, next_step_, seq_len_, {}};
  for (int k = 0; k < sources(); ++k)
    s.sources.push_back(
        {source_path_hash(path(k)), source(k).num_tokens(), weight(k), drawn_[static_cast<std::size_t>(k)]});
  return s;
}

void MixtureSampler::set_state(const MixtureState& state) {
  FSDPP_REQUIRE(state.sources.size() == sources_.size(),
                "the checkpoint was trained on {} data source(s), but this deck gives {}; resume with the same "
                "data.sources, or start a new run", state.sources.size(), sources_.size());
  FSDPP_REQUIRE(state.seq_len == seq_len_, "the saved data loader state is for sequence length {}, but this run has "
                "{}; resume with the same model.context_length, or start a new run", state.seq_len, seq_len_);
  for (int k = 0; k < sources(); ++k) {
    const SourceRecord& saved = state.sources[static_cast<std::size_t>(k)];
    FSDPP_REQUIRE(saved.path_hash == source_path_hash(path(k)),
                  "data source {} ({}) is not the checkpoint's source {}: its path differs from the one trained on; "
                  "resume with the same data.sources in the same order, or start a new run", k + 1, path(k), k + 1);
    FSDPP_REQUIRE(saved.num_tokens == source(k).num_tokens() && saved.weight == weight(k),
                  "data source {} ({}) has {} tokens and weight {:.6g}, but the checkpoint trained on it with {} "
                  "tokens and weight {:.6g}; resume with the same data and weights, or start a new run", k + 1,
                  path(k), source(k).num_tokens(), weight(k), saved.num_tokens, saved.weight);
    FSDPP_REQUIRE(saved.sequences >= 0, "data source {} ({}): the checkpoint's count of sequences drawn is negative",
                  k + 1, path(k));
  }
  FSDPP_REQUIRE(state.next_step >= 0, "the saved data loader state has a negative step {}", state.next_step);
  seed_ = state.seed;
  next_step_ = state.next_step;
  choice_.set_seed(seed_);
  for (int k = 0; k < sources(); ++k) {
    auto& s = sources_[static_cast<std::size_t>(k)];
    s.set_state({source_seed(seed_, k), 0, s.num_tokens(), seq_len_});
    drawn_[static_cast<std::size_t>(k)] = state.sources[static_cast<std::size_t>(k)].sequences;
  }
}

}  // namespace fsdpp
