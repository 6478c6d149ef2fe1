// Calibration, fsdpp's own non-GEMM kernels and the host link (plan/calibrate.hpp says what and why).
#include "fsdpp/plan/calibrate.hpp"

#include "fsdpp/nn/kernels/gelu.hpp"
#include "fsdpp/nn/kernels/layernorm.hpp"
#include "fsdpp/nn/kernels/rmsnorm.hpp"
#include "fsdpp/nn/kernels/softmax.hpp"
#include "fsdpp/nn/kernels/swiglu.hpp"
#include "fsdpp/nn/parameter.hpp"
#include "fsdpp/optim/adamw.hpp"
#include "fsdpp/optim/deck_optimizer.hpp"
#include "fsdpp/optim/grad_norm.hpp"
#include "fsdpp/plan/step_cost.hpp"
#include "fsdpp/tensor/types.hpp"

#include <Kokkos_Core.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace fsdpp {
namespace {

struct KernelFit {
  double bandwidth_gbs = 0, overhead_us = 0;  // the norms forward and the optimizer update
  double backward_bandwidth_gbs = 0;          // the norms backward, at kBackwardBytesPerForwardByte x forward bytes
  double optimizer_bandwidth_gbs = 0;         // the gradient norm and AdamW, at optimizer_passes x 4 bytes
  std::map<std::string, KernelRate> families;  // gelu, swiglu, softmax
};


// One kernel series' points, a point per size: bytes and seconds per kernel call.
struct KernelSeries {
  std::vector<double> bytes, seconds;
  // Its rate: bytes over time at the activation sizes (all but the first, a few rows, which is there for the
  // per-kernel overhead; a slope fitted through it follows the launch costs of the small calls).
  double gbs() const {
    double b = 0, t = 0;
    for (std::size_t i = bytes.size() > 1 ? 1 : 0; i < bytes.size(); ++i) b += bytes[i], t += seconds[i];
    return t > 0 ? b / t / 1e9 : 0;
  }
};

// The machine's figures from the series: "rest" (the norms forward and the AdamW update) fitted to overhead +
// bytes / bandwidth; the others their rates.
KernelFit fit_kernels(std::map<std::string, KernelSeries>& series) {
  KernelFit fit;
  const LineFit rest = fit_line_relative(series["rest"].bytes, series["rest"].seconds);
  fit.bandwidth_gbs = rest.slope > 0 ? 1.0 / rest.slope / 1e9 : 0;
  fit.overhead_us = rest.intercept * 1e6;
  fit.backward_bandwidth_gbs = series["rest_backward"].gbs();
  fit.optimizer_bandwidth_gbs = series["optimizer"].gbs();
  for (const std::string& family : kernel_family_names())
    fit.families[family] = {series[family].gbs(), series[family + "_backward"].gbs()};
  return fit;
}

// fsdpp's own non-GEMM kernels over a few sizes, each with the bytes the performance model counts for it
// (step_cost.cpp; the families' per element in kernel_family_bytes_per_element; backward kernels
// kBackwardBytesPerForwardByte times their forward's), each series fitted to overhead + bytes / bandwidth.
KernelFit measure_kernels(MPI_Comm world, const KernelShape& shape, const CalibrationEffort& o) {
  std::map<std::string, KernelSeries> series;  // "rest", "rest_backward", "optimizer", "<family>", "<family>_backward"
  const double f = sizeof(float), back = kBackwardBytesPerForwardByte;
  const int C = shape.C, T = shape.T;
  for (std::int64_t E : shape.sizes) {
    const int N = static_cast<int>(E / C);
    const std::int64_t score_rows = std::max<std::int64_t>(1, E / T);
    auto x = uninitialized<float>("calibrate_x", E), y = uninitialized<float>("calibrate_y", E);
    auto dy = uninitialized<float>("calibrate_dy", E), dx = uninitialized<float>("calibrate_dx", E);
    auto u = uninitialized<float>("calibrate_u", E), du = uninitialized<float>("calibrate_du", E);
    auto scores = uninitialized<float>("calibrate_scores", score_rows * T);
    auto dscores = uninitialized<float>("calibrate_dscores", score_rows * T);
    auto w = uninitialized<float>("calibrate_w", C), b = uninitialized<float>("calibrate_b", C);
    auto dw = uninitialized<float>("calibrate_dw", C), db = uninitialized<float>("calibrate_db", C);
    auto mean = uninitialized<float>("calibrate_mean", N), rstd = uninitialized<float>("calibrate_rstd", N);
    for (const auto& v : {x, y, dy, dx, u, du, w, b, dw, db, mean, rstd, scores, dscores}) Kokkos::deep_copy(v, 0.5f);
    Parameter param("calibrate.weight", {E}, InitRule::zeros(), ParamRole::weight);
    param.adopt(uninitialized<float>("calibrate_param", E), uninitialized<float>("calibrate_grad", E));
    Kokkos::deep_copy(param.value(), 0.5f);
    Kokkos::deep_copy(param.grad(), 0.01f);
    AdamW adamw({&param}, AdamWConfig{});
    const std::vector<Parameter*> params{&param};
    struct Kernel {
      const char* name;
      const char* series;
      double bytes;
      std::function<void()> run;
    };
    const double scores_n = double(score_rows) * T;
    const auto per = [](const char* family) { return kernel_family_bytes_per_element(family); };
    const std::vector<Kernel> kernels = {
        {"layernorm_forward", "rest", f * (2.0 * E + 2.0 * N),
         [&] { kernels::layernorm_forward<float>(y, mean, rstd, x, w, b, N, C); }},
        {"rmsnorm_forward", "rest", f * (2.0 * E + N), [&] { kernels::rmsnorm_forward<float>(y, rstd, x, w, N, C, 1e-5); }},
        {"adamw_step", "rest", f * optimizer_update_passes(OptimConfig{}) * E, [&] { adamw.step(1e-6f); }},
        {"layernorm_backward", "rest_backward", back * f * (2.0 * E + 2.0 * N),
         [&] { kernels::layernorm_backward<float>(dx, dw, db, dy, x, w, mean, rstd, N, C); }},
        {"rmsnorm_backward", "rest_backward", back * f * (2.0 * E + N),
         [&] { kernels::rmsnorm_backward<float>(dx, dw, dy, x, w, rstd, N, C); }},
        {"gelu_forward", "gelu", per("gelu") * E, [&] { kernels::gelu_forward<float>(y, x, int(E)); }},
        {"gelu_backward", "gelu_backward", back * per("gelu") * E, [&] { kernels::gelu_backward<float>(dx, x, dy, int(E)); }},
        {"swiglu_forward", "swiglu", per("swiglu") * E, [&] { kernels::swiglu_forward<float>(y, x, u, E); }},
        {"swiglu_backward", "swiglu_backward", back * per("swiglu") * E,
         [&] { kernels::swiglu_backward<float>(dx, du, dy, x, u, E); }},
        {"softmax_forward", "softmax", per("softmax") * scores_n,
         [&] { kernels::attention_softmax_forward<float>(scores.data(), score_rows, T); }},
        {"softmax_backward", "softmax_backward", back * per("softmax") * scores_n,
         [&] { kernels::attention_softmax_backward<float>(dscores.data(), scores.data(), score_rows, T); }},
        {"grad_norm_and_adamw", "optimizer", f * optimizer_passes(OptimConfig{}) * E,
         [&] { grad_norm_squared_local(params), adamw.step(1e-6f); }},
    };
    // "rest" is a mix (one point per size: its bytes over its time, so that a kernel slower than its bytes say
    // weighs by the time it takes, as in a step), per kernel, so that the intercept is one kernel's overhead.
    std::map<std::string, std::pair<double, double>> mix;  // series -> bytes, seconds
    std::map<std::string, int> count;
    std::string rates;
    for (const Kernel& k : kernels) {
      const double t = seconds_all_busy(world, o.repeats(), o.target_s(), k.run, [] { Kokkos::fence(); });
      mix[k.series].first += k.bytes, mix[k.series].second += t, ++count[k.series];
      rates += fmt::format(" {} {:.3g}", k.name, k.bytes / t / 1e9);
    }
    calibration_progress(world, fmt::format("  {} values, GB/s:{}", E, rates));
    for (const auto& [name, bt] : mix) {
      series[name].bytes.push_back(bt.first / count[name]);
      series[name].seconds.push_back(bt.second / count[name]);
    }
  }
  return fit_kernels(series);
}

// A host <-> device copy (on host builds, a copy between two host buffers): latency and bandwidth.
LineFit measure_host_link(MPI_Comm world, const CalibrationEffort& o) {
  std::vector<double> bytes, seconds;
  for (std::size_t n : {std::size_t(1) << 8, std::size_t(1) << 16, std::size_t(1) << 22}) {
    View1<float> device = uninitialized<float>("calibrate_device", n);
    Kokkos::View<float*, Kokkos::HostSpace> host(Kokkos::view_alloc(Kokkos::WithoutInitializing, "calibrate_host"), n);
    Kokkos::deep_copy(device, 1.0f);
    Kokkos::deep_copy(host, 2.0f);
    bytes.push_back(double(n) * sizeof(float));
    seconds.push_back(seconds_all_busy(world, o.repeats(), o.target_s(), [&] { Kokkos::deep_copy(host, device); },
                                       [] { Kokkos::fence(); }));
  }
  return fit_line_relative(bytes, seconds);
}

}  // namespace

