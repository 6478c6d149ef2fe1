// The row-wise GPT-2 kernels (encoder, layernorm, linear, gelu, residual, crossentropy) against plain double
// references, their backward passes against central finite differences of L = sum(out * R) in double, and
// the float instantiations against the double ones.
//
// Backward kernels accumulate, so every gradient buffer starts filled with random values G0 and the analytic
// gradient is read back as (result - G0): that checks the += as well as the values.
#include "mpi_test.hpp"

#include "fsdpp/nn/kernels/crossentropy.hpp"
#include "fsdpp/nn/kernels/encoder.hpp"
#include "fsdpp/nn/kernels/gelu.hpp"
#include "fsdpp/nn/kernels/layernorm.hpp"
#include "fsdpp/nn/kernels/linear.hpp"
#include "fsdpp/nn/kernels/residual.hpp"
#include "fsdpp/nn/kernels/rmsnorm.hpp"
#include "fsdpp/nn/kernels/softmax.hpp"
#include "fsdpp/nn/kernels/team.hpp"
#include "fsdpp/tensor/matmul.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

using namespace fsdpp;
using Vec = std::vector<double>;

namespace {

Vec random_vec(std::size_t n, unsigned seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

template <class T> View1<T> to_view(const Vec& h) {
  View1<T> v("test", h.size());
  auto m = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < h.size(); ++i) m(i) = static_cast<T>(h[i]);
  Kokkos::deep_copy(v, m);
  return v;
}

View1<std::int32_t> to_tokens(const std::vector<int>& h) {
  View1<std::int32_t> v("tokens", h.size());
  auto m = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < h.size(); ++i) m(i) = h[i];
  Kokkos::deep_copy(v, m);
  return v;
}

template <class T> Vec to_vec(const View1<T>& v) {
  auto m = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(m, v);
  return Vec(m.data(), m.data() + m.extent(0));
}

Vec minus(const Vec& a, const Vec& b) {
  Vec d(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// max |a - ref| / max |ref|: a relative error of the tensor, not of each element (some gradients are ~0).
double rel_err(const Vec& a, const Vec& ref) {
  REQUIRE(a.size() == ref.size());
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs(a[i] - ref[i]));
    den = std::max(den, std::fabs(ref[i]));
  }
  return den > 0 ? num / den : num;
}

// Central differences of loss() with respect to every element of x, step 1e-6 relative.
Vec fd_grad(Vec& x, const std::function<double()>& loss) {
  Vec g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i], h = 1e-6 * std::max(1.0, std::fabs(saved));
    x[i] = saved + h;
    const double lp = loss();
    x[i] = saved - h;
    const double lm = loss();
    x[i] = saved;
    g[i] = (lp - lm) / (2 * h);
  }
  return g;
}

// ------------------------------------------------------------------------------------------------ encoder
struct EncoderCase {
  int B = 2, T = 3, C = 19, V = 5, maxT = 4;
  std::vector<int> tokens{3, 1, 3, 0, 3, 1};  // token 3 three times, 1 twice, 2 and 4 never
  Vec wte = random_vec(V * C, 1), wpe = random_vec(maxT * C, 2), R = random_vec(B * T * C, 3);
  Vec dwte0 = random_vec(V * C, 4), dwpe0 = random_vec(maxT * C, 5);
};
struct EncoderResult { Vec out, dwte, dwpe; };

template <class T> EncoderResult run_encoder(const EncoderCase& k) {
  auto out = to_view<T>(Vec(k.B * k.T * k.C));
  auto tok = to_tokens(k.tokens);
  auto dwte = to_view<T>(k.dwte0), dwpe = to_view<T>(k.dwpe0);
  kernels::encoder_forward<T>(out, tok, to_view<T>(k.wte), to_view<T>(k.wpe), k.B, k.T, k.C);
  kernels::encoder_backward<T>(dwte, dwpe, to_view<T>(k.R), tok, k.B, k.T, k.C);
  return {to_vec(out), minus(to_vec(dwte), k.dwte0), minus(to_vec(dwpe), k.dwpe0)};
}

// ---------------------------------------------------------------------------------------------- layernorm
struct LayerNormCase {
  int N = 3, C = 19;
  Vec inp = random_vec(N * C, 11, -2, 3), w = random_vec(C, 12, 0.5, 1.5), b = random_vec(C, 13);
  Vec R = random_vec(N * C, 14), dinp0 = random_vec(N * C, 15), dw0 = random_vec(C, 16), db0 = random_vec(C, 17);
};
struct LayerNormResult { Vec out, mean, rstd, dinp, dw, db; };

