// fsdpp bench kernels: the row kernels at GPT-2 124M shapes (C 768, NH 12, V 50257), forward and backward,
// on the tuned host path and on the portable (GPU-shaped team) path (lib/fsdpp/nn/kernels/team.hpp). Launch it
// through `tests/bench/run gpu_kernels`.
//  - Host build: both paths, median time of several runs each, GB/s and the portable/tuned time ratio. B and T
//    default to 1 and 256 so that it runs in seconds on one core (the real step is B 8, T 1024).
//  - Device build (only the portable path exists there): GB/s against the device bandwidth measured here by a
//    large deep_copy, B 8 and T 1024 by default. The target on an H200 is >= 60% for every row kernel.
// GB/s counts the bytes each kernel must move at least (each input read once, each output written once), the
// same count for both paths, so the ratio of GB/s is the ratio of times.
#include "commands.hpp"

#include "fsdpp/nn/kernels/crossentropy.hpp"
#include "fsdpp/nn/kernels/embedding.hpp"
#include "fsdpp/nn/kernels/encoder.hpp"
#include "fsdpp/nn/kernels/layernorm.hpp"
#include "fsdpp/nn/kernels/rmsnorm.hpp"
#include "fsdpp/nn/kernels/softmax.hpp"
#include "fsdpp/nn/kernels/team.hpp"
#include "fsdpp/runtime/error.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace fsdpp::app {
namespace {

struct KernelBenchOptions {
  int B = 0, T = 0;  // 0: the build's default (host 1 x 256, device 8 x 1024)
  int repeats = 5;
};

struct Shapes {
  int B, T, C = 768, NH = 12, V = 50257;
  std::int64_t N() const { return std::int64_t(B) * T; }
};

double median_seconds(int repeats, const std::function<void()>& f) {
  f();  // warm-up: first touch, caches
  Kokkos::fence();
  std::vector<double> s;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    Kokkos::fence();
    s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

// Deterministic values in [lo, hi): a hash of the index, so that no per-element RNG state is needed.
void fill(const View1<float>& v, float lo, float hi, unsigned salt) {
  Kokkos::parallel_for(
      "fsdpp::bench_kernels_fill", Kokkos::RangePolicy<ExecSpace>(0, v.extent(0)), KOKKOS_LAMBDA(const std::size_t i) {
        std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u ^ salt * 40503u;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        v(i) = lo + (hi - lo) * static_cast<float>(h & 0xFFFFFF) / 16777216.0f;
      });
}

struct Case {
  std::string name;
  double bytes;
  std::function<void()> run;
};

// The kernels and their minimal byte counts. Buffers are allocated once, here, not per timed call.
std::vector<Case> make_cases(const Shapes& s) {
  const std::int64_t N = s.N(), NC = N * s.C, rows = std::int64_t(s.B) * s.NH * s.T;
  auto x = uninitialized<float>("bench_x", NC), out = uninitialized<float>("bench_out", NC);
  auto dout = uninitialized<float>("bench_dout", NC), dinp = uninitialized<float>("bench_dinp", NC);
  auto w = uninitialized<float>("bench_w", s.C), b = uninitialized<float>("bench_b", s.C);
  auto dw = uninitialized<float>("bench_dw", s.C), db = uninitialized<float>("bench_db", s.C);
  auto mean = uninitialized<float>("bench_mean", N), rstd = uninitialized<float>("bench_rstd", N);
  auto logits = uninitialized<float>("bench_logits", N * s.V), losses = uninitialized<float>("bench_losses", N);
  auto att = uninitialized<float>("bench_att", rows * s.T), datt = uninitialized<float>("bench_datt", rows * s.T);
  auto wte = uninitialized<float>("bench_wte", std::int64_t(s.V) * s.C);
  auto wpe = uninitialized<float>("bench_wpe", std::int64_t(s.T) * s.C);
  auto dwte = uninitialized<float>("bench_dwte", std::int64_t(s.V) * s.C);
  auto dwpe = uninitialized<float>("bench_dwpe", std::int64_t(s.T) * s.C);
  View1<std::int32_t> tokens("bench_tokens", N);
  Kokkos::parallel_for(
      "fsdpp::bench_kernels_tokens", Kokkos::RangePolicy<ExecSpace>(0, N),
      KOKKOS_LAMBDA(const std::int64_t i) { tokens(i) = static_cast<std::int32_t>((i * 7919) % s.V); });
  unsigned salt = 1;
  for (const auto& v : {x, dout, dinp, w, b, dw, db, att, datt, wte, wpe, dwte, dwpe}) fill(v, -1, 1, salt++);
  const std::int64_t V = s.V;
  auto fresh_logits = [=] { fill(logits, -4, 4, 99); };
  const double f = sizeof(float);
  // Causal rows: row t reads t+1 values (sum over t of t+1 = T(T+1)/2 per head) and writes T.
  const double causal = double(rows) / s.T * (double(s.T) * (s.T + 1) / 2), full = double(rows) * s.T;
  const int B = s.B, T = s.T, C = s.C;
  fresh_logits();
  return {
      {"layernorm_forward", f * (2.0 * NC + 2.0 * N), [=] { kernels::layernorm_forward<float>(out, mean, rstd, x, w, b, int(N), C); }},
      {"layernorm_backward", f * (4.0 * NC + 2.0 * N),
       [=] { kernels::layernorm_backward<float>(dinp, dw, db, dout, x, w, mean, rstd, int(N), C); }},
      {"rmsnorm_forward", f * (2.0 * NC + N), [=] { kernels::rmsnorm_forward<float>(out, rstd, x, w, int(N), C, 1e-5); }},
      {"rmsnorm_backward", f * (4.0 * NC + N), [=] { kernels::rmsnorm_backward<float>(dinp, dw, dout, x, w, rstd, int(N), C); }},
      // Forward and backward are one fused kernel; in place it turns logits into dlogits, which stay finite.
      {"crossentropy_fwd_bwd", f * 2.0 * N * V,
       [=] { kernels::crossentropy_forward_backward<float>(logits, losses, tokens, int(N), int(V), 1.0f / float(N)); }},
      {"attention_softmax_forward", f * (causal + full), [=] { kernels::attention_softmax_forward(att.data(), rows, T); }},
      {"attention_softmax_backward", f * (2.0 * causal + full),
       [=] { kernels::attention_softmax_backward(datt.data(), static_cast<const float*>(att.data()), rows, T); }},
      {"encoder_forward", f * 3.0 * NC, [=] { kernels::encoder_forward<float>(out, tokens, wte, wpe, B, T, C); }},
      {"encoder_backward", f * (3.0 * NC + 2.0 * T * C), [=] { kernels::encoder_backward<float>(dwte, dwpe, dout, tokens, B, T, C); }},
      {"embedding_forward", f * 2.0 * NC, [=] { kernels::embedding_forward<float>(out, tokens, wte, int(N), C); }},
      {"embedding_backward", f * 3.0 * NC, [=] { kernels::embedding_backward<float>(dwte, dout, tokens, int(N), C); }},
  };
}

// Device copy bandwidth (GB/s): read + write of a 1 GiB buffer, median of 5.
double device_copy_gbs() {
  const std::size_t n = std::size_t(1) << 28;
  auto a = uninitialized<float>("bench_copy_src", n), c = uninitialized<float>("bench_copy_dst", n);
  Kokkos::deep_copy(a, 1.0f);
  const double t = median_seconds(5, [&] { Kokkos::deep_copy(c, a); });
  return 2.0 * n * sizeof(float) / t / 1e9;
}

int run_kernels_bench(const KernelBenchOptions& o) {
#if defined(FSDPP_DEVICE_BUILD)
  const bool device = true;
#else
  const bool device = false;
#endif
  Shapes s{o.B > 0 ? o.B : (device ? 8 : 1), o.T > 0 ? o.T : (device ? 1024 : 256)};
  std::printf("kernel bench: GPT-2 124M shapes B %d, T %d, C %d, NH %d, V %d (f32)%s\n", s.B, s.T, s.C, s.NH, s.V,
              device ? "" : "; host build: B and T reduced from 8 x 1024 so that it runs in seconds");
  const auto cases = make_cases(s);
  nlohmann::json summary = {{"bench", "gpu_kernels"}, {"B", s.B}, {"T", s.T}, {"device", device}};
  if (device) {
    const double peak = device_copy_gbs();
    std::printf("measured device copy bandwidth: %.0f GB/s\n%-28s %10s %10s %8s\n", peak, "kernel", "ms", "GB/s", "%peak");
    double worst = 1e9;
    for (const auto& c : cases) {
      const double t = median_seconds(o.repeats, c.run), gbs = c.bytes / t / 1e9;
      worst = std::min(worst, gbs / peak);
      std::printf("%-28s %10.3f %10.1f %7.1f%%\n", c.name.c_str(), t * 1e3, gbs, 100 * gbs / peak);
      summary["gbs"][c.name] = gbs;
    }
    summary["copy_gbs"] = peak;
    summary["worst_fraction_of_peak"] = worst;
  } else {
    std::printf("%-28s %12s %12s %10s %10s %8s\n", "kernel", "tuned ms", "portable ms", "tuned GB/s", "port. GB/s",
                "ratio");
    double worst = 0;
    for (const auto& c : cases) {
      double t[2];
      for (int path = 0; path < 2; ++path) {
        kernels::ScopedKernelPath scoped(path == 1);
        t[path] = median_seconds(o.repeats, c.run);
      }
      const double ratio = t[1] / t[0];
      worst = std::max(worst, ratio);
      std::printf("%-28s %12.3f %12.3f %10.2f %10.2f %7.2fx\n", c.name.c_str(), t[0] * 1e3, t[1] * 1e3,
                  c.bytes / t[0] / 1e9, c.bytes / t[1] / 1e9, ratio);
      summary["portable_over_tuned"][c.name] = ratio;
    }
    summary["worst_portable_over_tuned"] = worst;
  }
  std::printf("%s\n", summary.dump().c_str());
  return 0;
}

}  // namespace

Command add_bench_kernels_command(CLI::App& bench) {
  auto* cli = bench.add_subcommand("kernels", "Row kernels at GPT-2 124M shapes: tuned vs portable (host), GB/s vs peak (GPU)");
  auto options = std::make_shared<KernelBenchOptions>();
  cli->add_option("--batch", options->B, "Batch size B (default: host 1, GPU 8)")->check(CLI::PositiveNumber);
  cli->add_option("--seq", options->T, "Sequence length T (default: host 256, GPU 1024)")->check(CLI::PositiveNumber);
  cli->add_option("--repeats", options->repeats, "Timed runs per kernel and path; the median is reported")
      ->check(CLI::PositiveNumber)->capture_default_str();
  return {cli, [options](Runtime& rt) {
            FSDPP_REQUIRE(rt.size() == 1, "fsdpp bench kernels runs on one rank (launch it without mpiexec -n > 1)");
            return run_kernels_bench(*options);
          }};
}

}  // namespace fsdpp::app
