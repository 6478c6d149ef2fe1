#include "fsdpp/infer/sampling.hpp"

#include "fsdpp/data/random.hpp"
#include "fsdpp/runtime/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace fsdpp {

void Sampling::validate() const {
  FSDPP_REQUIRE(std::isfinite(temperature) && temperature >= 0.0, "--temperature is {}; it must be >= 0 (0: greedy)",
                temperature);
  FSDPP_REQUIRE(top_k >= 0, "--top-k is {}; it must be >= 0 (0: off)", top_k);
  FSDPP_REQUIRE(top_p > 0.0 && top_p <= 1.0, "--top-p is {}; it must be in (0, 1] (1: off)", top_p);
}

std::string Sampling::describe() const {
  if (greedy()) return "greedy";
  std::string s = fmt::format("temperature {}", temperature);
  if (top_k > 0) s += fmt::format(", top-k {}", top_k);
  if (top_p < 1.0) s += fmt::format(", top-p {}", top_p);
  return s + fmt::format(", seed {}", seed);
}

int sample_token(const float* logits, int V, const Sampling& sampling, std::int64_t sequence, std::int64_t step) {
  if (sampling.greedy()) return static_cast<int>(std::max_element(logits, logits + V) - logits);
  // Candidates by descending logit (a stable order: equal logits keep their ids' order).
  std::vector<int> order(static_cast<std::size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  std::size_t kept = order.size();
  if (sampling.top_k > 0 && static_cast<std::size_t>(sampling.top_k) < kept) {
    const float boundary = logits[order[static_cast<std::size_t>(sampling.top_k) - 1]];
    kept = static_cast<std::size_t>(sampling.top_k);
    while (kept < order.size() && logits[order[kept]] == boundary) ++kept;  // ties at the boundary stay
  }
  // Softmax of logits / temperature over the kept candidates, in double.
  std::vector<double> p(kept);
  const double top = logits[order[0]] / sampling.temperature;
  double total = 0.0;
  for (std::size_t i = 0; i < kept; ++i) total += (p[i] = std::exp(logits[order[i]] / sampling.temperature - top));
  for (double& x : p) x /= total;
  if (sampling.top_p < 1.0) {
    double cumulative = 0.0;
    std::size_t nucleus = 0;
    while (nucleus < kept && (nucleus == 0 || cumulative < sampling.top_p)) cumulative += p[nucleus++];
    kept = nucleus;
    for (std::size_t i = 0; i < kept; ++i) p[i] /= cumulative;
  }
  const std::uint64_t key = data_random::stream_key(sampling.seed, static_cast<std::uint64_t>(sequence));
  const double u = data_random::unit_double(data_random::mix64(key ^ data_random::mix64(static_cast<std::uint64_t>(step))));
  double cumulative = 0.0;
  for (std::size_t i = 0; i < kept; ++i) {
    cumulative += p[i];
    if (u < cumulative) return order[i];
  }
  return order[kept - 1];  // u within rounding of 1
}

}  // namespace fsdpp
