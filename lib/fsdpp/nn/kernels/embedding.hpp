#pragma once
// Token embedding alone (Llama: positions enter through RoPE in attention, there is no position table).
// The same row-order, atomic-free reduction as encoder.hpp; token ids outside [0, V) get a zero row and no
// gradient (the data loader rejects them first; this only keeps the kernel in bounds).
//
// Backward ACCUMULATES (+=) into dwte; the caller zeroes it.
//
// Portable path: team per row forward; dwte over (column, token bucket) as in encoder.hpp (bitwise the tuned
// result on every launch).
#include "fsdpp/nn/kernels/detail.hpp"
#include "fsdpp/nn/kernels/encoder.hpp"
#include "fsdpp/nn/kernels/team.hpp"
#include "fsdpp/tensor/types.hpp"

#include <cstdint>

namespace fsdpp::kernels {

namespace team {

template <class Real>
void embedding_forward(const View1<Real>& out, const View1<const std::int32_t>& tokens, const View1<const Real>& wte,
                       int N, int C) {
  const std::int64_t V = C > 0 ? static_cast<std::int64_t>(wte.extent(0)) / C : 0;
  Kokkos::parallel_for(
      "fsdpp::embedding_forward_team", row_policy<Real>(N, 0), KOKKOS_LAMBDA(const Member& team) {
        const int n = team.league_rank();
        const std::int64_t tok = tokens(n);
        Real* o = out.data() + static_cast<std::int64_t>(n) * C;
        const bool valid = tok >= 0 && tok < V;
        const Real* w = wte.data() + (valid ? tok * C : 0);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C), [&](const int c) { o[c] = valid ? w[c] : Real(0); });
      });
}

template <class Real>
void embedding_backward(const View1<Real>& dwte, const View1<const Real>& dout, const View1<const std::int32_t>& tokens,
                        int N, int C) {
  const std::int64_t V = C > 0 ? static_cast<std::int64_t>(dwte.extent(0)) / C : 0;
  Kokkos::parallel_for(
      "fsdpp::embedding_backward_buckets", Kokkos::RangePolicy<ExecSpace>(0, std::int64_t(kTokenBuckets) * C),
      KOKKOS_LAMBDA(const std::int64_t i) {
        const int k = static_cast<int>(i / C), c = static_cast<int>(i % C);
        for (int n = 0; n < N; ++n) {
          const std::int64_t tok = tokens(n);
          if (tok < 0 || tok >= V || (tok & (kTokenBuckets - 1)) != k) continue;
          dwte(tok * C + c) += dout(static_cast<std::int64_t>(n) * C + c);
        }
      });
}

}  // namespace team

// out[n,:] = wte[tokens[n],:]
template <class Real>
void embedding_forward(const View1<Real>& out,                    // out (N,C)
                       const View1<const std::int32_t>& tokens,   // tokens (N)
                       const View1<const Real>& wte,              // wte (V,C)
                       int N, int C) {
  if (portable()) return team::embedding_forward<Real>(out, tokens, wte, N, C);
  const std::int64_t V = C > 0 ? static_cast<std::int64_t>(wte.extent(0)) / C : 0;
  Kokkos::parallel_for(
      "fsdpp::embedding_forward", Kokkos::RangePolicy<ExecSpace>(0, N), KOKKOS_LAMBDA(const int n) {
        const std::int64_t tok = tokens(n);
        Real* o = out.data() + static_cast<std::int64_t>(n) * C;
        if (tok >= 0 && tok < V) {
          const Real* w = wte.data() + tok * C;
          for (int c = 0; c < C; ++c) o[c] = w[c];
        } else {
          for (int c = 0; c < C; ++c) o[c] = Real(0);
        }
      });
}

// dwte[v,:] += sum over n with tokens[n] == v of dout[n,:], in row order per column tile
template <class Real>
void embedding_backward(const View1<Real>& dwte,                   // dwte (V,C), +=
                        const View1<const Real>& dout,             // dout (N,C)
                        const View1<const std::int32_t>& tokens,   // tokens (N)
                        int N, int C) {
  if (portable()) return team::embedding_backward<Real>(dwte, dout, tokens, N, C);
  const std::int64_t V = C > 0 ? static_cast<std::int64_t>(dwte.extent(0)) / C : 0;
  Kokkos::parallel_for(
      "fsdpp::embedding_backward", Kokkos::RangePolicy<ExecSpace>(0, detail::column_tiles(C)),
      KOKKOS_LAMBDA(const int tile) {
        const int c0 = detail::tile_begin(tile), w = detail::tile_end(tile, C) - c0;
        for (int n = 0; n < N; ++n) {
          const std::int64_t tok = tokens(n);
          if (tok < 0 || tok >= V) continue;
          Real* d = dwte.data() + tok * C + c0;
          const Real* g = dout.data() + static_cast<std::int64_t>(n) * C + c0;
          for (int c = 0; c < w; ++c) d[c] += g[c];
        }
      });
}

}  // namespace fsdpp::kernels
