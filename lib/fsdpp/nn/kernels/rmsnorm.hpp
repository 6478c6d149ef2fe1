#pragma once
// RMSNorm over the last dimension, as Llama's LlamaRMSNorm: out = x / sqrt(mean(x^2) + eps) * weight, no mean
// subtraction and no bias; eps comes from the deck (model.norm_eps). Forward saves each row's 1/rms for backward.
//
// Backward ACCUMULATES (+=) into dinp and dweight; the caller zeroes them (or, for dinp, pre-loads the residual
// gradient, as with layernorm_backward). dweight is a reduction over rows done per column tile in row order
// (detail.hpp): no atomics, bitwise reproducible.
//
// Portable path (team.hpp): one team per row with team_sum, dweight through team::column_sum; both bitwise the
// same on every launch.
#include "fsdpp/nn/kernels/detail.hpp"
#include "fsdpp/nn/kernels/team.hpp"
#include "fsdpp/tensor/types.hpp"

#include <cstdint>

namespace fsdpp::kernels {

namespace team {

template <class T>
void rmsnorm_forward(const View1<T>& out, const View1<T>& rstd, const View1<const T>& inp,
                     const View1<const T>& weight, int N, int C, double eps) {
  const T inv_c = T(1) / T(C);
  const T e = T(eps);
  Kokkos::parallel_for(
      "fsdpp::rmsnorm_forward_team", row_policy<T>(N), KOKKOS_LAMBDA(const Member& team) {
        const int n = team.league_rank();
        const Scratch<T> s(team.team_scratch(0), kSlots);
        const T* x = inp.data() + static_cast<std::int64_t>(n) * C;
        T* o = out.data() + static_cast<std::int64_t>(n) * C;
        const T* w = weight.data();
        const T ms = team_sum<T>(team, s, C, [&](int c) { return x[c] * x[c]; }) * inv_c;
        const T r = T(1) / kmath::sqrt(ms + e);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C), [&](const int c) { o[c] = x[c] * r * w[c]; });
        Kokkos::single(Kokkos::PerTeam(team), [&]() { rstd(n) = r; });
      });
}

template <class T>
void rmsnorm_backward(const View1<T>& dinp, const View1<T>& dweight, const View1<const T>& dout,
                      const View1<const T>& inp, const View1<const T>& weight, const View1<const T>& rstd, int N,
                      int C) {
  const T inv_c = T(1) / T(C);
  Kokkos::parallel_for(
      "fsdpp::rmsnorm_backward_dinp_team", row_policy<T>(N), KOKKOS_LAMBDA(const Member& team) {
        const int n = team.league_rank();
        const Scratch<T> s(team.team_scratch(0), kSlots);
        const std::int64_t row = static_cast<std::int64_t>(n) * C;
        const T* x = inp.data() + row;
        const T* g = dout.data() + row;
        const T* w = weight.data();
        T* d = dinp.data() + row;
        const T r = rstd(n);
        const T gx_mean = team_sum<T>(team, s, C, [&](int c) { return w[c] * g[c] * (x[c] * r); }) * inv_c;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C),
                             [&](const int c) { d[c] += r * (w[c] * g[c] - x[c] * r * gx_mean); });
      });
  const T* x = inp.data();
  const T* g = dout.data();
  column_sum<T>(dweight, N, C, KOKKOS_LAMBDA(int n, int c) {
    const std::int64_t at = static_cast<std::int64_t>(n) * C + c;
    return g[at] * (x[at] * rstd(n));
  });
}

}  // namespace team

// out[n,:] = inp[n,:] * rstd[n] * weight,  rstd[n] = 1 / sqrt(mean_c(inp[n,c]^2) + eps)
template <class T>
void rmsnorm_forward(const View1<T>& out,           // out (N,C)
                     const View1<T>& rstd,          // rstd (N)
                     const View1<const T>& inp,     // inp (N,C)
                     const View1<const T>& weight,  // weight (C)
                     int N, int C, double eps) {
  if (portable()) return team::rmsnorm_forward<T>(out, rstd, inp, weight, N, C, eps);
  const T inv_c = T(1) / T(C);
  const T e = T(eps);
  Kokkos::parallel_for(
      "fsdpp::rmsnorm_forward", Kokkos::RangePolicy<ExecSpace>(0, N), KOKKOS_LAMBDA(const int n) {
        const T* x = inp.data() + static_cast<std::int64_t>(n) * C;
        T* o = out.data() + static_cast<std::int64_t>(n) * C;
        const T* w = weight.data();
        const T ms = detail::lane_sum<T>(C, [=](int c) { return x[c] * x[c]; }) * inv_c;
        const T s = T(1) / kmath::sqrt(ms + e);
        for (int c = 0; c < C; ++c) o[c] = x[c] * s * w[c];
        rstd(n) = s;
      });
}

// With xhat = inp * rstd and g = weight * dout:
//   dinp += rstd * (g - xhat * mean_c(g * xhat)),  dweight += sum_n dout * xhat
template <class T>
void rmsnorm_backward(const View1<T>& dinp,           // dinp (N,C), +=
                      const View1<T>& dweight,        // dweight (C), +=
                      const View1<const T>& dout,     // dout (N,C)
                      const View1<const T>& inp,      // inp (N,C)
                      const View1<const T>& weight,   // weight (C)
                      const View1<const T>& rstd,     // rstd (N)
                      int N, int C) {
  if (portable()) return team::rmsnorm_backward<T>(dinp, dweight, dout, inp, weight, rstd, N, C);
  using detail::kColumnTile;
  const T inv_c = T(1) / T(C);
  Kokkos::parallel_for(
      "fsdpp::rmsnorm_backward_dinp", Kokkos::RangePolicy<ExecSpace>(0, N), KOKKOS_LAMBDA(const int n) {
        const std::int64_t row = static_cast<std::int64_t>(n) * C;
        const T* x = inp.data() + row;
        const T* g = dout.data() + row;
        const T* w = weight.data();
        T* d = dinp.data() + row;
        const T s = rstd(n);
        const T gx_mean = detail::lane_sum<T>(C, [=](int c) { return w[c] * g[c] * (x[c] * s); }) * inv_c;
        for (int c = 0; c < C; ++c) d[c] += s * (w[c] * g[c] - x[c] * s * gx_mean);
      });

  Kokkos::parallel_for(
      "fsdpp::rmsnorm_backward_dweight", Kokkos::RangePolicy<ExecSpace>(0, detail::column_tiles(C)),
      KOKKOS_LAMBDA(const int tile) {
        const int c0 = detail::tile_begin(tile), w = detail::tile_end(tile, C) - c0;
        T dw[kColumnTile];
        for (int c = 0; c < w; ++c) dw[c] = T(0);
        for (int n = 0; n < N; ++n) {
          const std::int64_t at = static_cast<std::int64_t>(n) * C + c0;
          const T* x = inp.data() + at;
          const T* g = dout.data() + at;
          const T s = rstd(n);
          for (int c = 0; c < w; ++c) dw[c] += g[c] * (x[c] * s);
        }
        for (int c = 0; c < w; ++c) dweight(c0 + c) += dw[c];
      });
}

}  // namespace fsdpp::kernels