template <class T> LayerNormResult run_layernorm(const LayerNormCase& k) {
  auto out = to_view<T>(Vec(k.N * k.C)), mean = to_view<T>(Vec(k.N)), rstd = to_view<T>(Vec(k.N));
  auto inp = to_view<T>(k.inp), w = to_view<T>(k.w);
  auto dinp = to_view<T>(k.dinp0), dw = to_view<T>(k.dw0), db = to_view<T>(k.db0);
  kernels::layernorm_forward<T>(out, mean, rstd, inp, w, to_view<T>(k.b), k.N, k.C);
  kernels::layernorm_backward<T>(dinp, dw, db, to_view<T>(k.R), inp, w, mean, rstd, k.N, k.C);
  return {to_vec(out), to_vec(mean), to_vec(rstd),
          minus(to_vec(dinp), k.dinp0), minus(to_vec(dw), k.dw0), minus(to_vec(db), k.db0)};
}

// ------------------------------------------------------------------------------------------------- linear
struct LinearCase {
  int N = 5, C = 7, OC = 19;
  bool with_bias = true;
  Vec inp = random_vec(N * C, 21), w = random_vec(OC * C, 22), b = random_vec(OC, 23), R = random_vec(N * OC, 24);
  Vec dinp0 = random_vec(N * C, 25), dw0 = random_vec(OC * C, 26), db0 = random_vec(OC, 27);
};
struct LinearResult { Vec out, dinp, dw, db; };

template <class T> LinearResult run_linear(const LinearCase& k) {
  auto out = to_view<T>(Vec(k.N * k.OC));
  auto inp = to_view<T>(k.inp), w = to_view<T>(k.w);
  auto bias = k.with_bias ? to_view<T>(k.b) : View1<T>();
  auto dinp = to_view<T>(k.dinp0), dw = to_view<T>(k.dw0), db = k.with_bias ? to_view<T>(k.db0) : View1<T>();
  kernels::linear_forward<T>(out, inp, w, bias, k.N, k.C, k.OC);
  kernels::linear_backward<T>(dinp, dw, db, to_view<T>(k.R), inp, w, k.N, k.C, k.OC);
  return {to_vec(out), minus(to_vec(dinp), k.dinp0), minus(to_vec(dw), k.dw0),
          k.with_bias ? minus(to_vec(db), k.db0) : Vec()};
}

// --------------------------------------------------------------------------------------------------- gelu
struct GeluCase {
  int N = 203;
  Vec inp = random_vec(N, 31, -5, 5), R = random_vec(N, 32), dinp0 = random_vec(N, 33);
};
struct GeluResult { Vec out, dinp; };

template <class T> GeluResult run_gelu(const GeluCase& k) {
  auto out = to_view<T>(Vec(k.N)), inp = to_view<T>(k.inp), dinp = to_view<T>(k.dinp0);
  kernels::gelu_forward<T>(out, inp, k.N);
  kernels::gelu_backward<T>(dinp, inp, to_view<T>(k.R), k.N);
  return {to_vec(out), minus(to_vec(dinp), k.dinp0)};
}

double gelu_reference(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / std::acos(-1.0)) * (x + 0.044715 * x * x * x)));
}

// ------------------------------------------------------------------------------------------- crossentropy
struct CrossEntropyCase {
  int N = 6, V = 21;
  std::vector<int> targets{3, 20, 0, -1, 7, 3};  // row 3 is ignored
  Vec logits = random_vec(N * V, 41, -3, 3);
};
struct CrossEntropyResult { Vec losses, dlogits; };

// dlogits for the mean over the N rows.
template <class T> CrossEntropyResult run_crossentropy(const CrossEntropyCase& k) {
  auto logits = to_view<T>(k.logits), losses = to_view<T>(Vec(k.N));
  kernels::crossentropy_forward_backward<T>(logits, losses, to_tokens(k.targets), k.N, k.V, T(1) / T(k.N));
  return {to_vec(losses), to_vec(logits)};
}

Vec crossentropy_reference(const Vec& logits, const std::vector<int>& targets, int N, int V) {
  Vec loss(N, 0.0);
  for (int n = 0; n < N; ++n) {
    if (targets[n] < 0 || targets[n] >= V) continue;
    const double* x = logits.data() + n * V;
    const double mx = *std::max_element(x, x + V);
    double sum = 0;
    for (int v = 0; v < V; ++v) sum += std::exp(x[v] - mx);
    loss[n] = std::log(sum) + mx - x[targets[n]];
  }
  return loss;
}

