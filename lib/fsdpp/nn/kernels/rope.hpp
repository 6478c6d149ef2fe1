#pragma once
// Rotary position embeddings (RoFormer; Llama), in Hugging Face's half-split convention: within a head of hs
// channels, channel i < hs/2 pairs with channel i + hs/2 (rotate_half), not with its neighbour 2i+1 as in
// Meta's original interleaved layout. Hugging Face's conversion permutes the q_proj/k_proj rows into this
// layout, so with it fsdpp's q/k weights ARE Hugging Face's and import/export copies them unchanged.
//
// At position t, pair (x1, x2) = (x[i], x[i + hs/2]) rotates by the angle t * theta^(-2i/hs):
//   x1' = x1 cos - x2 sin,   x2' = x2 cos + x1 sin
// The rotation is linear and orthogonal, so backward is the transposed rotation of the gradient and needs no
// saved input. Both run IN PLACE on rows of a packed buffer: `heads` heads of hs channels at the start of each
// row of `row_width` (Llama rotates the NH query heads and the NKV key heads of a packed [q | k | v] row).
// Positions: row n = b*T + t sits at position t, or at positions[n] when given (context parallelism: a rank's rows
// are chunks of the sequence, at their global positions, nn/context_parallel.hpp); with document starts
// (data.reset_positions, document.hpp) minus starts[n]: each packed document from position 0, as if it ran alone.
// Forward and backward take the same.
#include "fsdpp/tensor/types.hpp"

#include <cmath>
#include <cstdint>
#include <vector>

namespace fsdpp::kernels {

// Llama 3.1's frequency scaling (Hugging Face rope_scaling with rope_type "llama3"; Llama 3.1 uses factor 8,
// Llama 3.2 factor 32): pairs whose wavelength 2 pi / f exceeds original_context / low_freq_factor turn
// `factor` times slower, those below original_context / high_freq_factor keep their frequency, and those in
// between blend the two linearly in original_context / wavelength. factor 1 is plain RoPE.
struct RopeScaling {
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_context = 8192.0;
};

// The frequency of pair i of a head of hs channels: theta^(-2i/hs), scaled as above.
inline double rope_frequency(int i, int hs, double theta, const RopeScaling& scaling = {}) {
  const double f = std::pow(theta, -2.0 * i / hs);
  if (scaling.factor == 1.0) return f;
  const double wavelength = 2.0 * 3.14159265358979323846 / f;
  if (wavelength < scaling.original_context / scaling.high_freq_factor) return f;
  if (wavelength > scaling.original_context / scaling.low_freq_factor) return f / scaling.factor;
  const double smooth = (scaling.original_context / wavelength - scaling.low_freq_factor) /
                        (scaling.high_freq_factor - scaling.low_freq_factor);
  return (1.0 - smooth) * f / scaling.factor + smooth * f;
}

// The angle table, cos and sin (max_T, hs/2) as row-major host vectors, computed in double and rounded once.
inline void rope_table(std::vector<double>& cos_t, std::vector<double>& sin_t, int max_T, int hs, double theta,
                       const RopeScaling& scaling = {}) {
  const int half = hs / 2;
  cos_t.assign(static_cast<std::size_t>(max_T) * half, 0.0);
  sin_t.assign(cos_t.size(), 0.0);
  for (int t = 0; t < max_T; ++t)
    for (int i = 0; i < half; ++i) {
      const double angle = t * rope_frequency(i, hs, theta, scaling);
      cos_t[static_cast<std::size_t>(t) * half + i] = std::cos(angle);
      sin_t[static_cast<std::size_t>(t) * half + i] = std::sin(angle);
    }
}

namespace detail {
// Rotates heads [0, heads) of one row at position t by +angle (sign 1, forward) or -angle (sign -1, backward).
template <class T>
KOKKOS_INLINE_FUNCTION void rope_rotate_row(T* row, const T* c, const T* s, int heads, int hs, T sign) {
  const int half = hs / 2;
  for (int h = 0; h < heads; ++h) {
    T* x1 = row + h * hs;
    T* x2 = x1 + half;
    for (int i = 0; i < half; ++i) {
      const T a = x1[i], b = x2[i], si = sign * s[i];
      x1[i] = a * c[i] - b * si;
      x2[i] = b * c[i] + a * si;
    }
  }
}
}  // namespace detail

namespace detail {
// Row n's position: t = n % T (or positions[n]), minus starts[n] (its place in its document) when starts are given.
KOKKOS_INLINE_FUNCTION std::int64_t rope_position(int n, int T_len, const std::int32_t* starts,
                                                  const std::int32_t* positions) {
  return (positions ? positions[n] : n % T_len) - (starts ? starts[n] : 0);
}
}  // namespace detail

// x <- rope(x): rows n = b*T + t of x (B*T rows of row_width), heads [0, heads) of hs channels each.
template <class T>
void rope_forward(const View1<T>& x,              // x (B,T,row_width), in place
                  const View1<const T>& cos_t,    // cos (>= T, hs/2)
                  const View1<const T>& sin_t,    // sin (>= T, hs/2)
                  int B, int T_len, int row_width, int heads, int hs,
                  const std::int32_t* starts = nullptr,      // (B*T) document starts: reset positions
                  const std::int32_t* positions = nullptr) { // (B*T) global positions: context parallelism
  const int half = hs / 2;
  Kokkos::parallel_for(
      "fsdpp::rope_forward", Kokkos::RangePolicy<ExecSpace>(0, B * T_len), KOKKOS_LAMBDA(const int n) {
        const std::int64_t t = detail::rope_position(n, T_len, starts, positions);
        detail::rope_rotate_row(x.data() + static_cast<std::int64_t>(n) * row_width, cos_t.data() + t * half,
                                sin_t.data() + t * half, heads, hs, T(1));
      });
}

// dx <- rope^T(dx): the gradient with respect to the input of rope_forward, given the gradient of its output.
template <class T>
void rope_backward(const View1<T>& dx,            // dx (B,T,row_width), in place
                   const View1<const T>& cos_t,   // cos (>= T, hs/2)
                   const View1<const T>& sin_t,   // sin (>= T, hs/2)
                   int B, int T_len, int row_width, int heads, int hs,
                   const std::int32_t* starts = nullptr,      // as rope_forward's
                   const std::int32_t* positions = nullptr) {
  const int half = hs / 2;
  Kokkos::parallel_for(
      "fsdpp::rope_backward", Kokkos::RangePolicy<ExecSpace>(0, B * T_len), KOKKOS_LAMBDA(const int n) {
        const std::int64_t t = detail::rope_position(n, T_len, starts, positions);
        detail::rope_rotate_row(dx.data() + static_cast<std::int64_t>(n) * row_width, cos_t.data() + t * half,
                                sin_t.data() + t * half, heads, hs, T(-1));
      });
}

}  // namespace fsdpp::kernels
