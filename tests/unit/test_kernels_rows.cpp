// The row-wise GPT-2 kernels (encoder, layernorm, linear, gelu, residual, crossentropy) against plain double
// references, their backward passes against central finite differences of L = sum(out * R) in double, and
// the float instantiations against the double ones.
//
// Backward kernels accumulate, so every gradient buffer starts filled with random values G0 and the analytic
// gradient is read back as (result - G0): that checks the += as well as the values.
#include "kernel_test_cases.hpp"

#include <array>
#include <chrono>
#include <cstdio>
#include <limits>

TEST_CASE("rows kernels: encoder forward matches the reference") {
  const EncoderCase k;
  const auto r = run_encoder<double>(k);
  Vec ref(k.B * k.T * k.C);
  for (int b = 0; b < k.B; ++b)
    for (int t = 0; t < k.T; ++t)
      for (int c = 0; c < k.C; ++c)
        ref[(b * k.T + t) * k.C + c] = k.wte[k.tokens[b * k.T + t] * k.C + c] + k.wpe[t * k.C + c];
  CHECK(rel_err(r.out, ref) < 1e-12);
  CHECK(rel_err(run_encoder<float>(k).out, r.out) < 1e-5);
}

TEST_CASE("rows kernels: encoder backward matches finite differences") {
  EncoderCase k;
  const auto r = run_encoder<double>(k);
  auto loss = [&] { return dot(run_encoder<double>(k).out, k.R); };
  CHECK(rel_err(r.dwte, fd_grad(k.wte, loss)) < 1e-6);
  CHECK(rel_err(r.dwpe, fd_grad(k.wpe, loss)) < 1e-6);
  // Tokens 2 and 4 and position 3 (>= T) are never used: their gradient must stay exactly G0.
  for (int c = 0; c < k.C; ++c) {
    CHECK(r.dwte[2 * k.C + c] == 0.0);
    CHECK(r.dwte[4 * k.C + c] == 0.0);
    CHECK(r.dwpe[3 * k.C + c] == 0.0);
  }
  const auto f = run_encoder<float>(k);
  CHECK(rel_err(f.dwte, r.dwte) < 1e-5);
  CHECK(rel_err(f.dwpe, r.dwpe) < 1e-5);
}

// A token repeated many times sums its rows of dout into one row of dwte. Without atomics the sum runs in row
// order, so in float it equals a plain sequential sum bit for bit, and a second run gives the same bits.
TEST_CASE("rows kernels: encoder backward accumulates repeated tokens deterministically") {
  const int B = 4, T = 16, C = 40, V = 3, N = B * T;
  std::vector<int> tokens(N);
  for (int n = 0; n < N; ++n) tokens[n] = (n * 7) % 5 == 0 ? 2 : (n % 3 == 0 ? 1 : 0);
  const Vec dout_d = random_vec(N * C, 51, -1e3, 1e3), dwte0_d = random_vec(V * C, 52);
  std::vector<float> dout(dout_d.begin(), dout_d.end()), expect(dwte0_d.begin(), dwte0_d.end());
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) expect[tokens[n] * C + c] += dout[n * C + c];

  auto tok = to_tokens(tokens);
  auto g = to_view<float>(dout_d);
  Vec runs[2];
  for (auto& run : runs) {
    auto dwte = to_view<float>(dwte0_d), dwpe = to_view<float>(Vec(T * C));
    kernels::encoder_backward<float>(dwte, dwpe, g, tok, B, T, C);
    run = to_vec(dwte);
  }
  int mismatches = 0;
  for (int i = 0; i < V * C; ++i) mismatches += runs[0][i] != double(expect[i]) || runs[1][i] != runs[0][i];
  CHECK(mismatches == 0);
}

TEST_CASE("rows kernels: encoder skips out-of-range tokens") {
  const int B = 1, T = 3, C = 5, V = 2;
  const Vec wte = random_vec(V * C, 61), wpe = random_vec(T * C, 62), dout = random_vec(T * C, 63);
  auto tok = to_tokens({1, -1, 2});
  auto out = to_view<double>(Vec(T * C)), dwte = to_view<double>(Vec(V * C)), dwpe = to_view<double>(Vec(T * C));
  kernels::encoder_forward<double>(out, tok, to_view<double>(wte), to_view<double>(wpe), B, T, C);
  kernels::encoder_backward<double>(dwte, dwpe, to_view<double>(dout), tok, B, T, C);
  const Vec o = to_vec(out), dw = to_vec(dwte);
  for (int c = 0; c < C; ++c) {
    CHECK(o[c] == wte[C + c] + wpe[c]);
    CHECK(o[C + c] == wpe[C + c]);
    CHECK(o[2 * C + c] == wpe[2 * C + c]);
    CHECK(dw[c] == 0.0);
    CHECK(dw[C + c] == dout[c]);
  }
}

