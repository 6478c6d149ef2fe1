#pragma once
// The straight-line fit `fsdpp bench calibrate` turns its sweeps into machine figures with: collective time
// against bytes (latency, bus bandwidth), kernel time against bytes (overhead, bandwidth), and 1 / GEMM
// throughput against 1 / FLOPs (the curve's peak and half point).
#include <cstddef>
#include <vector>

namespace fsdpp {

struct LineFit {
  double intercept = 0, slope = 0;
};

// y = intercept + slope * x, least squares on the relative residual (y - fit) / y, so that small and large sizes
// weigh alike (every y must be positive: times). A negative intercept or a slope <= 0 (a latency or overhead
// cannot be negative, a bandwidth must be finite; noise can make the unconstrained fit say so) gives the line
// through the origin instead, whose slope is positive.
inline LineFit fit_line_relative(const std::vector<double>& x, const std::vector<double>& y) {
  double s00 = 0, s01 = 0, s11 = 0, r0 = 0, r1 = 0;  // normal equations with weights 1 / y^2
  for (std::size_t i = 0; i < x.size() && i < y.size(); ++i) {
    const double w = 1.0 / (y[i] * y[i]);
    s00 += w, s01 += w * x[i], s11 += w * x[i] * x[i], r0 += w * y[i], r1 += w * x[i] * y[i];
  }
  const double det = s00 * s11 - s01 * s01;
  LineFit f;
  if (x.size() >= 2 && det > 0) {
    f.intercept = (s11 * r0 - s01 * r1) / det;
    f.slope = (s00 * r1 - s01 * r0) / det;
  }
  if (f.intercept < 0 || f.slope <= 0 || det <= 0) f = {0, s11 > 0 ? r1 / s11 : 0};
  return f;
}

}  // namespace fsdpp
