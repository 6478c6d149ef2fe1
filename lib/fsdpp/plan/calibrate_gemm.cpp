// Calibration, GEMM: a fixed grid of shapes, independent of any deck, so that one machine file prices every deck
// (plan/calibrate.hpp says what; plan/machine.hpp, gemm_seconds, how the model reads the grid).
#include "fsdpp/plan/calibrate.hpp"

#include "fsdpp/runtime/median.hpp"
#include "fsdpp/tensor/types.hpp"

#include <Kokkos_Core.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <map>
#include <tuple>

namespace fsdpp {
namespace {

// A grid point: C (m, n) = op(A) (m, k) . op(B) (k, n) in one precision.
struct GridShape {
  GemmPrecision precision;
  int m, n, k;
  double flops() const { return 2.0 * m * double(n) * k; }
  auto key() const { return std::make_tuple(int(precision), m, n, k); }
  bool operator<(const GridShape& o) const { return key() < o.key(); }
};

struct MeasuredGemm {
  GridShape shape;
  double tflops;
};

// The three products a linear layer runs, as gemm<float> runs them (op(A), op(B)): forward out = inp W^T (N, T),
// input gradient dinp = dout W (N, N), weight gradient dW += dout^T inp (T, N, accumulating).
constexpr std::array<std::pair<Trans, Trans>, 3> kLinearProducts = {
    {{Trans::N, Trans::T}, {Trans::N, Trans::N}, {Trans::T, Trans::N}}};

// TFLOP/s of one shape: each call runs the next of the three products, so a repeat's mean is their mean time
// (the machine file knows no transposes).
double measure_gemm(MPI_Comm world, const GridShape& s, const CalibrationEffort& effort) {
  const ScopedGemmPrecision scoped(s.precision);
  const std::size_t a_size = std::size_t(s.m) * s.k, b_size = std::size_t(s.k) * s.n, c_size = std::size_t(s.m) * s.n;
  View1<float> a = uninitialized<float>("calibrate_a", a_size), b = uninitialized<float>("calibrate_b", b_size);
  View1<float> c = uninitialized<float>("calibrate_c", c_size);
  Kokkos::deep_copy(a, 0.5f);
  Kokkos::deep_copy(b, 0.25f);
  Kokkos::deep_copy(c, 0.0f);
  std::size_t next = 0;
  const double t = seconds_all_busy(
      world, effort.gemm_repeats(), effort.gemm_target_s(),
      [&] {
        const auto [ta, tb] = kLinearProducts[next++ % kLinearProducts.size()];
        const int lda = ta == Trans::N ? s.k : s.m, ldb = tb == Trans::N ? s.n : s.k;
        const float beta = ta == Trans::T ? 1.0f : 0.0f;  // weight gradients accumulate
        gemm<float>(ta, tb, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb, beta, c.data(), s.n);
      },
      [] { Kokkos::fence(); });
  return s.flops() / t / 1e12;
}

// achieved = peak F / (F + half)  <=>  1 / achieved = 1 / peak + (half / peak) / F: a line in 1 / F.
GemmCurve fit_gemm_curve(const std::vector<MeasuredGemm>& points) {
  std::vector<double> x, y;
  for (const MeasuredGemm& p : points) {
    x.push_back(1.0 / (p.shape.flops() / 1e9));
    y.push_back(1.0 / p.tflops);
  }
  const LineFit f = fit_line_relative(x, y);
  if (f.intercept <= 0) {  // no rise to a plateau (host BLAS: small products run from cache): flat, at the
    double flop = 0, seconds = 0;  // FLOP-weighted throughput of all the products
    for (const MeasuredGemm& p : points) flop += p.shape.flops(), seconds += p.shape.flops() / (p.tflops * 1e12);
    return {flop / seconds / 1e12, 0};
  }
  return {1.0 / f.intercept, std::max(0.0, f.slope / f.intercept)};
}

std::vector<GridShape> grid_shapes(GemmPrecision p) {
  std::vector<GridShape> shapes;
  for (int m : gemm_grid_sizes())
    for (int n : gemm_grid_sizes())
      for (int k : gemm_grid_sizes()) shapes.push_back({p, m, n, k});
  return shapes;
}

// For a precision no deck uses (its curve only): the cubes of the grid, two of them with --quick.
std::vector<GridShape> curve_shapes(GemmPrecision p, bool quick) {
  const std::vector<int>& sizes = gemm_grid_sizes();
  std::vector<GridShape> shapes;
  for (std::size_t i = quick ? 1 : 0; i < sizes.size(); i += quick ? sizes.size() - 2 : 2)
    shapes.push_back({p, sizes[i], sizes[i], sizes[i]});
  return shapes;
}

// The grid in one precision: every shape in each sweep, each keeping the median of its sweeps.
std::vector<MeasuredGemm> measure_grid(MPI_Comm world, GemmPrecision p, const CalibrationEffort& effort) {
  const std::vector<GridShape> shapes = grid_shapes(p);
  std::map<GridShape, std::vector<double>> sweeps;  // TFLOP/s of each sweep
  for (int sweep = 0; sweep < effort.gemm_sweeps(); ++sweep) {
    calibration_progress(world, fmt::format(" {} sweep {} of {}", gemm_precision_name(p), sweep + 1,
                                            effort.gemm_sweeps()));
    for (const GridShape& s : shapes) sweeps[s].push_back(measure_gemm(world, s, effort));
  }
  std::vector<MeasuredGemm> out;
  for (const auto& [s, tflops] : sweeps) out.push_back({s, median(tflops)});
  return out;
}

}  // namespace

const std::vector<int>& gemm_grid_sizes() {
  static const std::vector<int> sizes = {16, 32, 64, 128, 256, 512, 1024};
  return sizes;
}

void calibrate_gemm(MPI_Comm world, const std::vector<GemmPrecision>& precisions, const CalibrationEffort& effort,
                    Machine& m) {
  int ranks = 1;
  MPI_Comm_size(world, &ranks);
  const std::size_t grid = gemm_grid_sizes().size();
  calibration_progress(world, fmt::format("GEMM grid: m, n, k each in {{{}}} ({} shapes) per precision, all {} "
                                          "rank(s) at once, {} BLAS thread(s) each",
                                          fmt::join(gemm_grid_sizes(), ", "), grid * grid * grid, ranks,
                                          blas_threads()));
  m.blas_threads_per_rank = blas_threads();
  std::map<GemmPrecision, std::vector<MeasuredGemm>> by_precision;
  for (GemmPrecision p : precisions) {
    if (by_precision.count(p)) continue;
    by_precision[p] = measure_grid(world, p, effort);
    for (const MeasuredGemm& g : by_precision[p])
      m.gemm_points.push_back({std::string(gemm_precision_name(p)), g.shape.m, g.shape.n, g.shape.k, sig4(g.tflops)});
  }
  for (GemmPrecision p : {GemmPrecision::f32, GemmPrecision::tf32, GemmPrecision::bf16})
    if (!by_precision.count(p))
      for (const GridShape& s : curve_shapes(p, effort.quick)) {
        by_precision[p].push_back({s, measure_gemm(world, s, effort)});
        calibration_progress(world, fmt::format("  gemm {} m {} n {} k {} (for the curve): {:.4g} TFLOP/s",
                                                gemm_precision_name(p), s.m, s.n, s.k, by_precision[p].back().tflops));
      }
  for (const auto& [p, points] : by_precision) {
    const GemmCurve c = fit_gemm_curve(points);
    (p == GemmPrecision::f32 ? m.f32 : p == GemmPrecision::tf32 ? m.tf32 : m.bf16) = {sig4(c.peak_tflops),
                                                                                        sig4(c.half_gflop)};
    calibration_progress(world, fmt::format("  {} curve: peak {:.4g} TFLOP/s, half at {:.4g} GFLOP",
                                            gemm_precision_name(p), c.peak_tflops, c.half_gflop));
  }
}

}  // namespace fsdpp