TEST_CASE("rows kernels: layernorm forward matches the reference") {
  const LayerNormCase k;
  const auto r = run_layernorm<double>(k);
  Vec ref(k.N * k.C), ref_mean(k.N), ref_rstd(k.N);
  for (int n = 0; n < k.N; ++n) {
    double m = 0, var = 0;
    for (int c = 0; c < k.C; ++c) m += k.inp[n * k.C + c] / k.C;
    for (int c = 0; c < k.C; ++c) var += (k.inp[n * k.C + c] - m) * (k.inp[n * k.C + c] - m) / k.C;
    ref_mean[n] = m;
    ref_rstd[n] = 1.0 / std::sqrt(var + 1e-5);
    for (int c = 0; c < k.C; ++c) ref[n * k.C + c] = (k.inp[n * k.C + c] - m) * ref_rstd[n] * k.w[c] + k.b[c];
  }
  CHECK(rel_err(r.out, ref) < 1e-12);
  CHECK(rel_err(r.mean, ref_mean) < 1e-12);
  CHECK(rel_err(r.rstd, ref_rstd) < 1e-12);
  const auto f = run_layernorm<float>(k);
  CHECK(rel_err(f.out, r.out) < 1e-5);
  CHECK(rel_err(f.rstd, r.rstd) < 1e-5);
}

TEST_CASE("rows kernels: layernorm backward matches finite differences") {
  LayerNormCase k;
  const auto r = run_layernorm<double>(k);
  auto loss = [&] { return dot(run_layernorm<double>(k).out, k.R); };
  CHECK(rel_err(r.dinp, fd_grad(k.inp, loss)) < 1e-6);
  CHECK(rel_err(r.dw, fd_grad(k.w, loss)) < 1e-6);
  CHECK(rel_err(r.db, fd_grad(k.b, loss)) < 1e-6);
  const auto f = run_layernorm<float>(k);
  CHECK(rel_err(f.dinp, r.dinp) < 1e-5);
  CHECK(rel_err(f.dw, r.dw) < 1e-5);
  CHECK(rel_err(f.db, r.db) < 1e-5);
}

TEST_CASE("rows kernels: linear forward matches the reference, with and without bias") {
  for (bool with_bias : {true, false}) {
    CAPTURE(with_bias);
    LinearCase k;
    k.with_bias = with_bias;
    const auto r = run_linear<double>(k);
    Vec ref(k.N * k.OC);
    for (int n = 0; n < k.N; ++n)
      for (int o = 0; o < k.OC; ++o) {
        double s = with_bias ? k.b[o] : 0.0;
        for (int c = 0; c < k.C; ++c) s += k.inp[n * k.C + c] * k.w[o * k.C + c];
        ref[n * k.OC + o] = s;
      }
    CHECK(rel_err(r.out, ref) < 1e-12);
    CHECK(rel_err(run_linear<float>(k).out, r.out) < 1e-5);
  }
}

TEST_CASE("rows kernels: linear backward matches finite differences") {
  for (bool with_bias : {true, false}) {
    CAPTURE(with_bias);
    LinearCase k;
    k.with_bias = with_bias;
    const auto r = run_linear<double>(k);
    auto loss = [&] { return dot(run_linear<double>(k).out, k.R); };
    CHECK(rel_err(r.dinp, fd_grad(k.inp, loss)) < 1e-6);
    CHECK(rel_err(r.dw, fd_grad(k.w, loss)) < 1e-6);
    if (with_bias) CHECK(rel_err(r.db, fd_grad(k.b, loss)) < 1e-6);
    const auto f = run_linear<float>(k);
    CHECK(rel_err(f.dinp, r.dinp) < 1e-5);
    CHECK(rel_err(f.dw, r.dw) < 1e-5);
    if (with_bias) CHECK(rel_err(f.db, r.db) < 1e-5);
  }
}

