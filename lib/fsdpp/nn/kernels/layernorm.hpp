#pragma once
// LayerNorm over the last dimension, as PyTorch's nn.LayerNorm: biased variance, eps = 1e-5 inside the sqrt.
// Forward saves each row's mean and 1/std for backward (llm.c's layernorm_forward/backward).
//
// Backward ACCUMULATES (+=) into dinp, dweight and dbias; the caller zeroes them (or, for dinp, pre-loads the
// residual gradient, which is how the residual stream's two paths are summed).
//
// dinp is parallel over rows. dweight and dbias are reductions over the N rows: parallel over column tiles,
// looping over rows in order (detail.hpp), so no atomics and bitwise reproducible results.
//
// Portable path (team.hpp): one team per row, team_sum for the mean, variance and the two backward means
// (bitwise the same on every launch); dweight and dbias through team::column_sum (idem).
#include "fsdpp/nn/kernels/detail.hpp"
#include "fsdpp/nn/kernels/team.hpp"
#include "fsdpp/tensor/types.hpp"

#include <cstdint>

namespace fsdpp::kernels {

inline constexpr double kLayerNormEps = 1e-5;

namespace team {

template <class T>
void layernorm_forward(const View1<T>& out, const View1<T>& mean, const View1<T>& rstd, const View1<const T>& inp,
                       const View1<const T>& weight, const View1<const T>& bias, int N, int C) {
  const T inv_c = T(1) / T(C);
  const T eps = T(kLayerNormEps);
  Kokkos::parallel_for(
      "fsdpp::layernorm_forward_team", row_policy<T>(N), KOKKOS_LAMBDA(const Member& team) {
        const int n = team.league_rank();
        const Scratch<T> s(team.team_scratch(0), kSlots);
        const T* x = inp.data() + static_cast<std::int64_t>(n) * C;
        T* o = out.data() + static_cast<std::int64_t>(n) * C;
        const T* w = weight.data();
        const T* b = bias.data();
        const T m = team_sum<T>(team, s, C, [&](int c) { return x[c]; }) * inv_c;
        const T var = team_sum<T>(team, s, C, [&](int c) { return (x[c] - m) * (x[c] - m); }) * inv_c;
        const T r = T(1) / kmath::sqrt(var + eps);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C), [&](const int c) { o[c] = (x[c] - m) * r * w[c] + b[c]; });
        Kokkos::single(Kokkos::PerTeam(team), [&]() {
          mean(n) = m;
          rstd(n) = r;
        });
      });
}

template <class T>
void layernorm_backward(const View1<T>& dinp, const View1<T>& dweight, const View1<T>& dbias,
                        const View1<const T>& dout, const View1<const T>& inp, const View1<const T>& weight,
                        const View1<const T>& mean, const View1<const T>& rstd, int N, int C) {
  const T inv_c = T(1) / T(C);
  Kokkos::parallel_for(
      "fsdpp::layernorm_backward_dinp_team", row_policy<T>(N), KOKKOS_LAMBDA(const Member& team) {
        const int n = team.league_rank();
        const Scratch<T> s(team.team_scratch(0), kSlots);
        const std::int64_t row = static_cast<std::int64_t>(n) * C;
        const T* x = inp.data() + row;
        const T* g = dout.data() + row;
        const T* w = weight.data();
        T* d = dinp.data() + row;
        const T m = mean(n), r = rstd(n);
        const T g_mean = team_sum<T>(team, s, C, [&](int c) { return w[c] * g[c]; }) * inv_c;
        const T gx_mean = team_sum<T>(team, s, C, [&](int c) { return w[c] * g[c] * ((x[c] - m) * r); }) * inv_c;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C), [&](const int c) {
          d[c] += r * (w[c] * g[c] - g_mean - (x[c] - m) * r * gx_mean);
        });
      });
  const T* x = inp.data();
  const T* g = dout.data();
  column_sum<T>(dweight, N, C, KOKKOS_LAMBDA(int n, int c) {
    const std::int64_t at = static_cast<std::int64_t>(n) * C + c;
    return g[at] * ((x[at] - mean(n)) * rstd(n));
  });
  column_sum<T>(dbias, N, C, KOKKOS_LAMBDA(int n, int c) { return g[static_cast<std::int64_t>(n) * C + c]; });
}

}  // namespace team

