#pragma once
// Qwen3's q/k norm: an RMSNorm over each head's hs channels of q and of k in the packed [q | k | v] rows, before
// RoPE, with one weight (hs) for every query head and one for every key head (Qwen3RMSNorm: x / sqrt(mean(x^2) +
// eps) * w, in float). The q heads and then the k heads are consecutive in a row, so head h < NH reads wq and
// the next NKV heads read wk.
//
// Shapes: qkv (N, W) with W >= (NH + NKV) hs; raw (N, (NH + NKV) hs): the pre-norm values forward keeps for
// backward; rstd (N, NH + NKV).
#include "fsdpp/tensor/types.hpp"

#include <cstdint>

namespace fsdpp::kernels {

// In place: qkv's q and k heads normalised; their input into `raw` and 1/rms into `rstd` (both empty: a decode
// forward, which keeps nothing).
template <class T>
void qk_norm_forward(const View1<T>& qkv, const View1<T>& raw, const View1<T>& rstd, const View1<const T>& wq,
                     const View1<const T>& wk, int N, int W, int heads, int kv_heads, int hs, double eps) {
  const int H = heads + kv_heads;
  const bool keep = raw.extent(0) != 0;
  Kokkos::parallel_for(
      "fsdpp::qk_norm_forward", Kokkos::RangePolicy<ExecSpace>(0, std::int64_t{N} * H),
      KOKKOS_LAMBDA(const std::int64_t i) {
        const std::int64_t t = i / H;
        const int h = static_cast<int>(i % H);
        T* x = qkv.data() + t * W + std::int64_t{h} * hs;
        const T* w = h < heads ? wq.data() : wk.data();
        T ss = 0;
        for (int c = 0; c < hs; ++c) ss += x[c] * x[c];
        const T r = T(1) / kmath::sqrt(ss / T(hs) + T(eps));
        if (keep) {
          for (int c = 0; c < hs; ++c) raw(i * hs + c) = x[c];
          rstd(i) = r;
        }
        for (int c = 0; c < hs; ++c) x[c] = x[c] * r * w[c];
      });
}

// In place: dqkv's q and k columns from d(normalised) to d(raw): with xh = raw * rstd, dx = rstd (w dy - xh
// mean(w dy xh)); dwq and dwk += sum over rows and their heads of dy xh, summed in row order (deterministic).
template <class T>
void qk_norm_backward(const View1<T>& dqkv, const View1<T>& dwq, const View1<T>& dwk, const View1<const T>& raw,
                      const View1<const T>& rstd, const View1<const T>& wq, const View1<const T>& wk, int N, int W,
                      int heads, int kv_heads, int hs) {
  const int H = heads + kv_heads;
  // The weights' gradients first: they read d(normalised), which the second pass overwrites.
  Kokkos::parallel_for(
      "fsdpp::qk_norm_backward_weights", Kokkos::RangePolicy<ExecSpace>(0, 2 * hs), KOKKOS_LAMBDA(const int j) {
        const bool q = j < hs;
        const int c = q ? j : j - hs;
        T acc = 0;
        for (int t = 0; t < N; ++t)
          for (int h = q ? 0 : heads; h < (q ? heads : H); ++h) {
            const std::int64_t i = std::int64_t{t} * H + h;
            acc += dqkv(std::int64_t{t} * W + std::int64_t{h} * hs + c) * raw(i * hs + c) * rstd(i);
          }
        if (q) dwq(c) += acc;
        else dwk(c) += acc;
      });
  Kokkos::parallel_for(
      "fsdpp::qk_norm_backward", Kokkos::RangePolicy<ExecSpace>(0, std::int64_t{N} * H),
      KOKKOS_LAMBDA(const std::int64_t i) {
        const std::int64_t t = i / H;
        const int h = static_cast<int>(i % H);
        T* dy = dqkv.data() + t * W + std::int64_t{h} * hs;
        const T* w = h < heads ? wq.data() : wk.data();
        const T r = rstd(i);
        T dot = 0;
        for (int c = 0; c < hs; ++c) dot += w[c] * dy[c] * raw(i * hs + c) * r;
        dot /= T(hs);
        for (int c = 0; c < hs; ++c) dy[c] = r * (w[c] * dy[c] - raw(i * hs + c) * r * dot);
      });
}

}  // namespace fsdpp::kernels
