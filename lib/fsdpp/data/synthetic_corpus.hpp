#pragma once
// The built-in synthetic corpus: the data the embedded default deck trains on, so the main job needs no files.
//
// A first-order Markov chain over the vocabulary {0..V-1}. Each token has `successors` (k) distinct possible next
// tokens with fixed probabilities drawn from the seed (a flat Dirichlet: normalised Exp(1) draws). Because the
// source is known exactly, so is the best achievable loss: the entropy rate
//     H = sum_i pi_i * H(P_i.)   nats/token,
// pi the stationary distribution (power iteration on the lazy chain (I + P) / 2, which has the same pi and
// converges even where P is periodic), P_i. the next-token distribution after token i. The trainer reports H as
// the loss floor; E[H] = (1 + 1/2 + ... + 1/k) - 1 for a flat Dirichlet, ~1.08 nats for k = 4, far below ln V
// (4.2 for V = 64, 8.3 for V = 4096), so a small model shows a large, quick fall in loss.
//
// Learnable by construction: one token of context determines the best prediction, so a model only has to learn
// a V x k table. Irreducible by construction: successor 0 of every token follows one random cyclic permutation
// of the vocabulary, so every token occurs and the stationary distribution is unique.
//
// Deterministic by seed on any platform (std::mt19937_64 and hand-written conversions, no std distributions).
#include <cstdint>
#include <vector>

namespace fsdpp {

class SyntheticCorpus {
 public:
  SyntheticCorpus(std::uint64_t seed, int vocab_size, int successors = 4);  // 2 <= successors <= vocab_size

  std::uint64_t seed() const { return seed_; }
  int vocab_size() const { return vocab_; }
  int successors() const { return k_; }
  double entropy_rate_nats() const { return entropy_rate_; }
  const std::vector<double>& stationary() const { return stationary_; }  // [V], sums to 1

  // P(next = to | current = from); 0 when `to` is not one of from's successors.
  double transition_prob(std::uint32_t from, std::uint32_t to) const;

  // The first n tokens of the corpus stream. The stream starts from the stationary distribution (so every
  // prefix is already "in equilibrium") and is prefix-stable: generate(n) is a prefix of generate(n + m).
  std::vector<std::uint32_t> generate(std::int64_t n) const;

 private:
  std::uint64_t seed_;
  int vocab_, k_;
  std::vector<std::uint32_t> next_;  // [V, k] successor tokens
  std::vector<double> prob_;         // [V, k] their probabilities
  std::vector<double> cdf_;          // [V, k] running sums, last = 1 exactly
  std::vector<double> stationary_;   // [V]
  double entropy_rate_ = 0;
};

}  // namespace fsdpp
