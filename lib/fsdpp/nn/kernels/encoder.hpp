#pragma once
// GPT-2 input embedding: token embedding plus learned position embedding (llm.c's encoder_forward/backward).
//
// Backward ACCUMULATES (+=) into dwte and dwpe; the caller zeroes them.
//
// Determinism without atomics: a token may repeat anywhere in the batch, so rows of dwte receive sums of many
// rows of dout. dwte is reduced column tile by column tile (detail.hpp), each work item walking all N rows in
// order, so every element of dwte is summed in row order whatever the backend or tile width. dwpe is reduced per
// (position, column tile), looping over the batch in order. Both are O(N*C), like the forward.
//
// Token ids outside [0, V), V = wte.extent(0) / C, are skipped: the forward adds no token embedding for them
// and backward gives them no gradient. The data loader rejects such tokens with a clear error; this guard only
// keeps a kernel from reading or writing out of bounds.
//
// The template parameter is named Real, not T, because T is the sequence length here.
//
// Portable path (team.hpp): the forward is one team per row, threads over the columns. dwte is parallel over
// (column, token bucket): work item (c, k) walks all N rows in order and adds the rows whose token is in bucket
// k (token & (kTokenBuckets - 1)), so each element of dwte still gets its rows in row order: bitwise the tuned result,
// on every launch, with kTokenBuckets times the parallelism. The price is that every work item scans all N
// tokens: on one CPU core that is ~50x the tuned kernel (tests/bench/run gpu_kernels); a GPU runs the
// C * kTokenBuckets scans side by side, the tokens coming from cache. A stable sort of the rows by token would
// remove the scans. dwpe is parallel over (position, column), summing the batch in order: bitwise the tuned
// result too.
#include "fsdpp/nn/kernels/detail.hpp"
#include "fsdpp/nn/kernels/team.hpp"
#include "fsdpp/tensor/types.hpp"

#include <cstdint>

namespace fsdpp::kernels {

namespace team {

// Token buckets of the portable dwte/embedding reduction: the parallelism is C * kTokenBuckets work items.
inline constexpr int kTokenBuckets = 64;  // a power of two: the bucket is tok & (kTokenBuckets - 1)

template <class Real>
void encoder_forward(const View1<Real>& out, const View1<const std::int32_t>& tokens, const View1<const Real>& wte,
                     const View1<const Real>& wpe, int B, int T, int C, const std::int32_t* positions) {
  const std::int64_t V = C > 0 ? static_cast<std::int64_t>(wte.extent(0)) / C : 0;
  Kokkos::parallel_for(
      "fsdpp::encoder_forward_team", row_policy<Real>(std::int64_t(B) * T, 0), KOKKOS_LAMBDA(const Member& team) {
        const int n = team.league_rank();
        const std::int64_t tok = tokens(n);
        Real* o = out.data() + static_cast<std::int64_t>(n) * C;
        const Real* p = wpe.data() + static_cast<std::int64_t>(positions ? positions[n] : n % T) * C;
        if (tok >= 0 && tok < V) {
          const Real* w = wte.data() + tok * C;
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C), [&](const int c) { o[c] = w[c] + p[c]; });
        } else {
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C), [&](const int c) { o[c] = p[c]; });
        }
      });
}

