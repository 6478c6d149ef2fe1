#pragma once
// Shared by the row-kernel tests (test_kernels_rows.cpp, test_kernels_portable.cpp): plain double references,
// central finite differences, and one "case" per kernel (inputs) with a run_<kernel><T>() that runs forward and
// backward and reads back what they wrote. Backward kernels accumulate, so every gradient buffer starts filled
// with random values G0 and the analytic gradient is read back as (result - G0): that checks the += as well.
#include "mpi_test.hpp"
#include "test_helpers.hpp"

#include "fsdpp/nn/kernels/crossentropy.hpp"
#include "fsdpp/nn/kernels/encoder.hpp"
#include "fsdpp/nn/kernels/gelu.hpp"
#include "fsdpp/nn/kernels/layernorm.hpp"
#include "fsdpp/nn/kernels/linear.hpp"
#include "fsdpp/nn/kernels/residual.hpp"
#include "fsdpp/tensor/matmul.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

using namespace fsdpp;
using Vec = std::vector<double>;

// Internal linkage: each test file gets its own copy; inline keeps unused helpers from warning.
namespace {

using fsdpp::test::dot;
using fsdpp::test::fd_grad;
using fsdpp::test::minus;
using fsdpp::test::random_vec;
using fsdpp::test::rel_err;
using fsdpp::test::to_vec;
using fsdpp::test::to_view;

inline View1<std::int32_t> to_tokens(const std::vector<int>& h) {
  View1<std::int32_t> v("tokens", h.size());
  auto m = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < h.size(); ++i) m(i) = h[i];
  Kokkos::deep_copy(v, m);
  return v;
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

inline double gelu_reference(double x) {
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

inline Vec crossentropy_reference(const Vec& logits, const std::vector<int>& targets, int N, int V) {
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

inline double mean(const Vec& v) { return std::accumulate(v.begin(), v.end(), 0.0) / v.size(); }

}  // namespace
