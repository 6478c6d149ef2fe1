#include "fsdpp/data/synthetic_corpus.hpp"

#include "fsdpp/data/random.hpp"
#include "fsdpp/runtime/error.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

namespace fsdpp {
namespace {

// Independent streams: changing how the table is built must not change the token stream's draws, and vice versa.
constexpr std::uint64_t kTableStream = 1, kTokenStream = 2;
constexpr int kMaxVocab = 1 << 20;  // keeps the power iteration cheap; GPT-2 is 50257

std::uint32_t uniform_below(std::mt19937_64& g, std::uint32_t n) {
  // Rejection keeps it exactly uniform (and defined bit for bit, unlike std::uniform_int_distribution).
  const std::uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  std::uint64_t x;
  do x = g(); while (x >= limit);
  return static_cast<std::uint32_t>(x % n);
}

// Index of the first cdf entry above u; the last entry is exactly 1, so there always is one.
int pick(const double* cdf, int k, double u) {
  for (int j = 0; j < k - 1; ++j)
    if (u < cdf[j]) return j;
  return k - 1;
}

}  // namespace

SyntheticCorpus::SyntheticCorpus(std::uint64_t seed, int vocab_size, int successors)
    : seed_(seed), vocab_(vocab_size), k_(successors) {
  FSDPP_REQUIRE(vocab_size >= 2 && vocab_size <= kMaxVocab,
                "synthetic corpus: vocab_size must be between 2 and {}, got {}", kMaxVocab, vocab_size);
  FSDPP_REQUIRE(successors >= 2 && successors <= vocab_size,
                "synthetic corpus: successors per token must be between 2 and vocab_size ({}), got {}", vocab_size,
                successors);
  const std::size_t V = static_cast<std::size_t>(vocab_), k = static_cast<std::size_t>(k_);
  std::mt19937_64 g(data_random::stream_key(seed, kTableStream));

  // A random cyclic order of the vocabulary (Fisher-Yates); successor 0 of each token is the next in the cycle.
  std::vector<std::uint32_t> cycle(V);
  std::iota(cycle.begin(), cycle.end(), 0u);
  for (std::size_t i = V - 1; i > 0; --i)
    std::swap(cycle[i], cycle[uniform_below(g, static_cast<std::uint32_t>(i + 1))]);
  next_.assign(V * k, 0);
  for (std::size_t i = 0; i < V; ++i) next_[cycle[i] * k] = cycle[(i + 1) % V];

  prob_.assign(V * k, 0);
  cdf_.assign(V * k, 0);
  for (std::size_t s = 0; s < V; ++s) {
    std::uint32_t* succ = &next_[s * k];
    for (std::size_t j = 1; j < k; ++j) {  // distinct successors: a repeat would silently merge two of them
      std::uint32_t t;
      do t = uniform_below(g, static_cast<std::uint32_t>(V)); while (std::find(succ, succ + j, t) != succ + j);
      succ[j] = t;
    }
    double* p = &prob_[s * k];
    double sum = 0;
    for (std::size_t j = 0; j < k; ++j) sum += p[j] = -std::log1p(-data_random::unit_double(g()));  // Exp(1)
    double run = 0;
    for (std::size_t j = 0; j < k; ++j) {
      p[j] /= sum;
      cdf_[s * k + j] = run += p[j];
    }
    cdf_[s * k + k - 1] = 1.0;
  }

  // Stationary distribution: pi <- pi (I + P) / 2 until it stops moving.
  std::vector<double> pi(V, 1.0 / static_cast<double>(V)), nxt(V);
  bool converged = false;
  for (int iter = 0; iter < 1000000 && !converged; ++iter) {
    for (std::size_t i = 0; i < V; ++i) nxt[i] = 0.5 * pi[i];
    for (std::size_t s = 0; s < V; ++s)
      for (std::size_t j = 0; j < k; ++j) nxt[next_[s * k + j]] += 0.5 * pi[s] * prob_[s * k + j];
    double norm = 0, diff = 0;
    for (double x : nxt) norm += x;
    for (std::size_t i = 0; i < V; ++i) {
      nxt[i] /= norm;  // rounding drift only; the chain conserves mass
      diff += std::fabs(nxt[i] - pi[i]);
    }
    pi.swap(nxt);
    converged = diff < 1e-13;  // near rounding level for V up to 1e6
  }
  FSDPP_CHECK(converged, "synthetic corpus (seed {}, V {}, k {}): stationary distribution did not converge", seed,
              vocab_, k_);
  stationary_ = std::move(pi);

  entropy_rate_ = 0;
  for (std::size_t s = 0; s < V; ++s) {
    double h = 0;
    for (std::size_t j = 0; j < k; ++j)
      if (const double p = prob_[s * k + j]; p > 0) h -= p * std::log(p);
    entropy_rate_ += stationary_[s] * h;
  }
}

double SyntheticCorpus::transition_prob(std::uint32_t from, std::uint32_t to) const {
  FSDPP_REQUIRE(from < static_cast<std::uint32_t>(vocab_), "synthetic corpus: token {} is outside vocab_size {}",
                from, vocab_);
  for (int j = 0; j < k_; ++j)
    if (next_[static_cast<std::size_t>(from) * k_ + j] == to) return prob_[static_cast<std::size_t>(from) * k_ + j];
  return 0.0;
}

std::vector<std::uint32_t> SyntheticCorpus::generate(std::int64_t n) const {
  FSDPP_REQUIRE(n >= 0, "synthetic corpus: token count must be non-negative, got {}", n);
  std::vector<std::uint32_t> out(static_cast<std::size_t>(n));
  if (n == 0) return out;
  std::mt19937_64 g(data_random::stream_key(seed_, kTokenStream));
  // First token from pi by inverse CDF; then one uniform draw per token.
  double u = data_random::unit_double(g()), run = 0;
  std::uint32_t cur = static_cast<std::uint32_t>(vocab_ - 1);
  for (int i = 0; i < vocab_; ++i)
    if (u < (run += stationary_[i])) {
      cur = static_cast<std::uint32_t>(i);
      break;
    }
  out[0] = cur;
  for (std::size_t t = 1; t < out.size(); ++t) {
    const std::size_t base = static_cast<std::size_t>(cur) * k_;
    cur = next_[base + pick(&cdf_[base], k_, data_random::unit_double(g()))];
    out[t] = cur;
  }
  return out;
}

}  // namespace fsdpp
