// Fused (flash-style) and strided-batched causal attention against the reference kernels of attention.hpp:
// forward output and backward gradients agree (float and double) over odd shapes (T not a multiple of the tile, head sizes 8 to
// 96, grouped-query groups 1/2/4, B 1-3); the saved logsumexp is the reference's log of the softmax sum;
// finite differences in double check the fused backward on its own; with document masks (AttentionShape::starts)
// all three compute the block-diagonal causal attention written out here; timing of the three at small.yaml's shape.
#include "mpi_test.hpp"
#include "test_helpers.hpp"

#include "fsdpp/nn/kernels/attention.hpp"
#include "fsdpp/nn/kernels/attention_batched.hpp"
#include "fsdpp/nn/kernels/flash_attention.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

using namespace fsdpp;
using kernels::AttentionShape;

namespace {

using fsdpp::test::random_vector;
using fsdpp::test::rel_diff;
using fsdpp::test::to_vec;
using fsdpp::test::to_view;

std::size_t n_inp(const AttentionShape& s) { return std::size_t(s.B) * s.T * s.row_width(); }
std::size_t n_out(const AttentionShape& s) { return std::size_t(s.B) * s.T * s.q_width(); }
std::size_t n_rows(const AttentionShape& s) { return std::size_t(s.B) * s.NH * s.T; }

enum class Path { reference, batched, fused };

struct Result {
  std::vector<double> out, dinp, lse;  // lse: fused only
};

// Forward, then backward of L = sum(out * R) accumulated onto dinp0.
template <class Real>
Result run(Path path, const AttentionShape& s, const std::vector<double>& inp, const std::vector<double>& R,
           const std::vector<double>& dinp0) {
  auto in = to_view<Real>(inp);
  auto dout = to_view<Real>(R);
  auto dinp = to_view<Real>(dinp0);
  View1<Real> out("out", n_out(s));
  Result r;
  if (path == Path::fused) {
    View1<Real> lse("lse", n_rows(s)), delta("delta", n_rows(s));
    kernels::flash_attention_forward<Real>(out, lse, in, s);
    kernels::flash_attention_backward<Real>(dinp, delta, dout, in, out, lse, s);
    r.lse = to_vec(lse);
  } else {
    const std::size_t n_att = n_rows(s) * s.T;
    View1<Real> att("att", n_att), datt("datt", n_att);
    if (path == Path::batched) {
      View1<Real> workspace("workspace", kernels::batched_attention_workspace(s));
      kernels::attention_forward_batched<Real>(out, att, in, workspace, s);
      kernels::attention_backward_batched<Real>(dinp, datt, dout, in, att, workspace, s);
    } else {
      kernels::attention_forward<Real>(out, att, in, s);
      kernels::attention_backward<Real>(dinp, datt, dout, in, att, s);
    }
  }
  r.out = to_vec(out);
  r.dinp = to_vec(dinp);
  return r;
}

// Odd shapes: T below, at and across the 32- and 16-row tiles, not multiples of them.
const AttentionShape kFlashShapes[] = {
    {1, 1, 2, 2, 8},   {2, 7, 2, 1, 8},   {3, 33, 4, 2, 8},  {1, 45, 4, 1, 16}, {2, 70, 4, 4, 16},
    {1, 65, 2, 2, 64}, {2, 40, 4, 2, 64}, {1, 37, 2, 1, 96}, {3, 19, 3, 3, 16},
};

}  // namespace

TEST_CASE("fused and batched attention agree with the reference kernels, forward and backward (float and double)") {
  for (const AttentionShape& s : kFlashShapes) {
    CAPTURE(s.B);
    CAPTURE(s.T);
    CAPTURE(s.NH);
    CAPTURE(s.NKV);
    CAPTURE(s.hs);
    const auto inp = random_vector(n_inp(s), 11, 2.0);
    const auto R = random_vector(n_out(s), 12);
    const auto dinp0 = random_vector(n_inp(s), 13);
    const Result rd = run<double>(Path::reference, s, inp, R, dinp0);
    const Result rf = run<float>(Path::reference, s, inp, R, dinp0);
    for (Path path : {Path::batched, Path::fused}) {
      const char* name = path == Path::fused ? "fused" : "batched";
      CAPTURE(name);
      const Result d = run<double>(path, s, inp, R, dinp0);
      CHECK(rel_diff(d.out, rd.out) <= 1e-12);
      CHECK(rel_diff(d.dinp, rd.dinp) <= 1e-12);
      const Result f = run<float>(path, s, inp, R, dinp0);
      const double out_err = rel_diff(f.out, rf.out), dinp_err = rel_diff(f.dinp, rf.dinp);
      MESSAGE(name << " vs reference float T=" << s.T << " hs=" << s.hs << " G=" << s.group() << ": out " << out_err
                   << ", dinp " << dinp_err);
      CHECK(out_err <= 1e-5);
      CHECK(dinp_err <= 1e-5);
    }
  }
}