double mean(const Vec& v) { return std::accumulate(v.begin(), v.end(), 0.0) / v.size(); }

}  // namespace

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


// ------------------------------------------------------------------------------ portable (team) kernels
// The same kernels on both paths (team.hpp), at sizes past the portable path's fixed shapes: rows longer than
// team::kSlots columns and more rows than two column-sum chunks. Exact kernels (gathers, bias add, the row-order
// dwte/dwpe) must agree bitwise; reductions within 1e-6 relative (float) of the tuned path. The existing tests
// above check both paths against references and finite differences: ctest unit_portable_np1 reruns them with
// FSDPP_KERNELS=portable.
namespace {
template <class R, class F> std::pair<R, R> on_both_paths(F&& run) {
  R tuned, portable;
  {
    kernels::ScopedKernelPath path(false);
    tuned = run();
  }
  {
    kernels::ScopedKernelPath path(true);
    portable = run();
  }
  return {tuned, portable};
}
constexpr double kPathTolerance = 1e-6;
}  // namespace

TEST_CASE("portable kernels: encoder and linear bias are bitwise the tuned kernels") {
  EncoderCase e;
  e.B = 5, e.T = 37, e.C = 300, e.V = 70, e.maxT = 40;
  e.tokens.resize(e.B * e.T);
  for (int i = 0; i < e.B * e.T; ++i) e.tokens[i] = (i * 7) % e.V;
  e.tokens[3] = -1;
  e.wte = random_vec(e.V * e.C, 1), e.wpe = random_vec(e.maxT * e.C, 2), e.R = random_vec(e.B * e.T * e.C, 3);
  e.dwte0 = random_vec(e.V * e.C, 4), e.dwpe0 = random_vec(e.maxT * e.C, 5);
  const auto enc = on_both_paths<EncoderResult>([&] { return run_encoder<float>(e); });
  CHECK(enc.first.out == enc.second.out);
  CHECK(enc.first.dwte == enc.second.dwte);
  CHECK(enc.first.dwpe == enc.second.dwpe);

  LinearCase l;
  l.N = 150, l.C = 9, l.OC = 301;
  l.inp = random_vec(l.N * l.C, 21), l.w = random_vec(l.OC * l.C, 22), l.b = random_vec(l.OC, 23);
  l.R = random_vec(l.N * l.OC, 24), l.dinp0 = random_vec(l.N * l.C, 25), l.dw0 = random_vec(l.OC * l.C, 26);
  l.db0 = random_vec(l.OC, 27);
  const auto lin = on_both_paths<LinearResult>([&] { return run_linear<float>(l); });
  CHECK(lin.first.out == lin.second.out);
  CHECK(lin.first.dinp == lin.second.dinp);
  CHECK(lin.first.dw == lin.second.dw);
  CHECK(rel_err(lin.second.db, lin.first.db) < kPathTolerance);
}

TEST_CASE("portable kernels: layernorm matches the tuned kernel") {
  LayerNormCase k;
  k.N = 150, k.C = 300;
  k.inp = random_vec(k.N * k.C, 11, -2, 3), k.w = random_vec(k.C, 12, 0.5, 1.5), k.b = random_vec(k.C, 13);
  k.R = random_vec(k.N * k.C, 14), k.dinp0 = random_vec(k.N * k.C, 15), k.dw0 = random_vec(k.C, 16);
  k.db0 = random_vec(k.C, 17);
  for (int dtype = 0; dtype < 2; ++dtype) {
    CAPTURE(dtype);
    const auto r = on_both_paths<LayerNormResult>([&] { return dtype ? run_layernorm<double>(k) : run_layernorm<float>(k); });
    const double tol = dtype ? 1e-13 : kPathTolerance;
    CHECK(rel_err(r.second.out, r.first.out) < tol);
    CHECK(rel_err(r.second.mean, r.first.mean) < tol);
    CHECK(rel_err(r.second.rstd, r.first.rstd) < tol);
    CHECK(rel_err(r.second.dinp, r.first.dinp) < tol);
    CHECK(rel_err(r.second.dw, r.first.dw) < tol);
    CHECK(rel_err(r.second.db, r.first.db) < tol);
  }
}

