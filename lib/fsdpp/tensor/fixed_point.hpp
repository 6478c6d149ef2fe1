#pragma once
// Exact, order-independent sums of floating-point numbers: reproducible mode's gradients, losses and squared
// gradient norm (docs/reproducible.md).
//
// A number x is cut into `Words` signed int64 words at fixed binary points: w_0 = trunc(x 2^E), and each next
// word the next `Digit` bits of what is left, w_j = trunc(r_{j-1} 2^Digit). Every step is exact in double (a
// power-of-two scale, and the fraction of a double is a double), so cutting is a fixed function of x, and x is
// sum_j w_j 2^-(E + j Digit) up to the bits below the last point, which are dropped the same way every time.
// Integer addition is associative: the words summed over any set of numbers, in any order, split over any
// number of ranks (MPI_SUM on int64 is exact), are the same integers, and so is the one double they convert back
// to. The headroom of the int64 words bounds how many numbers one sum may hold: each format says its limits.

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <limits>

namespace fsdpp {

KOKKOS_INLINE_FUNCTION constexpr double exact_pow2(int e) {
  double v = 1.0;
  for (int i = 0; i < e; ++i) v *= 2.0;
  for (int i = 0; i > e; --i) v *= 0.5;
  return v;
}

template <int Words, int E, int Digit> struct FixedPoint {
  static constexpr int words = Words;
  // |x| 2^E must fit an int64 (callers check their range before).
  KOKKOS_INLINE_FUNCTION static void cut(double x, std::int64_t* w) {
    double r = x * exact_pow2(E);
    for (int j = 0; j < Words; ++j) {
      w[j] = static_cast<std::int64_t>(r);  // toward zero: every word has the sign of x
      r = (r - static_cast<double>(w[j])) * exact_pow2(Digit);
    }
  }
  // The sum the words stand for, lowest word first (a fixed sequence of roundings).
  KOKKOS_INLINE_FUNCTION static double value(const std::int64_t* w) {
    double v = 0.0;
    for (int j = Words - 1; j >= 0; --j) v = static_cast<double>(w[j]) + v * exact_pow2(-Digit);
    return v * exact_pow2(-E);
  }
};

// A gradient element of one computation unit: two words, points 2^-24 and 2^-54. Elements with |g| >= 2^24,
// NaN or Inf are cut as a marker (2^50 in the low word) that survives the sum: the element converts back to
// NaN, so the non-finite guard sees it. Exact for |g| >= 2^-30 (24 significant bits above 2^-54). At most
// kMaxUnits units per step keep the sum of markers inside int64 and apart from the sum of low words.
struct GradientWords {
  using Format = FixedPoint<2, 24, 30>;
  static constexpr int words = 2;
  static constexpr std::int64_t kMarker = std::int64_t{1} << 50;
  static constexpr std::int64_t kMaxUnits = 4096;  // train.reproducible's limit (config/deck_rules.hpp asks here)
  static_assert(kMaxUnits * kMarker <= (std::int64_t{1} << 62), "markers of every unit must fit an int64");
  static constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  KOKKOS_INLINE_FUNCTION static void cut(float g, std::int64_t* w) {
    const double x = static_cast<double>(g);
    if (!(x < exact_pow2(24) && x > -exact_pow2(24))) {
      w[0] = 0;
      w[1] = kMarker;
      return;
    }
    Format::cut(x, w);
  }
  // The mean over `units` of the summed words, in f32.
  KOKKOS_INLINE_FUNCTION static float mean(const std::int64_t* w, double units) {
    const std::int64_t low = w[1] < 0 ? -w[1] : w[1];
    if (low >= (kMarker >> 1)) return kNaN;
    return static_cast<float>(Format::value(w) / units);
  }
};

// A unit's loss (a host double below 2^24): three words down to 2^-84.
using LossWords = FixedPoint<3, 24, 30>;
// A squared gradient element (exact in double; below 2^48): four words from 2^0 down to 2^-90. Sums of up to
// 2^33 elements whose squares average below 2^30 stay inside int64.
using SquareWords = FixedPoint<4, 0, 30>;

}  // namespace fsdpp
