// Causal self-attention kernels: forward against plain double loops, backward against central finite
// differences of L = sum(out * R), causality, float against double, and a timed run at small.yaml's shape;
// grouped-query attention (Llama) the same ways, and RoPE before attention (scores by relative position).
// Each check runs with full-size products and with row blocks that split T unevenly, so the blocked GEMMs
// that skip the upper triangle are exercised too.
#include "mpi_test.hpp"
#include "test_helpers.hpp"

#include "fsdpp/nn/kernels/attention.hpp"
#include "fsdpp/nn/kernels/rope.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

using namespace fsdpp;

namespace {

using fsdpp::test::dot;
using fsdpp::test::fd_grad;
using fsdpp::test::minus;
using fsdpp::test::random_vector;
using fsdpp::test::rel_diff;
using fsdpp::test::to_vec;
using fsdpp::test::to_view;

struct Shape {
  int B, T, C, NH;
  std::size_t n_inp() const { return std::size_t(B) * T * 3 * C; }
  std::size_t n_out() const { return std::size_t(B) * T * C; }
  std::size_t n_att() const { return std::size_t(B) * NH * T * T; }
};

// The textbook definition, one output at a time.
void reference_forward(const Shape& s, const std::vector<double>& inp, std::vector<double>& out,
                       std::vector<double>& att) {
  const int hs = s.C / s.NH, C3 = 3 * s.C;
  out.assign(s.n_out(), 0.0);
  att.assign(s.n_att(), 0.0);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int t = 0; t < s.T; ++t) {
        std::vector<double> score(t + 1);
        double maxv = -1e300;
        for (int t2 = 0; t2 <= t; ++t2) {
          double dot = 0;
          for (int i = 0; i < hs; ++i)
            dot += inp[(b * s.T + t) * C3 + h * hs + i] * inp[(b * s.T + t2) * C3 + s.C + h * hs + i];
          score[t2] = dot / std::sqrt(double(hs));
          maxv = std::max(maxv, score[t2]);
        }
        double sum = 0;
        for (int t2 = 0; t2 <= t; ++t2) sum += std::exp(score[t2] - maxv);
        for (int t2 = 0; t2 <= t; ++t2) {
          const double p = std::exp(score[t2] - maxv) / sum;
          att[((b * s.NH + h) * s.T + t) * s.T + t2] = p;
          for (int i = 0; i < hs; ++i)
            out[(b * s.T + t) * s.C + h * hs + i] += p * inp[(b * s.T + t2) * C3 + 2 * s.C + h * hs + i];
        }
      }
}

template <class Real>
void run_forward(const Shape& s, const std::vector<double>& inp, int row_block, std::vector<double>& out,
                 std::vector<double>& att) {
  auto out_v = to_view<Real>(std::vector<double>(s.n_out(), std::numeric_limits<double>::quiet_NaN()));
  auto att_v = to_view<Real>(std::vector<double>(s.n_att(), std::numeric_limits<double>::quiet_NaN()));
  kernels::attention_forward<Real>(out_v, att_v, to_view<Real>(inp), s.B, s.T, s.C, s.NH, row_block);
  out = to_vec(out_v);
  att = to_vec(att_v);
}

// dinp starts at dinp0 (to check that backward accumulates); datt starts as NaN (to check it is only scratch).
template <class Real>
std::vector<double> run_backward(const Shape& s, const std::vector<double>& inp, const std::vector<double>& dout,
                                 const std::vector<double>& dinp0, int row_block) {
  auto inp_v = to_view<Real>(inp);
  View1<Real> out_v("out", s.n_out()), att_v("att", s.n_att());
  kernels::attention_forward<Real>(out_v, att_v, inp_v, s.B, s.T, s.C, s.NH, row_block);
  auto dinp_v = to_view<Real>(dinp0);
  auto datt_v = to_view<Real>(std::vector<double>(s.n_att(), std::numeric_limits<double>::quiet_NaN()));
  kernels::attention_backward<Real>(dinp_v, datt_v, to_view<Real>(dout), inp_v, att_v, s.B, s.T, s.C, s.NH,
                                    row_block);
  return to_vec(dinp_v);
}

double loss(const Shape& s, const std::vector<double>& inp, const std::vector<double>& R, int row_block) {
  std::vector<double> out, att;
  run_forward<double>(s, inp, row_block, out, att);
  double L = 0;
  for (std::size_t i = 0; i < out.size(); ++i) L += out[i] * R[i];
  return L;
}