// Tensor parallelism's overlap (nn/tensor_parallel.hpp) runs the two halves apart, the weight half later: each
// half writes only its own buffers, and together, in either order, they give linear_backward's bits, for a plain
// (N,OC) gradient and for a column slice of a wider one.
TEST_CASE("rows kernels: linear backward's input and weight halves are linear_backward, bitwise") {
  const LinearCase k;
  const int ld = k.OC + 6, at = 4;  // dout's columns [at, at + OC) of rows of width ld
  const Vec wide = random_vec(k.N * ld, 28);
  for (bool with_bias : {true, false})
    for (bool slice : {false, true})
      for (bool weight_first : {false, true}) {
        CAPTURE(with_bias);
        CAPTURE(slice);
        CAPTURE(weight_first);
        const auto dout = to_view<float>(slice ? wide : k.R);
        const auto inp = to_view<float>(k.inp), w = to_view<float>(k.w);
        auto buffers = [&] {
          return std::array<View1<float>, 3>{to_view<float>(k.dinp0), to_view<float>(k.dw0),
                                             with_bias ? to_view<float>(k.db0) : View1<float>()};
        };
        const auto whole = buffers(), halves = buffers();
        const int width = slice ? ld : k.OC, first = slice ? at : 0;
        kernels::linear_backward<float>(whole[0], whole[1], whole[2], dout, inp, w, k.N, k.C, k.OC, width, first);
        auto input_half = [&] {
          if (slice) kernels::linear_backward_input<float>(halves[0], dout, w, k.N, k.C, k.OC, ld, at);
          else kernels::linear_backward_input<float>(halves[0], dout, w, k.N, k.C, k.OC);
        };
        auto weight_half = [&] {
          if (slice) kernels::linear_backward_weight<float>(halves[1], halves[2], dout, inp, k.N, k.C, k.OC, ld, at);
          else kernels::linear_backward_weight<float>(halves[1], halves[2], dout, inp, k.N, k.C, k.OC);
        };
        if (weight_first) {
          weight_half();
          CHECK(to_vec(halves[0]) == to_vec(to_view<float>(k.dinp0)));  // the input gradient untouched
          input_half();
        } else {
          input_half();
          CHECK(to_vec(halves[1]) == to_vec(to_view<float>(k.dw0)));  // the weight gradient untouched
          weight_half();
        }
        for (int i = 0; i < 3; ++i) CHECK(to_vec(halves[i]) == to_vec(whole[i]));
      }
}

TEST_CASE("rows kernels: gelu forward matches the tanh formula") {
  const GeluCase k;
  const auto r = run_gelu<double>(k);
  Vec ref(k.N);
  for (int i = 0; i < k.N; ++i) ref[i] = gelu_reference(k.inp[i]);
  CHECK(rel_err(r.out, ref) < 1e-12);
  CHECK(rel_err(run_gelu<float>(k).out, r.out) < 1e-5);
}

TEST_CASE("rows kernels: gelu backward matches finite differences") {
  GeluCase k;
  const auto r = run_gelu<double>(k);
  CHECK(rel_err(r.dinp, fd_grad(k.inp, [&] { return dot(run_gelu<double>(k).out, k.R); })) < 1e-6);
  CHECK(rel_err(run_gelu<float>(k).dinp, r.dinp) < 1e-5);
}

TEST_CASE("rows kernels: gelu float stays finite and exact at the extremes") {
  const Vec x{-1e30, -1e4, -88.0, -30.0, -10.0, -0.0, 0.0, 1e-30, 10.0, 30.0, 1e4, 1e30};
  const Vec out = run_gelu<float>(GeluCase{int(x.size()), x, Vec(x.size(), 1.0), Vec(x.size(), 0.0)}).out;
  for (std::size_t i = 0; i < x.size(); ++i) {
    CAPTURE(x[i]);
    CHECK(std::isfinite(out[i]));
    CHECK(std::fabs(out[i] - float(gelu_reference(x[i]))) <= 1e-6 * std::max(1.0, std::fabs(x[i])));
  }
}

TEST_CASE("rows kernels: residual forward and backward") {
  const int N = 37;
  const Vec a = random_vec(N, 71), b = random_vec(N, 72), g = random_vec(N, 73);
  const Vec da0 = random_vec(N, 74), db0 = random_vec(N, 75);
  for (int prec = 0; prec < 2; ++prec) {
    auto run = [&](auto zero) {
      using T = decltype(zero);
      auto out = to_view<T>(Vec(N)), da = to_view<T>(da0), db = to_view<T>(db0), dst = to_view<T>(da0);
      auto gv = to_view<T>(g);
      kernels::residual_forward<T>(out, to_view<T>(a), to_view<T>(b), N);
      kernels::residual_backward<T>(da, db, gv, N);
      kernels::accumulate<T>(dst, gv, N);
      const Vec o = to_vec(out), ga = minus(to_vec(da), da0), gb = minus(to_vec(db), db0), gd = minus(to_vec(dst), da0);
      const double tol = sizeof(T) == 8 ? 1e-12 : 1e-6;
      for (int i = 0; i < N; ++i) {
        CHECK(std::fabs(o[i] - (a[i] + b[i])) < tol);
        CHECK(std::fabs(ga[i] - g[i]) < tol);
        CHECK(std::fabs(gb[i] - g[i]) < tol);
        CHECK(std::fabs(gd[i] - g[i]) < tol);
      }
    };
    if (prec == 0) run(0.0); else run(0.0f);
  }
}

