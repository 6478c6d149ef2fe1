// Llama's row kernels (rmsnorm, rope, swiglu, embedding): forward against plain double references, backward
// against central finite differences of L = sum(out * R) in double, float against double. Grouped-query
// attention and RoPE inside attention are checked in test_kernels_attention.cpp.
// As in test_kernels_rows.cpp, gradient buffers start at random G0 and the analytic gradient is (result - G0),
// which checks the += as well as the values.
#include "mpi_test.hpp"
#include "test_helpers.hpp"

#include "fsdpp/nn/kernels/embedding.hpp"
#include "fsdpp/nn/kernels/rmsnorm.hpp"
#include "fsdpp/nn/kernels/rope.hpp"
#include "fsdpp/nn/kernels/swiglu.hpp"
#include "fsdpp/nn/kernels/team.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <vector>

using namespace fsdpp;
using Vec = std::vector<double>;

namespace {

using fsdpp::test::dot;
using fsdpp::test::fd_grad;
using fsdpp::test::minus;
using fsdpp::test::random_vec;
using fsdpp::test::rel_err;
using fsdpp::test::to_vec;
using fsdpp::test::to_view;

// ------------------------------------------------------------------------------------------------ rmsnorm
struct RmsCase {
  int N = 3, C = 19;
  double eps = 1e-5;
  Vec inp = random_vec(N * C, 11, -2, 3), w = random_vec(C, 12, 0.5, 1.5);
  Vec R = random_vec(N * C, 14), dinp0 = random_vec(N * C, 15), dw0 = random_vec(C, 16);
};
struct RmsResult { Vec out, rstd, dinp, dw; };

template <class T> RmsResult run_rmsnorm(const RmsCase& k) {
  auto out = to_view<T>(Vec(k.N * k.C)), rstd = to_view<T>(Vec(k.N));
  auto inp = to_view<T>(k.inp), w = to_view<T>(k.w);
  auto dinp = to_view<T>(k.dinp0), dw = to_view<T>(k.dw0);
  kernels::rmsnorm_forward<T>(out, rstd, inp, w, k.N, k.C, k.eps);
  kernels::rmsnorm_backward<T>(dinp, dw, to_view<T>(k.R), inp, w, rstd, k.N, k.C);
  return {to_vec(out), to_vec(rstd), minus(to_vec(dinp), k.dinp0), minus(to_vec(dw), k.dw0)};
}

// ---------------------------------------------------------------------------------------------------- rope
struct RopeCase {
  int B = 2, T = 5, heads = 3, hs = 6, width = 3 * 6 + 4;  // 4 trailing channels rope must not touch
  double theta = 10000.0;
  Vec x = random_vec(B * T * width, 21), R = random_vec(B * T * width, 22);
};

template <class T> Vec run_rope(const RopeCase& k, Vec x, bool backward) {
  Vec ch, sh;
  kernels::rope_table(ch, sh, k.T + 2, k.hs, k.theta);  // a table longer than T, as the model's
  auto xv = to_view<T>(x);
  if (backward)
    kernels::rope_backward<T>(xv, to_view<T>(ch), to_view<T>(sh), k.B, k.T, k.width, k.heads, k.hs);
  else
    kernels::rope_forward<T>(xv, to_view<T>(ch), to_view<T>(sh), k.B, k.T, k.width, k.heads, k.hs);
  return to_vec(xv);
}

// Hugging Face's apply_rotary_pos_emb: x * cos + rotate_half(x) * sin, cos/sin repeated over both halves.
Vec reference_rope(const RopeCase& k, const Vec& x) {
  Vec out = x;
  const int half = k.hs / 2;
  for (int b = 0; b < k.B; ++b)
    for (int t = 0; t < k.T; ++t)
      for (int h = 0; h < k.heads; ++h)
        for (int i = 0; i < k.hs; ++i) {
          const double inv_freq = 1.0 / std::pow(k.theta, 2.0 * (i % half) / k.hs);
          const std::size_t at = (static_cast<std::size_t>(b) * k.T + t) * k.width + h * k.hs;
          const double rot = i < half ? -x[at + i + half] : x[at + i - half];
          out[at + i] = x[at + i] * std::cos(t * inv_freq) + rot * std::sin(t * inv_freq);
        }
  return out;
}

// ------------------------------------------------------------------------------------------------- swiglu
struct SwigluCase {
  int n = 37;
  Vec gate = random_vec(n, 31, -4, 4), up = random_vec(n, 32, -2, 2), R = random_vec(n, 33);
  Vec dgate0 = random_vec(n, 34), dup0 = random_vec(n, 35);
};
struct SwigluResult { Vec out, dgate, dup; };

template <class T> SwigluResult run_swiglu(const SwigluCase& k) {
  auto out = to_view<T>(Vec(k.n)), gate = to_view<T>(k.gate), up = to_view<T>(k.up);
  auto dgate = to_view<T>(k.dgate0), dup = to_view<T>(k.dup0);
  kernels::swiglu_forward<T>(out, gate, up, k.n);
  kernels::swiglu_backward<T>(dgate, dup, to_view<T>(k.R), gate, up, k.n);
  return {to_vec(out), minus(to_vec(dgate), k.dgate0), minus(to_vec(dup), k.dup0)};
}

}  // namespace

