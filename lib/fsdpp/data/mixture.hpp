#pragma once
// MixtureSampler: training and validation sequences from several token streams (data.sources), each sequence of
// the global order taking one source, in the proportions of the sources' weights.
//
// Which source. Sequence i of a split's global order takes the source whose slice of [0, 1) holds
//   u_i = frac(i / phi + offset)     (phi the golden ratio; offset a hash of the seed),
// the slices laid out in source order with widths equal to the normalised weights. The u_i are Weyl's
// low-discrepancy sequence: in every prefix of n sequences, source k's count stays within O(log n) of w_k n (not
// the O(sqrt n) of independent draws). The arithmetic is 64-bit fixed point (u_i = i * 2^64/phi + offset mod 2^64
// against thresholds cum_k * 2^64), the same bits on every machine.
//
// Which window. Among the sequences that take source k, sequence i is number j = (sequences before i that took k)
// of that source's own order, and the source's WindowSampler (data/sampler.hpp) places it: shuffled, a hashed
// offset; sequential, the source's j-th window of stride T, wrapping at its end. j has a closed form (a floor sum
// over the Weyl sequence, a Euclid-like recursion of at most ~90 rounds on 2^64), so a rank still jumps straight to
// its sequences, in either order, on any number of ranks, and a resume needs only the step.
//
// Validation. Each source keeps its own validation split (the same fraction of each); validation sequence i takes
// its source by the same rule and the j-th of that source's validation windows.
//
// One source (data.source) is the one-entry mixture: every sequence takes it and j = i, which is the
// WindowSampler's order exactly, bit for bit.
#include "fsdpp/data/sampler.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace fsdpp {

// The source each sequence takes (the rule above).
class SourceChoice {
 public:
  // weights > 0 (normalised here); seed: the run's.
  SourceChoice(const std::vector<double>& weights, std::uint64_t seed);
  void set_seed(std::uint64_t seed);  // a resumed run's
  int sources() const { return static_cast<int>(weights_.size()); }
  double weight(int k) const { return weights_[static_cast<std::size_t>(k)]; }  // normalised
  int source_of(std::uint64_t i) const;
  // How many of sequences 0 .. n-1 take source k: the closed form, at most ~90 rounds whatever n.
  std::uint64_t chosen_before(int k, std::uint64_t n) const;

 private:
  std::uint64_t taken_below(unsigned __int128 threshold, std::uint64_t n) const;  // #{i < n : u_i < threshold}
  std::vector<double> weights_;
  std::vector<unsigned __int128> thresholds_;  // sources() + 1 of them, from 0 to 2^64
  std::uint64_t offset_ = 0;
};

struct MixtureInput {
  std::string path;  // as the deck gives it: the source's name in messages and its identity in checkpoints
  std::vector<std::uint32_t> tokens;
  double weight = 1.0;
};

// What a checkpoint keeps of one source: its identity (checked on resume) and the training sequences it gave.
struct SourceRecord {
  std::uint64_t path_hash = 0;
  std::int64_t num_tokens = 0;
  double weight = 0;              // normalised
  std::int64_t sequences = 0;     // training sequences drawn from it over the whole run so far
};

struct MixtureState {
  std::uint64_t seed = 0;
  std::int64_t next_step = 0;
  std::int64_t seq_len = 0;
  std::vector<SourceRecord> sources;
};

// FNV-1a of the path's bytes: a source's name in a checkpoint (whose state holds numbers only).
std::uint64_t source_path_hash(const std::string& path);

class MixtureSampler {
 public:
  // UsageError naming the source when one is too short for a window in either split.
  MixtureSampler(std::vector<MixtureInput> inputs, std::int64_t seq_len, double val_fraction, std::uint64_t seed,
                 SampleOrder order);
  int sources() const { return static_cast<int>(sources_.size()); }
  const WindowSampler& source(int k) const { return sources_[static_cast<std::size_t>(k)]; }
  const std::string& path(int k) const { return paths_[static_cast<std::size_t>(k)]; }
  double weight(int k) const { return choice_.weight(k); }
  const SourceChoice& choice() const { return choice_; }
  std::int64_t seq_len() const { return seq_len_; }
  std::int64_t num_tokens() const;  // all sources together
  bool has_val() const { return sources_.front().has_val(); }  // every source has a split or none has
  SampleOrder order() const { return sources_.front().order(); }

  struct Window {
    int source;
    std::int64_t offset;  // in that source's tokens
  };
  // Sequences first_sequence .. first_sequence+count-1 of global batch `step` (as WindowSampler::window_offsets).
  std::vector<Window> windows(Split split, std::int64_t step, std::int64_t global_batch,
                              std::int64_t first_sequence, std::int64_t count) const;
  void fill_batch(Split split, std::int64_t step, std::int64_t global_batch, std::int64_t first_sequence,
                  std::int64_t count, std::int32_t* inputs, std::int32_t* targets) const;

  std::int64_t next_step() const { return next_step_; }
  // After each optimizer step: the cursor moves on, and each source's count of sequences drawn grows by its share
  // of the global batch.
  void advance(std::int64_t global_batch);
  void fill_train_batch(std::int64_t global_batch, std::int64_t first_sequence, std::int64_t count,
                        std::int32_t* inputs, std::int32_t* targets) const {
    fill_batch(Split::train, next_step_, global_batch, first_sequence, count, inputs, targets);
  }
  // Training sequences each source gave over the whole run (a resumed run's included).
  const std::vector<std::int64_t>& sequences_drawn() const { return drawn_; }
  // Sequential order: the pass over source k's training windows that global batch `step` falls in.
  std::int64_t epoch_of(int k, std::int64_t step, std::int64_t global_batch) const;

  MixtureState state() const;
  // UsageError naming the source when the saved run had other sources, weights or T.
  void set_state(const MixtureState& state);

 private:
  std::vector<WindowSampler> sources_;
  std::vector<std::string> paths_;
  SourceChoice choice_;
  std::int64_t seq_len_;
  std::uint64_t seed_;
  std::int64_t next_step_ = 0;
  std::vector<std::int64_t> drawn_;
};

}  // namespace fsdpp