TEST_CASE("portable kernels: crossentropy (online softmax) matches the tuned kernel") {
  CrossEntropyCase k;
  k.N = 7, k.V = 1000;
  k.targets = {3, 999, 0, -1, 512, 3, 1000};
  k.logits = random_vec(k.N * k.V, 41, -8, 8);
  // An increasing row makes every slot rescale its running sum at each step.
  for (int v = 0; v < k.V; ++v) k.logits[2 * k.V + v] = 0.01 * v;
  for (int dtype = 0; dtype < 2; ++dtype) {
    CAPTURE(dtype);
    const double tol = dtype ? 1e-13 : kPathTolerance;
    const auto r = on_both_paths<CrossEntropyResult>(
        [&] { return dtype ? run_crossentropy<double>(k) : run_crossentropy<float>(k); });
    CHECK(rel_err(r.second.losses, r.first.losses) < tol);
    CHECK(rel_err(r.second.dlogits, r.first.dlogits) < tol);
    const auto forward_only = on_both_paths<Vec>([&] {
      auto logits = to_view<float>(k.logits), losses = to_view<float>(Vec(k.N));
      kernels::crossentropy_forward<float>(losses, logits, to_tokens(k.targets), k.N, k.V);
      return to_vec(losses);
    });
    CHECK(rel_err(forward_only.second, forward_only.first) < kPathTolerance);
  }
}

TEST_CASE("portable kernels: attention softmax forward and backward match the tuned kernels") {
  const int rows = 2 * 3 * 300, T = 300;  // (B=2, NH=3, T, T)
  const Vec scores = random_vec(std::size_t(rows) * T, 51, -6, 6), dprobs = random_vec(std::size_t(rows) * T, 52);
  const auto r = on_both_paths<std::pair<Vec, Vec>>([&] {
    auto att = to_view<float>(scores), datt = to_view<float>(dprobs);
    kernels::attention_softmax_forward(att.data(), rows, T);
    kernels::attention_softmax_backward(datt.data(), static_cast<const float*>(att.data()), rows, T);
    return std::make_pair(to_vec(att), to_vec(datt));
  });
  CHECK(rel_err(r.second.first, r.first.first) < kPathTolerance);
  CHECK(rel_err(r.second.second, r.first.second) < kPathTolerance);
  for (int t = 0; t < T; ++t)
    for (int t2 = t + 1; t2 < T; ++t2) REQUIRE(r.second.first[std::size_t(t) * T + t2] == 0.0);
}

TEST_CASE("portable kernels: column sums and team sums are launch-shaped, not data-shaped") {
  // N and C that are not multiples of the chunk and slot counts, and N below one chunk.
  for (const auto& [N, C] : std::vector<std::pair<int, int>>{{1, 1}, {63, 257}, {200, 3}}) {
    CAPTURE(N);
    CAPTURE(C);
    const Vec g = random_vec(std::size_t(N) * C, 61);
    Vec ref(C, 0.0);
    for (int n = 0; n < N; ++n)
      for (int c = 0; c < C; ++c) ref[c] += g[std::size_t(n) * C + c];
    auto dout = to_view<double>(g);
    auto out = to_view<double>(Vec(C, 0.0));
    const double* gp = dout.data();
    kernels::team::column_sum<double>(out, N, C, KOKKOS_LAMBDA(int n, int c) { return gp[std::int64_t(n) * C + c]; });
    CHECK(rel_err(to_vec(out), ref) < 1e-14);
  }
}


// The portable kernels promise results independent of the launch (team size, thread count, backend). This
// runs each of them on fixed inputs, twice, and requires bitwise-equal outputs. With FSDPP_KERNEL_DIGESTS=FILE
// it also writes one "kernel output digest" line per output: share/scripts/ci-openmp compares the file of a
// Serial build with that of an OpenMP build run with 2 threads and teams of 2, which must match bitwise.
namespace {
std::uint64_t digest(const Vec& v) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the bytes of the values
  for (double x : v) {
    unsigned char b[sizeof x];
    std::memcpy(b, &x, sizeof x);
    for (unsigned char c : b) h = (h ^ c) * 1099511628211ull;
  }
  return h;
}