const Shape kShapes[] = {{2, 5, 8, 2}, {2, 5, 8, 1}};
const int kRowBlocks[] = {kernels::kAttentionRowBlock, 2, 1};  // 64 >= T: one full-size product

}  // namespace

TEST_CASE("attention forward matches a naive double reference") {
  for (const Shape& s : kShapes)
    for (int rb : kRowBlocks) {
      CAPTURE(s.NH);
      CAPTURE(rb);
      const auto inp = random_vector(s.n_inp(), 1);
      std::vector<double> out_ref, att_ref, out, att;
      reference_forward(s, inp, out_ref, att_ref);
      run_forward<double>(s, inp, rb, out, att);
      CHECK(rel_diff(out, out_ref) < 1e-12);
      CHECK(rel_diff(att, att_ref) < 1e-12);
      bool upper_zero = true;
      for (int bh = 0; bh < s.B * s.NH; ++bh)
        for (int t = 0; t < s.T; ++t)
          for (int t2 = t + 1; t2 < s.T; ++t2) upper_zero = upper_zero && att[(bh * s.T + t) * s.T + t2] == 0.0;
      CHECK(upper_zero);
    }
}

TEST_CASE("attention backward matches central finite differences") {
  for (const Shape& s : kShapes)
    for (int rb : kRowBlocks) {
      CAPTURE(s.NH);
      CAPTURE(rb);
      auto inp = random_vector(s.n_inp(), 2);
      const auto R = random_vector(s.n_out(), 3);
      const auto dinp0 = random_vector(s.n_inp(), 4);
      const auto dinp = run_backward<double>(s, inp, R, dinp0, rb);
      std::vector<double> analytic(s.n_inp()), numeric(s.n_inp());
      for (std::size_t i = 0; i < inp.size(); ++i) {
        analytic[i] = dinp[i] - dinp0[i];
        const double x = inp[i], h = 1e-6 * std::max(1.0, std::abs(x));
        inp[i] = x + h;
        const double Lp = loss(s, inp, R, rb);
        inp[i] = x - h;
        const double Lm = loss(s, inp, R, rb);
        inp[i] = x;
        numeric[i] = (Lp - Lm) / (2 * h);
      }
      const double err = rel_diff(analytic, numeric);
      MESSAGE("attention backward NH=" << s.NH << " row_block=" << rb << ": rel err " << err);
      CHECK(err <= 1e-6);
    }
}

TEST_CASE("attention is causal: a future token's k and v do not change earlier outputs") {
  const Shape s{2, 5, 8, 2};
  for (int rb : kRowBlocks)
    for (int future = 1; future < s.T; ++future) {
      CAPTURE(rb);
      CAPTURE(future);
      auto inp = random_vector(s.n_inp(), 5);
      std::vector<double> out0, att0, out1, att1;
      run_forward<double>(s, inp, rb, out0, att0);
      for (int b = 0; b < s.B; ++b)
        for (int c = s.C; c < 3 * s.C; ++c) inp[(b * s.T + future) * 3 * s.C + c] += 10.0;  // k and v
      run_forward<double>(s, inp, rb, out1, att1);
      bool past_same = true, present_changed = false;
      for (int b = 0; b < s.B; ++b)
        for (int t = 0; t < s.T; ++t)
          for (int c = 0; c < s.C; ++c) {
            const std::size_t i = (b * s.T + t) * s.C + c;
            if (t < future) past_same = past_same && out0[i] == out1[i];
            if (t == future) present_changed = present_changed || out0[i] != out1[i];
          }
      CHECK(past_same);
      CHECK(present_changed);
    }
}

TEST_CASE("attention float agrees with double") {
  const Shape s{2, 5, 8, 2};
  const auto inp = random_vector(s.n_inp(), 6);
  const auto dout = random_vector(s.n_out(), 7);
  const auto dinp0 = random_vector(s.n_inp(), 8);
  for (int rb : kRowBlocks) {
    CAPTURE(rb);
    std::vector<double> out_d, att_d, out_f, att_f;
    run_forward<double>(s, inp, rb, out_d, att_d);
    run_forward<float>(s, inp, rb, out_f, att_f);
    CHECK(rel_diff(out_f, out_d) < 1e-5);
    CHECK(rel_diff(att_f, att_d) < 1e-5);
    CHECK(rel_diff(run_backward<float>(s, inp, dout, dinp0, rb), run_backward<double>(s, inp, dout, dinp0, rb)) < 1e-5);
  }
}