TEST_CASE("fused attention saves each row's logsumexp of the scaled causal scores") {
  const AttentionShape s{2, 37, 4, 2, 16};
  const auto inp = random_vector(n_inp(s), 21, 2.0);
  const Result r = run<double>(Path::fused, s, inp, random_vector(n_out(s), 22), std::vector<double>(n_inp(s), 0.0));
  const int W = s.row_width(), hs = s.hs;
  double worst = 0;
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int t = 0; t < s.T; ++t) {
        double sum = 0;
        for (int t2 = 0; t2 <= t; ++t2) {
          double dot = 0;
          for (int i = 0; i < hs; ++i)
            dot += inp[(b * s.T + t) * W + h * hs + i] * inp[(b * s.T + t2) * W + s.q_width() + (h / s.group()) * hs + i];
          sum += std::exp(dot / std::sqrt(double(hs)));
        }
        worst = std::max(worst, std::abs(r.lse[(b * s.NH + h) * s.T + t] - std::log(sum)));
      }
  CHECK(worst <= 1e-12);
}

TEST_CASE("fused attention backward matches central finite differences (double)") {
  const AttentionShape shapes[] = {{2, 35, 4, 2, 8}, {1, 9, 4, 1, 16}, {1, 34, 2, 2, 8}};
  for (const AttentionShape& s : shapes) {
    CAPTURE(s.T);
    CAPTURE(s.NKV);
    CAPTURE(s.hs);
    auto inp = random_vector(n_inp(s), 31);
    const auto R = random_vector(n_out(s), 32);
    const std::vector<double> zero(n_inp(s), 0.0);
    const auto analytic = run<double>(Path::fused, s, inp, R, zero).dinp;
    auto loss = [&](const std::vector<double>& x) {
      View1<double> out("out", n_out(s)), lse("lse", n_rows(s));
      kernels::flash_attention_forward<double>(out, lse, to_view<double>(x), s);
      const auto o = to_vec(out);
      double L = 0;
      for (std::size_t i = 0; i < o.size(); ++i) L += o[i] * R[i];
      return L;
    };
    std::vector<double> numeric(inp.size());
    for (std::size_t i = 0; i < inp.size(); ++i) {
      const double x = inp[i], h = 1e-6 * std::max(1.0, std::abs(x));
      inp[i] = x + h;
      const double Lp = loss(inp);
      inp[i] = x - h;
      const double Lm = loss(inp);
      inp[i] = x;
      numeric[i] = (Lp - Lm) / (2 * h);
    }
    const double err = rel_diff(analytic, numeric);
    MESSAGE("fused attention backward T=" << s.T << " G=" << s.group() << " hs=" << s.hs << ": rel err " << err);
    CHECK(err <= 1e-6);
  }
}