template <class Real>
void encoder_backward(const View1<Real>& dwte, const View1<Real>& dwpe, const View1<const Real>& dout,
                      const View1<const std::int32_t>& tokens, int B, int T, int C, const std::int32_t* positions) {
  const int N = B * T;
  const std::int64_t V = C > 0 ? static_cast<std::int64_t>(dwte.extent(0)) / C : 0;
  Kokkos::parallel_for(
      "fsdpp::encoder_backward_dwte_buckets", Kokkos::RangePolicy<ExecSpace>(0, std::int64_t(kTokenBuckets) * C),
      KOKKOS_LAMBDA(const std::int64_t i) {
        const int k = static_cast<int>(i / C), c = static_cast<int>(i % C);
        for (int n = 0; n < N; ++n) {
          const std::int64_t tok = tokens(n);
          if (tok < 0 || tok >= V || (tok & (kTokenBuckets - 1)) != k) continue;
          dwte(tok * C + c) += dout(static_cast<std::int64_t>(n) * C + c);
        }
      });
  Kokkos::parallel_for(
      "fsdpp::encoder_backward_dwpe_columns", Kokkos::RangePolicy<ExecSpace>(0, std::int64_t(T) * C),
      KOKKOS_LAMBDA(const std::int64_t i) {
        Real acc = Real(0);
        for (int b = 0; b < B; ++b) acc += dout(static_cast<std::int64_t>(b) * T * C + i);
        const std::int64_t t = i / C;  // row t of every sequence sits at position t, or positions[t]
        dwpe((positions ? positions[t] : t) * C + i % C) += acc;
      });
}

}  // namespace team

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:] (wpe[positions[b*T+t],:] when positions are given: context
// parallelism's rows at their global positions; every sequence's row t at the same one)
template <class Real>
void encoder_forward(const View1<Real>& out,                        // out (B,T,C)
                     const View1<const std::int32_t>& tokens,    // tokens (B,T)
                     const View1<const Real>& wte,                  // wte (V,C)
                     const View1<const Real>& wpe,                  // wpe (maxT,C), maxT >= T
                     int B, int T, int C, const std::int32_t* positions = nullptr) {
  if (portable()) return team::encoder_forward<Real>(out, tokens, wte, wpe, B, T, C, positions);
  const int N = B * T;
  const std::int64_t V = C > 0 ? static_cast<std::int64_t>(wte.extent(0)) / C : 0;
  Kokkos::parallel_for(
      "fsdpp::encoder_forward", Kokkos::RangePolicy<ExecSpace>(0, N), KOKKOS_LAMBDA(const int n) {
        const std::int64_t tok = tokens(n);
        const bool valid = tok >= 0 && tok < V;
        Real* o = out.data() + static_cast<std::int64_t>(n) * C;
        const Real* p = wpe.data() + static_cast<std::int64_t>(positions ? positions[n] : n % T) * C;
        if (valid) {
          const Real* w = wte.data() + tok * C;
          for (int c = 0; c < C; ++c) o[c] = w[c] + p[c];
        } else {
          for (int c = 0; c < C; ++c) o[c] = p[c];
        }
      });
}

// dwte[v,:] += sum over (b,t) with tokens[b,t] == v of dout[b,t,:];  dwpe[t,:] (or dwpe[positions[t],:]) += sum over
// b of dout[b,t,:]
template <class Real>
void encoder_backward(const View1<Real>& dwte,                      // dwte (V,C), +=
                      const View1<Real>& dwpe,                      // dwpe (maxT,C), +=
                      const View1<const Real>& dout,                // dout (B,T,C)
                      const View1<const std::int32_t>& tokens,   // tokens (B,T)
                      int B, int T, int C, const std::int32_t* positions = nullptr) {
  if (portable()) return team::encoder_backward<Real>(dwte, dwpe, dout, tokens, B, T, C, positions);
  using detail::kColumnTile;
  const int N = B * T;
  const int tiles = detail::column_tiles(C);
  const std::int64_t V = C > 0 ? static_cast<std::int64_t>(dwte.extent(0)) / C : 0;

  // Each tile's loop over rows is a scatter into dwte: rows of the same token hit the same tile in row order.
  Kokkos::parallel_for(
      "fsdpp::encoder_backward_dwte", Kokkos::RangePolicy<ExecSpace>(0, tiles), KOKKOS_LAMBDA(const int tile) {
        const int c0 = detail::tile_begin(tile), w = detail::tile_end(tile, C) - c0;
        for (int n = 0; n < N; ++n) {
          const std::int64_t tok = tokens(n);
          if (tok < 0 || tok >= V) continue;
          Real* d = dwte.data() + tok * C + c0;
          const Real* g = dout.data() + static_cast<std::int64_t>(n) * C + c0;
          for (int c = 0; c < w; ++c) d[c] += g[c];
        }
      });

  Kokkos::parallel_for(
      "fsdpp::encoder_backward_dwpe", Kokkos::RangePolicy<ExecSpace>(0, T * tiles), KOKKOS_LAMBDA(const int i) {
        const int t = i / tiles, tile = i % tiles;
        const int c0 = detail::tile_begin(tile), w = detail::tile_end(tile, C) - c0;
        Real acc[kColumnTile];
        for (int c = 0; c < w; ++c) acc[c] = Real(0);
        for (int b = 0; b < B; ++b) {
          const Real* g = dout.data() + (static_cast<std::int64_t>(b) * T + t) * C + c0;
          for (int c = 0; c < w; ++c) acc[c] += g[c];
        }
        Real* d = dwpe.data() + static_cast<std::int64_t>(positions ? positions[t] : t) * C + c0;
        for (int c = 0; c < w; ++c) d[c] += acc[c];
      });
}

}  // namespace fsdpp::kernels