// out[n,:] = (inp[n,:] - mean[n]) * rstd[n] * weight + bias
template <class T>
void layernorm_forward(const View1<T>& out,              // out (N,C)
                       const View1<T>& mean,             // mean (N)
                       const View1<T>& rstd,             // rstd (N), 1 / sqrt(var + eps)
                       const View1<const T>& inp,        // inp (N,C)
                       const View1<const T>& weight,     // weight (C)
                       const View1<const T>& bias,       // bias (C)
                       int N, int C) {
  if (portable()) return team::layernorm_forward<T>(out, mean, rstd, inp, weight, bias, N, C);
  const T inv_c = T(1) / T(C);
  const T eps = T(kLayerNormEps);
  Kokkos::parallel_for(
      "fsdpp::layernorm_forward", Kokkos::RangePolicy<ExecSpace>(0, N), KOKKOS_LAMBDA(const int n) {
        const T* x = inp.data() + static_cast<std::int64_t>(n) * C;
        T* o = out.data() + static_cast<std::int64_t>(n) * C;
        const T* w = weight.data();
        const T* b = bias.data();
        // Two passes: the variance of the centred values does not cancel catastrophically as E[x^2] - m^2 can.
        const T m = detail::lane_sum<T>(C, [=](int c) { return x[c]; }) * inv_c;
        const T var = detail::lane_sum<T>(C, [=](int c) { return (x[c] - m) * (x[c] - m); }) * inv_c;
        const T s = T(1) / kmath::sqrt(var + eps);
        for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * s * w[c] + b[c];
        mean(n) = m;
        rstd(n) = s;
      });
}

// With xhat = (inp - mean) * rstd and g = weight * dout:
//   dinp += rstd * (g - mean_c(g) - xhat * mean_c(g * xhat)),  dweight += sum_n dout * xhat,  dbias += sum_n dout
template <class T>
void layernorm_backward(const View1<T>& dinp,            // dinp (N,C), +=
                        const View1<T>& dweight,         // dweight (C), +=
                        const View1<T>& dbias,           // dbias (C), +=
                        const View1<const T>& dout,      // dout (N,C)
                        const View1<const T>& inp,       // inp (N,C)
                        const View1<const T>& weight,    // weight (C)
                        const View1<const T>& mean,      // mean (N)
                        const View1<const T>& rstd,      // rstd (N)
                        int N, int C) {
  if (portable()) return team::layernorm_backward<T>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  using detail::kColumnTile;
  const T inv_c = T(1) / T(C);
  Kokkos::parallel_for(
      "fsdpp::layernorm_backward_dinp", Kokkos::RangePolicy<ExecSpace>(0, N), KOKKOS_LAMBDA(const int n) {
        const std::int64_t row = static_cast<std::int64_t>(n) * C;
        const T* x = inp.data() + row;
        const T* g = dout.data() + row;
        const T* w = weight.data();
        T* d = dinp.data() + row;
        const T m = mean(n), s = rstd(n);
        const T g_mean = detail::lane_sum<T>(C, [=](int c) { return w[c] * g[c]; }) * inv_c;
        const T gx_mean = detail::lane_sum<T>(C, [=](int c) { return w[c] * g[c] * ((x[c] - m) * s); }) * inv_c;
        for (int c = 0; c < C; ++c) d[c] += s * (w[c] * g[c] - g_mean - (x[c] - m) * s * gx_mean);
      });

  Kokkos::parallel_for(
      "fsdpp::layernorm_backward_dweight", Kokkos::RangePolicy<ExecSpace>(0, detail::column_tiles(C)),
      KOKKOS_LAMBDA(const int tile) {
        const int c0 = detail::tile_begin(tile), w = detail::tile_end(tile, C) - c0;
        T dw[kColumnTile], db[kColumnTile];
        for (int c = 0; c < w; ++c) dw[c] = db[c] = T(0);
        for (int n = 0; n < N; ++n) {
          const std::int64_t at = static_cast<std::int64_t>(n) * C + c0;
          const T* x = inp.data() + at;
          const T* g = dout.data() + at;
          const T m = mean(n), s = rstd(n);
          for (int c = 0; c < w; ++c) {
            dw[c] += g[c] * ((x[c] - m) * s);
            db[c] += g[c];
          }
        }
        for (int c = 0; c < w; ++c) {
          dweight(c0 + c) += dw[c];
          dbias(c0 + c) += db[c];
        }
      });
}

}  // namespace fsdpp::kernels