TEST_CASE("document masks: every attention path computes the block-diagonal causal attention, forward and "
          "backward") {
  // Documents of random lengths (1 to 40 tokens) packed along each row: starts across, at and inside the 32- and
  // 16-row tiles of the fused kernels, so that whole key tiles are skipped and others masked element-wise.
  const AttentionShape shapes[] = {{2, 70, 4, 2, 16}, {1, 65, 2, 2, 64}, {3, 33, 4, 2, 8}, {1, 100, 2, 1, 96}};
  for (AttentionShape s : shapes) {
    CAPTURE(s.T);
    CAPTURE(s.hs);
    std::mt19937 gen(41);
    std::vector<std::int32_t> starts(std::size_t(s.B) * s.T);
    for (int b = 0; b < s.B; ++b)
      for (int t = 0, start = 0, end = 0; t < s.T; ++t) {
        if (t == end) start = t, end = t + 1 + static_cast<int>(gen() % 40);
        starts[std::size_t(b) * s.T + t] = start;
      }
    View1<std::int32_t> starts_view("starts", starts.size());
    Kokkos::deep_copy(starts_view, HostView1<const std::int32_t>(starts.data(), starts.size()));
    s.starts = starts_view.data();
    const auto inp = random_vector(n_inp(s), 42, 2.0);
    const auto R = random_vector(n_out(s), 43);
    const auto dinp0 = random_vector(n_inp(s), 44);
    // The forward written out: query t of head h over keys [start, t] only.
    const Result rd = run<double>(Path::reference, s, inp, R, dinp0);
    const int W = s.row_width(), hs = s.hs, C = s.q_width();
    double worst = 0;
    for (int b = 0; b < s.B; ++b)
      for (int h = 0; h < s.NH; ++h)
        for (int t = 0; t < s.T; ++t) {
          const int start = starts[std::size_t(b) * s.T + t], kv = h / s.group();
          std::vector<double> p(t + 1, 0.0);
          double mx = -1e300, sum = 0;
          for (int j = start; j <= t; ++j) {
            double dot = 0;
            for (int i = 0; i < hs; ++i)
              dot += inp[std::size_t(b * s.T + t) * W + h * hs + i] * inp[std::size_t(b * s.T + j) * W + C + kv * hs + i];
            mx = std::max(mx, p[j] = dot / std::sqrt(double(hs)));
          }
          for (int j = start; j <= t; ++j) sum += (p[j] = std::exp(p[j] - mx));
          for (int i = 0; i < hs; ++i) {
            double o = 0;
            for (int j = start; j <= t; ++j) o += p[j] / sum * inp[std::size_t(b * s.T + j) * W + C + (s.NKV + kv) * hs + i];
            worst = std::max(worst, std::abs(o - rd.out[std::size_t(b * s.T + t) * C + h * hs + i]));
          }
        }
    CHECK(worst <= 1e-12);
    const Result rf = run<float>(Path::reference, s, inp, R, dinp0);
    for (Path path : {Path::batched, Path::fused}) {
      CAPTURE(path == Path::fused ? "fused" : "batched");
      const Result d = run<double>(path, s, inp, R, dinp0);
      CHECK(rel_diff(d.out, rd.out) <= 1e-12);
      CHECK(rel_diff(d.dinp, rd.dinp) <= 1e-12);
      const Result f = run<float>(path, s, inp, R, dinp0);
      CHECK(rel_diff(f.out, rf.out) <= 1e-5);
      CHECK(rel_diff(f.dinp, rf.dinp) <= 1e-5);
    }
    // The mask matters here: plain causal attention is another result.
    s.starts = nullptr;
    CHECK(rel_diff(run<double>(Path::reference, s, inp, R, dinp0).out, rd.out) > 1e-3);
  }
}

TEST_CASE("fused attention backward is deterministic: bitwise the same twice") {
  const AttentionShape s{2, 50, 4, 1, 16};
  const auto inp = random_vector(n_inp(s), 41), R = random_vector(n_out(s), 42), d0 = random_vector(n_inp(s), 43);
  CHECK(run<float>(Path::fused, s, inp, R, d0).dinp == run<float>(Path::fused, s, inp, R, d0).dinp);
}

TEST_CASE("reference vs batched vs fused attention timing at B=8 T=256 C=256 NH=4") {
  const AttentionShape s{8, 256, 4, 4, 64};
  auto inp = to_view<float>(random_vector(n_inp(s), 9));
  auto dout = to_view<float>(random_vector(n_out(s), 10));
  const std::size_t n_att = n_rows(s) * s.T;
  View1<float> out("out", n_out(s)), dinp("dinp", n_inp(s)), lse("lse", n_rows(s)), delta("delta", n_rows(s));
  View1<float> att("att", n_att), datt("datt", n_att), workspace("workspace", kernels::batched_attention_workspace(s));
  const char* names[3] = {"reference", "batched", "fused"};
  double medians[3] = {0, 0, 0};
  std::vector<double> ms[3];
  for (int rep = 0; rep < 7; ++rep)
    for (int k = 0; k < 3; ++k) {  // alternating, so load on the shared machine hits both alike
      Kokkos::deep_copy(dinp, 0.0f);
      Kokkos::fence();
      const auto t0 = std::chrono::steady_clock::now();
      if (k == 0) {
        kernels::attention_forward<float>(out, att, inp, s);
        kernels::attention_backward<float>(dinp, datt, dout, inp, att, s);
      } else if (k == 1) {
        kernels::attention_forward_batched<float>(out, att, inp, workspace, s);
        kernels::attention_backward_batched<float>(dinp, datt, dout, inp, att, workspace, s);
      } else {
        kernels::flash_attention_forward<float>(out, lse, inp, s);
        kernels::flash_attention_backward<float>(dinp, delta, dout, inp, out, lse, s);
      }
      Kokkos::fence();
      if (rep > 0) ms[k].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      if (rep == 6) {
        std::sort(ms[k].begin(), ms[k].end());
        medians[k] = ms[k][ms[k].size() / 2];
      }
    }
  for (int k = 0; k < 3; ++k)
    std::printf("attention fwd+bwd B=8 T=256 C=256 NH=4 %s: median %.2f ms\n", names[k], medians[k]);
  CHECK(medians[1] > 0);
  CHECK(medians[2] > 0);
}
