// Causal self-attention kernels: forward against plain double loops, backward against central finite
// differences of L = sum(out * R), causality, float against double, and a timed run at small.yaml's shape.
// Each check runs with full-size products and with row blocks that split T unevenly, so the blocked GEMMs
// that skip the upper triangle are exercised too.
#include "mpi_test.hpp"

#include "fsdpp/nn/kernels/attention.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

using namespace fsdpp;

namespace {

std::vector<double> random_vector(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

template <class Real> View1<Real> to_view(const std::vector<double>& v) {
  View1<Real> out("test", v.size());
  auto host = Kokkos::create_mirror_view(out);
  for (std::size_t i = 0; i < v.size(); ++i) host(i) = static_cast<Real>(v[i]);
  Kokkos::deep_copy(out, host);
  return out;
}

template <class Real> std::vector<double> to_vector(const View1<Real>& view) {
  auto host = Kokkos::create_mirror_view(view);
  Kokkos::deep_copy(host, view);
  return std::vector<double>(host.data(), host.data() + host.extent(0));
}

// max_i |a_i - b_i| / max_i |b_i|: relative to the scale of the reference, so tiny entries do not dominate.
double rel_err(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / scale;
}

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
  out = to_vector(out_v);
  att = to_vector(att_v);
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
  return to_vector(dinp_v);
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
      CHECK(rel_err(out, out_ref) < 1e-12);
      CHECK(rel_err(att, att_ref) < 1e-12);
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
      const double err = rel_err(analytic, numeric);
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
    CHECK(rel_err(out_f, out_d) < 1e-5);
    CHECK(rel_err(att_f, att_d) < 1e-5);
    CHECK(rel_err(run_backward<float>(s, inp, dout, dinp0, rb), run_backward<double>(s, inp, dout, dinp0, rb)) < 1e-5);
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
    auto o = to_vector(out);
    auto d = to_vector(dinp);
    o.insert(o.end(), d.begin(), d.end());
    results[k] = o;
  }
  CHECK(rel_err(results[0], results[1]) < 1e-5);
}
