// The vocabulary-parallel kernels (kernels/vocab_parallel.hpp) in one process: the vocabulary split over k
// simulated tensor-parallel ranks like torch.chunk, their all-reduces done here on the host (max, then sums),
// must give the losses and dlogits of the fused cross-entropy over the whole vocabulary, and the embedding's
// partial rows must sum to the whole lookup. Ignored targets (outside [0, V)) get a zero loss and gradient.
#include "mpi_test.hpp"
#include "test_helpers.hpp"

#include "fsdpp/nn/kernels/crossentropy.hpp"
#include "fsdpp/nn/kernels/encoder.hpp"
#include "fsdpp/nn/kernels/vocab_parallel.hpp"
#include "fsdpp/nn/parameter.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

using namespace fsdpp;

namespace {

using fsdpp::test::to_host;
using fsdpp::test::to_view;

std::vector<float> random_floats(std::size_t n, unsigned seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

}  // namespace

TEST_CASE("vocab parallel kernels: k ranks' cross-entropy equals the fused one over the whole vocabulary") {
  const int N = 6, V = 37;
  const float dloss = 0.25f;
  const std::vector<float> logits = random_floats(static_cast<std::size_t>(N) * V, 7, 3.0f);
  const std::vector<std::int32_t> targets = {0, 36, 18, -1, 19, 5};  // -1: ignored
  // The reference: the fused kernel over all V columns.
  View1<float> whole = to_view(logits), whole_losses("losses", N);
  const View1<std::int32_t> tgt = to_view(targets);
  kernels::crossentropy_forward_backward<float>(whole, whole_losses, tgt, N, V, dloss);
  const std::vector<float> want_losses = to_host(whole_losses), want_grad = to_host(whole);

  for (int k : {1, 2, 3, 4}) {
    CAPTURE(k);
    std::vector<View1<float>> parts, stats;
    std::vector<int> offsets;
    for (int r = 0; r < k; ++r) {
      const int v0 = static_cast<int>(std::min<std::int64_t>(r * chunk_rows(V, k), V));
      const int Vl = static_cast<int>(std::min<std::int64_t>(chunk_rows(V, k), V - v0));
      std::vector<float> mine(static_cast<std::size_t>(N) * Vl);
      for (int n = 0; n < N; ++n)
        std::copy_n(logits.begin() + n * V + v0, Vl, mine.begin() + static_cast<std::ptrdiff_t>(n) * Vl);
      parts.push_back(to_view(mine));
      stats.push_back(View1<float>("stats", 3 * N));
      offsets.push_back(v0);
    }
    auto width = [&](int r) { return static_cast<int>(parts[static_cast<std::size_t>(r)].extent(0) / N); };
    // The host's all-reduces: max of stats[0, N), then sum of stats[N, 3N).
    auto all_reduce = [&](int first, int count, bool max) {
      std::vector<float> acc(static_cast<std::size_t>(count), max ? -INFINITY : 0.0f);
      for (auto& s : stats) {
        const auto h = to_host(s);
        for (int i = 0; i < count; ++i) acc[i] = max ? std::max(acc[i], h[first + i]) : acc[i] + h[first + i];
      }
      for (auto& s : stats) {
        auto h = to_host(s);
        std::copy(acc.begin(), acc.end(), h.begin() + first);
        Kokkos::deep_copy(s, HostView1<float>(h.data(), h.size()));
      }
    };
    for (int r = 0; r < k; ++r) kernels::vocab_parallel_row_max<float>(stats[r], parts[r], N, width(r));
    all_reduce(0, N, true);
    for (int r = 0; r < k; ++r)
      kernels::vocab_parallel_sum_exp<float>(stats[r], parts[r], tgt, offsets[r], N, width(r));
    all_reduce(N, 2 * N, false);
    for (int r = 0; r < k; ++r) {
      View1<float> losses("losses", N);
      kernels::vocab_parallel_crossentropy_finish<float>(parts[r], losses, stats[r], tgt, offsets[r], N, width(r), V,
                                                         dloss, true);
      const auto got_losses = to_host(losses), got_grad = to_host(parts[r]);
      for (int n = 0; n < N; ++n) {
        CHECK(got_losses[n] == doctest::Approx(want_losses[n]).epsilon(1e-6));
        for (int v = 0; v < width(r); ++v)
          CHECK(got_grad[n * width(r) + v] == doctest::Approx(want_grad[n * V + offsets[r] + v]).epsilon(1e-5).scale(1e-6));
      }
      CHECK(got_losses[3] == 0.0f);  // the ignored row
    }
  }
}

TEST_CASE("vocab parallel kernels: the ranks' embedding rows sum to the whole lookup, positions added once") {
  const int B = 2, T = 3, C = 5, V = 11, N = B * T;
  const std::vector<float> wte = random_floats(static_cast<std::size_t>(V) * C, 3, 1.0f);
  const std::vector<float> wpe = random_floats(static_cast<std::size_t>(T) * C, 4, 1.0f);
  const std::vector<std::int32_t> tokens = {0, 10, 5, 6, 3, 9};
  View1<float> want("want", static_cast<std::size_t>(N) * C);
  const View1<std::int32_t> tok = to_view(tokens);
  kernels::encoder_forward<float>(want, tok, to_view(wte), to_view(wpe), B, T, C);
  const std::vector<float> expected = to_host(want);
  for (int k : {2, 3}) {
    CAPTURE(k);
    std::vector<float> sum(static_cast<std::size_t>(N) * C, 0.0f);
    for (int r = 0; r < k; ++r) {
      const int v0 = static_cast<int>(std::min<std::int64_t>(r * chunk_rows(V, k), V));
      const int Vl = static_cast<int>(std::min<std::int64_t>(chunk_rows(V, k), V - v0));
      const std::vector<float> rows(wte.begin() + v0 * C, wte.begin() + (v0 + Vl) * C);
      View1<std::int32_t> local("local", N);
      kernels::localize_tokens(local, tok, v0, N);
      View1<float> out("out", static_cast<std::size_t>(N) * C);
      kernels::vocab_parallel_embedding_forward<float>(out, local, to_view(rows), to_view(wpe), r == 0, B, T, C);
      const auto h = to_host(out);
      for (std::size_t i = 0; i < h.size(); ++i) sum[i] += h[i];
    }
    CHECK(sum == expected);  // bitwise: every other rank adds zeros
  }
}