TEST_CASE("rmsnorm forward matches a double reference, backward matches finite differences") {
  RmsCase k;
  const RmsResult r = run_rmsnorm<double>(k);
  Vec ref(k.N * k.C);
  for (int n = 0; n < k.N; ++n) {
    double ms = 0;
    for (int c = 0; c < k.C; ++c) ms += k.inp[n * k.C + c] * k.inp[n * k.C + c] / k.C;
    for (int c = 0; c < k.C; ++c) ref[n * k.C + c] = k.inp[n * k.C + c] / std::sqrt(ms + k.eps) * k.w[c];
  }
  CHECK(rel_err(r.out, ref) < 1e-14);
  auto loss = [&] { return dot(run_rmsnorm<double>(k).out, k.R); };
  CHECK(rel_err(r.dinp, fd_grad(k.inp, loss)) < 1e-7);
  CHECK(rel_err(r.dw, fd_grad(k.w, loss)) < 1e-7);
  const RmsResult f = run_rmsnorm<float>(k);
  CHECK(rel_err(f.out, r.out) < 1e-5);
  CHECK(rel_err(f.dinp, r.dinp) < 1e-5);
  CHECK(rel_err(f.dw, r.dw) < 1e-5);
}

TEST_CASE("rope is Hugging Face's rotate_half rotation; backward is its transpose (finite differences)") {
  RopeCase k;
  const Vec out = run_rope<double>(k, k.x, false);
  CHECK(rel_err(out, reference_rope(k, k.x)) < 1e-14);
  // Position 0 is the identity, and channels past the rotated heads are untouched.
  for (int b = 0; b < k.B; ++b)
    for (int c = 0; c < k.width; ++c) CHECK(out[b * k.T * k.width + c] == k.x[b * k.T * k.width + c]);
  for (int n = 0; n < k.B * k.T; ++n)
    for (int c = k.heads * k.hs; c < k.width; ++c) CHECK(out[n * k.width + c] == k.x[n * k.width + c]);
  Vec x = k.x;
  const Vec numeric = fd_grad(x, [&] { return dot(run_rope<double>(k, x, false), k.R); });
  CHECK(rel_err(run_rope<double>(k, k.R, true), numeric) < 1e-8);
  // Orthogonal: backward undoes forward.
  CHECK(rel_err(run_rope<double>(k, out, true), k.x) < 1e-14);
  CHECK(rel_err(run_rope<float>(k, k.x, false), out) < 1e-6);
}

TEST_CASE("swiglu forward matches silu(gate) * up, backward matches finite differences") {
  SwigluCase k;
  const SwigluResult r = run_swiglu<double>(k);
  Vec ref(k.n);
  for (int i = 0; i < k.n; ++i) ref[i] = k.gate[i] / (1 + std::exp(-k.gate[i])) * k.up[i];
  CHECK(rel_err(r.out, ref) < 1e-14);
  auto loss = [&] { return dot(run_swiglu<double>(k).out, k.R); };
  CHECK(rel_err(r.dgate, fd_grad(k.gate, loss)) < 1e-7);
  CHECK(rel_err(r.dup, fd_grad(k.up, loss)) < 1e-7);
  const SwigluResult f = run_swiglu<float>(k);
  CHECK(rel_err(f.out, r.out) < 1e-5);
  CHECK(rel_err(f.dgate, r.dgate) < 1e-5);
  CHECK(rel_err(f.dup, r.dup) < 1e-5);
}