// small.yaml's attention shape. Not a pass/fail speed test: it prints the time and checks that the blocked
// products agree with full-size ones at a realistic size. Run with OPENBLAS_NUM_THREADS=1 (ctest sets it).
TEST_CASE("attention timing at B=8 T=256 C=256 NH=4") {
  const Shape s{8, 256, 256, 4};
  const int hs = s.C / s.NH;
  auto inp = to_view<float>(random_vector(s.n_inp(), 9));
  auto dout = to_view<float>(random_vector(s.n_out(), 10));
  View1<float> out("out", s.n_out()), att("att", s.n_att()), datt("datt", s.n_att()), dinp("dinp", s.n_inp());
  // FLOPs: forward q k^T and att v, backward datt, dv, dq, dk: 6 products of 2*T*T*hs per (b, h), all counted
  // full even though causality makes half of each useless (the PaLM-style dense count).
  const double dense_flops = 6.0 * 2.0 * s.T * s.T * hs * s.B * s.NH;
  std::vector<double> results[2];
  const int blocks[2] = {kernels::kAttentionRowBlock, s.T};
  for (int k = 0; k < 2; ++k) {
    std::vector<double> ms;
    for (int rep = 0; rep < 6; ++rep) {
      Kokkos::deep_copy(dinp, 0.0f);
      Kokkos::fence();
      const auto t0 = std::chrono::steady_clock::now();
      kernels::attention_forward<float>(out, att, inp, s.B, s.T, s.C, s.NH, blocks[k]);
      kernels::attention_backward<float>(dinp, datt, dout, inp, att, s.B, s.T, s.C, s.NH, blocks[k]);
      Kokkos::fence();
      if (rep > 0) ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    std::printf("attention fwd+bwd B=8 T=256 C=256 NH=4 row_block=%d: median %.2f ms (min %.2f), %.1f GFLOP/s "
                "(dense count 12*B*T^2*C = %.3g FLOP)\n",
                blocks[k], ms[2], ms[0], dense_flops / (ms[2] * 1e6), dense_flops);
    auto o = to_vec(out);
    auto d = to_vec(dinp);
    o.insert(o.end(), d.begin(), d.end());
    results[k] = o;
  }
  CHECK(rel_diff(results[0], results[1]) < 1e-5);
}

// ---------------------------------------------------------------------------------- grouped-query attention
namespace {

// Naive double GQA: query head h reads kv head h / (NH/NKV); rows packed [q | k | v].
std::vector<double> reference_gqa(const kernels::AttentionShape& s, const std::vector<double>& inp) {
  const int W = s.row_width(), C = s.q_width(), G = s.group();
  std::vector<double> out(static_cast<std::size_t>(s.B) * s.T * C, 0.0);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int t = 0; t < s.T; ++t) {
        const int g = h / G;
        std::vector<double> score(t + 1);
        double maxv = -1e300;
        for (int t2 = 0; t2 <= t; ++t2) {
          double d = 0;
          for (int i = 0; i < s.hs; ++i)
            d += inp[(b * s.T + t) * W + h * s.hs + i] * inp[(b * s.T + t2) * W + C + g * s.hs + i];
          score[t2] = d / std::sqrt(double(s.hs));
          maxv = std::max(maxv, score[t2]);
        }
        double sum = 0;
        for (double& x : score) sum += (x = std::exp(x - maxv));
        for (int t2 = 0; t2 <= t; ++t2)
          for (int i = 0; i < s.hs; ++i)
            out[(b * s.T + t) * C + h * s.hs + i] +=
                score[t2] / sum * inp[(b * s.T + t2) * W + C + s.NKV * s.hs + g * s.hs + i];
      }
  return out;
}

template <class Real> std::vector<double> gqa_forward(const kernels::AttentionShape& s, const std::vector<double>& inp, int row_block) {
  View1<Real> out("out", static_cast<std::size_t>(s.B) * s.T * s.q_width());
  View1<Real> att("att", static_cast<std::size_t>(s.B) * s.NH * s.T * s.T);
  kernels::attention_forward<Real>(out, att, to_view<Real>(inp), s, row_block);
  return to_vec(out);
}

template <class Real>
std::vector<double> gqa_backward(const kernels::AttentionShape& s, const std::vector<double>& inp, const std::vector<double>& dout, const std::vector<double>& dinp0, int row_block) {
  View1<Real> out("out", static_cast<std::size_t>(s.B) * s.T * s.q_width());
  View1<Real> att("att", static_cast<std::size_t>(s.B) * s.NH * s.T * s.T);
  auto inp_v = to_view<Real>(inp);
  kernels::attention_forward<Real>(out, att, inp_v, s, row_block);
  auto dinp = to_view<Real>(dinp0);
  auto datt = to_view<Real>(std::vector<double>(att.extent(0), std::numeric_limits<double>::quiet_NaN()));
  kernels::attention_backward<Real>(dinp, datt, to_view<Real>(dout), inp_v, att, s, row_block);
  return minus(to_vec(dinp), dinp0);
}

}  // namespace