TEST_CASE("rows kernels: crossentropy forward matches the reference; forward-only leaves logits alone") {
  const CrossEntropyCase k;
  const Vec ref = crossentropy_reference(k.logits, k.targets, k.N, k.V);
  CHECK(rel_err(run_crossentropy<double>(k).losses, ref) < 1e-12);
  CHECK(run_crossentropy<double>(k).losses[3] == 0.0);  // the ignored row
  auto logits = to_view<double>(k.logits), losses = to_view<double>(Vec(k.N));
  kernels::crossentropy_forward<double>(losses, logits, to_tokens(k.targets), k.N, k.V);
  CHECK(rel_err(to_vec(losses), ref) < 1e-12);
  CHECK(to_vec(logits) == k.logits);
  CHECK(rel_err(run_crossentropy<float>(k).losses, ref) < 1e-5);
}

TEST_CASE("rows kernels: crossentropy dlogits match finite differences of the mean loss") {
  CrossEntropyCase k;
  const auto r = run_crossentropy<double>(k);
  const Vec fd = fd_grad(k.logits, [&] {
    auto logits = to_view<double>(k.logits), losses = to_view<double>(Vec(k.N));
    kernels::crossentropy_forward<double>(losses, logits, to_tokens(k.targets), k.N, k.V);
    return mean(to_vec(losses));
  });
  CHECK(rel_err(r.dlogits, fd) < 1e-6);
  for (int v = 0; v < k.V; ++v) CHECK(r.dlogits[3 * k.V + v] == 0.0);  // the ignored row
  CHECK(rel_err(run_crossentropy<float>(k).dlogits, r.dlogits) < 1e-5);
}

TEST_CASE("rows kernels: crossentropy is stable for large logits and ignores out-of-range targets") {
  CrossEntropyCase k;
  // Rounded to float first, so that the float run sees the same logits as the double one.
  for (int i = 0; i < k.N * k.V; ++i) k.logits[i] = double(float(1000.0 * (i % 3) - 900.0 + k.logits[i]));
  k.targets = {3, 21, 0, -7, 100000, 2};
  const Vec ref = crossentropy_reference(k.logits, k.targets, k.N, k.V);
  const auto d = run_crossentropy<double>(k);
  const auto f = run_crossentropy<float>(k);
  CHECK(rel_err(d.losses, ref) < 1e-12);
  for (int n = 0; n < k.N; ++n) {
    CAPTURE(n);
    CHECK(std::isfinite(f.losses[n]));
    CHECK(std::fabs(f.losses[n] - ref[n]) <= 1e-4 * std::max(1.0, ref[n]));
  }
  for (double g : f.dlogits) CHECK(std::isfinite(g));
  CHECK(rel_err(f.dlogits, d.dlogits) < 1e-5);
}

TEST_CASE("rows kernels: exp_fast<float> agrees with exp") {
  double worst = 0;
  for (double x = -87.0; x <= 88.0; x += 0.0137) {
    const double e = std::exp(double(float(x)));
    worst = std::max(worst, std::fabs(kernels::detail::exp_fast(float(x)) - e) / e);
  }
  CHECK(worst < 1.5e-7);  // about one float ulp; measured 7.5e-8
  CHECK(kernels::detail::exp_fast(0.0f) == 1.0f);
  CHECK(kernels::detail::exp_fast(-1e4f) == 0.0f);
  CHECK(kernels::detail::exp_fast(-std::numeric_limits<float>::infinity()) == 0.0f);
#if !defined(KOKKOS_ENABLE_CUDA)  // the host polynomial saturates at exp(88); the library exp gives inf
  CHECK(std::isfinite(kernels::detail::exp_fast(std::numeric_limits<float>::infinity())));
#endif
  CHECK(std::isnan(kernels::detail::exp_fast(std::numeric_limits<float>::quiet_NaN())));
}