TEST_CASE("embedding forward gathers rows, backward sums repeated tokens (finite differences)") {
  const int N = 6, C = 19, V = 5;
  const std::vector<int> tokens{3, 1, 3, 0, 3, 1};
  View1<std::int32_t> tok("tokens", N);
  auto tm = Kokkos::create_mirror_view(tok);
  for (int i = 0; i < N; ++i) tm(i) = tokens[i];
  Kokkos::deep_copy(tok, tm);
  Vec wte = random_vec(V * C, 41), R = random_vec(N * C, 42), dwte0 = random_vec(V * C, 43);
  auto forward = [&] {
    auto out = to_view<double>(Vec(N * C));
    kernels::embedding_forward<double>(out, tok, to_view<double>(wte), N, C);
    return to_vec(out);
  };
  const Vec out = forward();
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) CHECK(out[n * C + c] == wte[tokens[n] * C + c]);
  auto dwte = to_view<double>(dwte0);
  kernels::embedding_backward<double>(dwte, to_view<double>(R), tok, N, C);
  CHECK(rel_err(minus(to_vec(dwte), dwte0), fd_grad(wte, [&] { return dot(forward(), R); })) < 1e-8);
}

// The portable (team) kernels against the tuned ones (team.hpp), past the portable path's fixed shapes: rows
// longer than team::kSlots and more rows than two column-sum chunks. ctest unit_portable_np1 reruns the tests
// above on the portable path.
TEST_CASE("portable kernels: rmsnorm and swiglu match the tuned kernels; embedding is bitwise the tuned kernel") {
  RmsCase k;
  k.N = 150, k.C = 300;
  k.inp = random_vec(k.N * k.C, 11, -2, 3), k.w = random_vec(k.C, 12, 0.5, 1.5);
  k.R = random_vec(k.N * k.C, 14), k.dinp0 = random_vec(k.N * k.C, 15), k.dw0 = random_vec(k.C, 16);
  RmsResult tuned, portable;
  {
    kernels::ScopedKernelPath path(false);
    tuned = run_rmsnorm<float>(k);
  }
  {
    kernels::ScopedKernelPath path(true);
    portable = run_rmsnorm<float>(k);
  }
  CHECK(rel_err(portable.out, tuned.out) < 1e-6);
  CHECK(rel_err(portable.rstd, tuned.rstd) < 1e-6);
  CHECK(rel_err(portable.dinp, tuned.dinp) < 1e-6);
  CHECK(rel_err(portable.dw, tuned.dw) < 1e-6);

  SwigluCase g;
  SwigluResult swiglu[2];
  for (int path = 0; path < 2; ++path) {
    kernels::ScopedKernelPath scoped(path == 1);
    swiglu[path] = run_swiglu<float>(g);
  }
  CHECK(rel_err(swiglu[1].out, swiglu[0].out) < 1e-6);
  CHECK(rel_err(swiglu[1].dgate, swiglu[0].dgate) < 1e-6);
  CHECK(rel_err(swiglu[1].dup, swiglu[0].dup) < 1e-6);

  const int N = 300, C = 130, V = 90;
  std::vector<int> tokens(N);
  for (int n = 0; n < N; ++n) tokens[n] = (n * 13) % V;
  tokens[5] = V;  // out of range: a zero row, no gradient
  View1<std::int32_t> tok("tokens", N);
  auto tm = Kokkos::create_mirror_view(tok);
  for (int i = 0; i < N; ++i) tm(i) = tokens[i];
  Kokkos::deep_copy(tok, tm);
  const Vec wte = random_vec(V * C, 41), R = random_vec(N * C, 42), dwte0 = random_vec(V * C, 43);
  Vec out[2], dwte[2];
  for (int path = 0; path < 2; ++path) {
    kernels::ScopedKernelPath scoped(path == 1);
    auto o = to_view<float>(Vec(N * C)), d = to_view<float>(dwte0);
    kernels::embedding_forward<float>(o, tok, to_view<float>(wte), N, C);
    kernels::embedding_backward<float>(d, to_view<float>(R), tok, N, C);
    out[path] = to_vec(o), dwte[path] = to_vec(d);
  }
  CHECK(out[0] == out[1]);
  CHECK(dwte[0] == dwte[1]);
}