TEST_CASE("grouped-query attention matches a naive reference and finite differences (dK/dV summed over groups)") {
  using kernels::AttentionShape;
  for (const AttentionShape& s : {AttentionShape{2, 5, 4, 2, 3}, AttentionShape{2, 5, 6, 1, 2},
                                  AttentionShape{1, 4, 3, 3, 2}})
    for (int rb : {kernels::kAttentionRowBlock, 2}) {
      CAPTURE(s.NH);
      CAPTURE(s.NKV);
      CAPTURE(rb);
      std::vector<double> inp = random_vector(static_cast<std::size_t>(s.B) * s.T * s.row_width(), 51);
      const std::vector<double> R = random_vector(static_cast<std::size_t>(s.B) * s.T * s.q_width(), 52);
      const std::vector<double> dinp0 = random_vector(inp.size(), 53);
      CHECK(rel_diff(gqa_forward<double>(s, inp, rb), reference_gqa(s, inp)) < 1e-12);
      const std::vector<double> analytic = gqa_backward<double>(s, inp, R, dinp0, rb);
      const std::vector<double> numeric = fd_grad(inp, [&] { return dot(gqa_forward<double>(s, inp, rb), R); });
      CHECK(rel_diff(analytic, numeric) < 1e-6);
      CHECK(rel_diff(gqa_backward<float>(s, inp, R, dinp0, rb), analytic) < 1e-5);
    }
}

TEST_CASE("attention with NKV = NH is bitwise the GPT-2 call") {
  const kernels::AttentionShape s{2, 7, 4, 4, 3};
  const std::vector<double> inp = random_vector(static_cast<std::size_t>(s.B) * s.T * s.row_width(), 61);
  View1<float> out("out", s.B * s.T * s.q_width()), att("att", s.B * s.NH * s.T * s.T);
  kernels::attention_forward<float>(out, att, to_view<float>(inp), s.B, s.T, s.q_width(), s.NH, 2);
  CHECK(to_vec(out) == gqa_forward<float>(s, inp, 2));
}

TEST_CASE("rope then attention: scores depend on relative position only") {
  // After RoPE, q(t).k(t2) depends on t - t2 only: the same content one position later (a zero row in front)
  // gives the same scores among the content rows, so the same ratios att[t,t2] / att[t,t].
  const kernels::AttentionShape s{1, 4, 2, 1, 4};
  const int W = s.row_width();
  std::vector<double> ch, sh;
  kernels::rope_table(ch, sh, 8, s.hs, 10000.0);
  const std::vector<double> content = random_vector(static_cast<std::size_t>(s.T) * W, 71);
  auto probabilities = [&](int shift) {
    // A sequence of T + shift positions whose last T rows are `content`; its attention probabilities.
    const int T = s.T + shift;
    std::vector<double> x(static_cast<std::size_t>(T) * W, 0.0);
    std::copy(content.begin(), content.end(), x.begin() + static_cast<std::ptrdiff_t>(shift) * W);
    auto xv = to_view<double>(x);
    kernels::rope_forward<double>(xv, to_view<double>(ch), to_view<double>(sh), 1, T, W, s.NH + s.NKV, s.hs);
    kernels::AttentionShape st = s;
    st.T = T;
    View1<double> out("out", static_cast<std::size_t>(T) * s.q_width()), att("att", s.NH * T * T);
    kernels::attention_forward<double>(out, att, xv, st);
    return to_vec(att);
  };
  const std::vector<double> a0 = probabilities(0), a1 = probabilities(1);
  const int T0 = s.T, T1 = s.T + 1;
  for (int h = 0; h < s.NH; ++h)
    for (int t = 0; t < T0; ++t)
      for (int t2 = 0; t2 <= t; ++t2) {
        const double r0 = a0[(h * T0 + t) * T0 + t2] / a0[(h * T0 + t) * T0 + t];
        const double r1 = a1[(h * T1 + t + 1) * T1 + t2 + 1] / a1[(h * T1 + t + 1) * T1 + t + 1];
        CHECK(std::fabs(r0 - r1) < 1e-12 * std::max(1.0, std::fabs(r0)));
      }
}