std::vector<std::pair<std::string, Vec>> portable_kernel_outputs() {
  kernels::ScopedKernelPath path(true);
  std::vector<std::pair<std::string, Vec>> r;
  LayerNormCase ln;
  ln.N = 150, ln.C = 300;
  ln.inp = random_vec(ln.N * ln.C, 11, -2, 3), ln.w = random_vec(ln.C, 12), ln.b = random_vec(ln.C, 13);
  ln.R = random_vec(ln.N * ln.C, 14), ln.dinp0 = random_vec(ln.N * ln.C, 15);
  ln.dw0 = random_vec(ln.C, 16), ln.db0 = random_vec(ln.C, 17);
  const auto l = run_layernorm<float>(ln);
  r.insert(r.end(), {{"layernorm_out", l.out}, {"layernorm_rstd", l.rstd}, {"layernorm_dinp", l.dinp},
                     {"layernorm_dweight", l.dw}, {"layernorm_dbias", l.db}});
  {
    auto out = to_view<float>(Vec(ln.N * ln.C)), rstd = to_view<float>(Vec(ln.N)), dinp = to_view<float>(ln.dinp0);
    auto dw = to_view<float>(Vec(ln.C)), inp = to_view<float>(ln.inp), w = to_view<float>(ln.w);
    kernels::rmsnorm_forward<float>(out, rstd, inp, w, ln.N, ln.C, 1e-5);
    kernels::rmsnorm_backward<float>(dinp, dw, to_view<float>(ln.R), inp, w, rstd, ln.N, ln.C);
    r.insert(r.end(), {{"rmsnorm_out", to_vec(out)}, {"rmsnorm_dinp", to_vec(dinp)}, {"rmsnorm_dweight", to_vec(dw)}});
  }
  CrossEntropyCase ce;
  ce.N = 5, ce.V = 1000, ce.targets = {3, 999, 0, -1, 512}, ce.logits = random_vec(ce.N * ce.V, 41, -8, 8);
  const auto c = run_crossentropy<float>(ce);
  r.insert(r.end(), {{"crossentropy_loss", c.losses}, {"crossentropy_dlogits", c.dlogits}});
  {
    const int rows = 2 * 300, T = 300;
    auto att = to_view<float>(random_vec(std::size_t(rows) * T, 51, -6, 6));
    auto datt = to_view<float>(random_vec(std::size_t(rows) * T, 52));
    kernels::attention_softmax_forward(att.data(), rows, T);
    kernels::attention_softmax_backward(datt.data(), static_cast<const float*>(att.data()), rows, T);
    r.insert(r.end(), {{"attention_softmax", to_vec(att)}, {"attention_softmax_backward", to_vec(datt)}});
  }
  EncoderCase e;
  e.B = 3, e.T = 37, e.C = 300, e.V = 70, e.maxT = 40;
  e.tokens.resize(e.B * e.T);
  for (int i = 0; i < e.B * e.T; ++i) e.tokens[i] = (i * 7) % e.V;
  e.wte = random_vec(e.V * e.C, 1), e.wpe = random_vec(e.maxT * e.C, 2), e.R = random_vec(e.B * e.T * e.C, 3);
  e.dwte0 = random_vec(e.V * e.C, 4), e.dwpe0 = random_vec(e.maxT * e.C, 5);
  const auto en = run_encoder<float>(e);
  r.insert(r.end(), {{"encoder_out", en.out}, {"encoder_dwte", en.dwte}, {"encoder_dwpe", en.dwpe}});
  LinearCase li;
  li.N = 150, li.C = 9, li.OC = 301;
  li.inp = random_vec(li.N * li.C, 21), li.w = random_vec(li.OC * li.C, 22), li.b = random_vec(li.OC, 23);
  li.R = random_vec(li.N * li.OC, 24), li.dinp0 = random_vec(li.N * li.C, 25), li.dw0 = random_vec(li.OC * li.C, 26);
  li.db0 = random_vec(li.OC, 27);
  const auto lo = run_linear<float>(li);
  r.insert(r.end(), {{"linear_bias_out", lo.out}, {"linear_dbias", lo.db}});
  return r;
}
}  // namespace

TEST_CASE("portable kernels: bitwise repeatable, digests for the cross-backend comparison") {
  const auto first = portable_kernel_outputs(), second = portable_kernel_outputs();
  REQUIRE(first.size() == second.size());
  for (std::size_t i = 0; i < first.size(); ++i) {
    CAPTURE(first[i].first);
    CHECK(first[i].second == second[i].second);
  }
  if (const char* file = std::getenv("FSDPP_KERNEL_DIGESTS")) {
    std::ofstream out(file);
    REQUIRE_MESSAGE(out, "cannot write FSDPP_KERNEL_DIGESTS=" << file);
    for (const auto& [name, values] : first) out << name << " " << std::hex << digest(values) << std::dec << "\n";
  }
}

// Not a pass/fail speed test: prints single-core timings at small.yaml's sizes (N = 8*256 rows, C = 256,
// V = 4096). Run with OPENBLAS_NUM_THREADS=1 (ctest sets it).
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