namespace {
template <class F> double median_ms(F&& f, int reps = 7) {
  std::vector<double> ms;
  for (int rep = 0; rep <= reps; ++rep) {
    Kokkos::fence();
    const auto t0 = std::chrono::steady_clock::now();
    f();
    Kokkos::fence();
    if (rep > 0) ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}
}  // namespace

TEST_CASE("rows kernels: timing at small.yaml sizes") {
  const int N = 2048, C = 256, OC = 1024, V = 4096, M = 8 << 20;
  auto big_a = to_view<float>(random_vec(M, 81, -4, 4)), big_b = to_view<float>(random_vec(M, 82));
  View1<float> big_out("out", M);
  const double gelu_f = median_ms([&] { kernels::gelu_forward<float>(big_out, big_a, M); });
  const double gelu_b = median_ms([&] { kernels::gelu_backward<float>(big_out, big_a, big_b, M); });
  const double res_f = median_ms([&] { kernels::residual_forward<float>(big_out, big_a, big_b, M); });
  std::printf("gelu over 8M floats: forward %.2f ms, backward %.2f ms; residual forward %.2f ms\n", gelu_f, gelu_b,
              res_f);

  auto inp = to_view<float>(random_vec(N * C, 83)), w = to_view<float>(random_vec(OC * C, 84));
  auto bias = to_view<float>(random_vec(OC, 85)), dout = to_view<float>(random_vec(N * OC, 86));
  View1<float> out("out", N * OC), dinp("dinp", N * C), dw("dw", OC * C), db("db", OC);
  const double flop = 2.0 * N * C * OC;
  const double lin_f = median_ms([&] { kernels::linear_forward<float>(out, inp, w, bias, N, C, OC); });
  const double lin_g = median_ms([&] {
    gemm<float>(Trans::N, Trans::T, N, OC, C, 1.0f, inp.data(), C, w.data(), C, 0.0f, out.data(), OC);
  });
  const double lin_b = median_ms([&] { kernels::linear_backward<float>(dinp, dw, db, dout, inp, w, N, C, OC); });
  std::printf("linear N=%d C=%d OC=%d: forward %.2f ms = %.1f GFLOP/s (GEMM alone %.2f ms = %.1f GFLOP/s), "
              "backward %.2f ms = %.1f GFLOP/s\n",
              N, C, OC, lin_f, flop / (lin_f * 1e6), lin_g, flop / (lin_g * 1e6), lin_b, 2 * flop / (lin_b * 1e6));

  View1<float> mean("mean", N), rstd("rstd", N), lnw("w", C), lnb("b", C), dlnw("dw", C), dlnb("db", C);
  Kokkos::deep_copy(lnw, 1.0f);
  View1<float> ln_out("out", N * C);
  const double ln_f = median_ms([&] { kernels::layernorm_forward<float>(ln_out, mean, rstd, inp, lnw, lnb, N, C); });
  const double ln_b = median_ms(
      [&] { kernels::layernorm_backward<float>(dinp, dlnw, dlnb, ln_out, inp, lnw, mean, rstd, N, C); });
  std::printf("layernorm N=%d C=%d: forward %.3f ms, backward %.3f ms\n", N, C, ln_f, ln_b);

  std::vector<int> tok_h(N);
  for (int n = 0; n < N; ++n) tok_h[n] = (n * 7919) % V;
  auto tok = to_tokens(tok_h);
  auto wte = to_view<float>(random_vec(V * C, 87)), wpe = to_view<float>(random_vec(256 * C, 88));
  View1<float> dwte("dwte", V * C), dwpe("dwpe", 256 * C);
  const double enc_f = median_ms([&] { kernels::encoder_forward<float>(ln_out, tok, wte, wpe, 8, 256, C); });
  const double enc_b = median_ms([&] { kernels::encoder_backward<float>(dwte, dwpe, ln_out, tok, 8, 256, C); });
  std::printf("encoder B=8 T=256 C=%d: forward %.3f ms, backward %.3f ms\n", C, enc_f, enc_b);

  View1<float> losses("losses", N);
  const double ce_fb = median_ms([&] {
    Kokkos::deep_copy(big_out, big_a);
    kernels::crossentropy_forward_backward<float>(big_out, losses, tok, N, V, 1.0f / N);
  });
  const double copy = median_ms([&] { Kokkos::deep_copy(big_out, big_a); });
  const double ce_f = median_ms([&] { kernels::crossentropy_forward<float>(losses, big_a, tok, N, V); });
  std::printf("crossentropy N=%d V=%d: fused forward+backward %.2f ms, forward only %.2f ms\n", N, V, ce_fb - copy,
              ce_f);
  CHECK(std::isfinite(to_vec(losses)[0]));
}
