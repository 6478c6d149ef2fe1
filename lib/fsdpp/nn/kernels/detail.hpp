#pragma once
// Building blocks shared by the row-wise kernels (encoder, layernorm, linear, gelu, residual, crossentropy).
//
// Host builds compile with plain -O3 (no -ffast-math, baseline x86-64), so GCC neither reassociates a serial
// sum nor vectorizes calls to expf. The helpers here are written so that it does not need to:
//  - sums use kLanes independent partial sums, which GCC turns into vector adds without reordering anything
//    it was not told to;
//  - exp_fast<float> is a branch-free polynomial exp that vectorizes (glibc's expf is a scalar call);
//  - column reductions give each work item a tile of adjacent columns, so the loop over rows reads
//    contiguous memory on a CPU, while on a GPU a tile of one column lets adjacent threads coalesce;
//  - elementwise kernels give each work item a block of contiguous elements and loop over it through raw
//    pointers: GCC does not vectorize Kokkos::Serial's loop over one-element lambdas (the View accesses in
//    the functor are not recognised as strided loads): GELU ran 4x slower that way (54 against 14 ms).
// Every sum is still done in one fixed order, so results are bitwise reproducible run to run.
#include "fsdpp/tensor/types.hpp"

#include <cstdint>
#if !defined(FSDPP_DEVICE_BUILD)
#include <cstring>
#endif

namespace fsdpp::kernels::detail {

#if defined(FSDPP_DEVICE_BUILD)
inline constexpr int kLanes = 1;
inline constexpr int kColumnTile = 1;
inline constexpr int kElementBlock = 1;
#else
inline constexpr int kLanes = 8;           // two SSE vectors of float, or one AVX vector
inline constexpr int kColumnTile = 16;     // one 64-byte cache line of float per row
inline constexpr int kElementBlock = 4096;  // long enough to amortise the call, short enough to spread over threads
#endif

// sum_{i < n} f(i), in kLanes interleaved partial sums that are added up in a fixed order at the end.
template <class T, class F> KOKKOS_INLINE_FUNCTION T lane_sum(int n, const F& f) {
  T part[kLanes];
  for (int l = 0; l < kLanes; ++l) part[l] = T(0);
  int i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) part[l] += f(i + l);
  T s = T(0);
  for (int l = 0; l < kLanes; ++l) s += part[l];
  for (; i < n; ++i) s += f(i);
  return s;
}

// max_{i < n} x[i] for n >= 1, in lanes like lane_sum (max is exact, so the order does not change the value).
template <class T> KOKKOS_INLINE_FUNCTION T lane_max(int n, const T* x) {
  T part[kLanes];
  for (int l = 0; l < kLanes; ++l) part[l] = x[0];
  int i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) part[l] = kmax(part[l], x[i + l]);
  T m = part[0];
  for (int l = 1; l < kLanes; ++l) m = kmax(m, part[l]);
  for (; i < n; ++i) m = kmax(m, x[i]);
  return m;
}

// The columns [c0, c1) owned by column tile `tile` of a row of C.
KOKKOS_INLINE_FUNCTION int tile_begin(int tile) { return tile * kColumnTile; }
KOKKOS_INLINE_FUNCTION int tile_end(int tile, int C) { return kmin(tile * kColumnTile + kColumnTile, C); }
inline int column_tiles(int C) { return (C + kColumnTile - 1) / kColumnTile; }

// The elements [i0, i1) of block `block` of N elements.
KOKKOS_INLINE_FUNCTION std::int64_t block_begin(int block) { return static_cast<std::int64_t>(block) * kElementBlock; }
KOKKOS_INLINE_FUNCTION std::int64_t block_end(int block, std::int64_t N) {
  return kmin(static_cast<std::int64_t>(block) * kElementBlock + kElementBlock, N);
}
inline int element_blocks(std::int64_t N) { return static_cast<int>((N + kElementBlock - 1) / kElementBlock); }

// exp(x). Double, and every type on a GPU, use the library exp (the tests' finite differences run in double).
template <class T> KOKKOS_INLINE_FUNCTION T exp_fast(T x) { return kmath::exp(x); }

// Only when no device backend is compiled in: the specialization is a host function.
#if !defined(FSDPP_DEVICE_BUILD)
// Float on a host: Cephes' expf (relative error ~2e-7 over the range), written so that GCC vectorizes it.
// Inputs are clamped to |x| <= 88 on their bit patterns, with integer selects: a float compare against a
// constant makes GCC specialise the clamped branch to a constant, and the float arithmetic then left in a
// branch blocks vectorization under -ftrapping-math. Results: x <= -87.7 gives 0 (glibc: denormals, then 0),
// x >= 88 gives exp(88) = 1.65e38 (glibc: up to 3.4e38, then inf), NaN gives NaN.
template <> inline float exp_fast<float>(float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const std::uint32_t sign = bits & 0x80000000u;
  const std::int32_t mag = static_cast<std::int32_t>(bits & 0x7FFFFFFFu);
  const std::int32_t over = 0x42B00000 - mag;  // 88.0f; both operands in [0, 2^31), no overflow
  const std::int32_t clamped = mag + (over & (over >> 31));
  const std::uint32_t nan_bits = 0u - static_cast<std::uint32_t>(mag > 0x7F800000);  // all ones for NaN
  const std::uint32_t xb = sign | static_cast<std::uint32_t>(clamped);
  float xc;
  std::memcpy(&xc, &xb, sizeof xc);

  // x = n ln2 + r with |r| <= ln2/2; adding and removing 1.5 * 2^23 rounds to the nearest integer.
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const std::int32_t e = (static_cast<std::int32_t>(n) + 127) << 23;  // 2^n; n in [-127, 127], 2^-127 -> 0
  float scale;
  std::memcpy(&scale, &e, sizeof scale);
  float y = p * scale;
  std::uint32_t yb;
  std::memcpy(&yb, &y, sizeof yb);
  yb |= nan_bits;
  std::memcpy(&y, &yb, sizeof y);
  return y;
}
#endif

// exp as a function object, for formulas shared by the tuned path (exp_fast) and the portable path (the
// library exp, as on a GPU).
struct FastExp {
  template <class T> KOKKOS_INLINE_FUNCTION T operator()(T x) const { return exp_fast(x); }
};
struct LibraryExp {
  template <class T> KOKKOS_INLINE_FUNCTION T operator()(T x) const { return kmath::exp(x); }
};

}  // namespace fsdpp::kernels::detail