KernelShape kernel_shape(int C, int T, std::int64_t tokens) {
  const std::int64_t activations = std::max(tokens * C, std::int64_t{1} << 18);
  return {C, T, {std::int64_t(C) * 16, activations, std::max(activations * 4, std::int64_t{1} << 20)}};
}

void calibrate_kernels(MPI_Comm world, const KernelShape& shape, const CalibrationEffort& effort, Machine& m) {
  calibration_progress(world, fmt::format("non-GEMM kernels (layernorm, rmsnorm, gelu, swiglu, softmax; forward and "
                                          "backward; the optimizer step) at {} sizes", shape.sizes.size()));
  const KernelFit k = measure_kernels(world, shape, effort);
  calibration_progress(world, fmt::format("  norms forward {:.4g} GB/s, {:.4g} us per kernel; backward {:.4g} GB/s; "
                                          "optimizer {:.4g} GB/s", k.bandwidth_gbs, k.overhead_us,
                                          k.backward_bandwidth_gbs, k.optimizer_bandwidth_gbs));
  for (const auto& [family, rate] : k.families) {
    calibration_progress(world, fmt::format("  {}: forward {:.4g} GB/s, backward {:.4g} GB/s", family,
                                            rate.forward_gbs, rate.backward_gbs));
    if (rate.forward_gbs > 0 && rate.backward_gbs > 0)
      m.kernels[family] = {sig4(rate.forward_gbs), sig4(rate.backward_gbs)};
  }
  m.memory_bandwidth_gbs = sig4(k.bandwidth_gbs);
  m.backward_bandwidth_gbs = sig4(k.backward_bandwidth_gbs);
  m.optimizer_bandwidth_gbs = sig4(k.optimizer_bandwidth_gbs);
  m.kernel_overhead_us = sig4(k.overhead_us);
}

void calibrate_host_link(MPI_Comm world, const CalibrationEffort& effort, Machine& m) {
  const LineFit h = measure_host_link(world, effort);
  m.host_link = {sig4(h.intercept * 1e6), sig4(h.slope > 0 ? 1 / h.slope / 1e9 : 0)};
}

}  // namespace fsdpp
