// The portable (GPU-shaped team) kernels of lib/fsdpp/nn/kernels/team.hpp against the tuned host kernels, and
// their promise of launch-independent results (digests that share/scripts/ci-openmp compares across backends).
#include "kernel_test_cases.hpp"

#include "fsdpp/nn/kernels/rmsnorm.hpp"
#include "fsdpp/nn/kernels/softmax.hpp"
#include "fsdpp/nn/kernels/team.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>

// The same kernels on both paths (team.hpp), at sizes past the portable path's fixed shapes: rows longer than
// team::kSlots columns and more rows than two column-sum chunks. Exact kernels (gathers, bias add, the row-order
// dwte/dwpe) must agree bitwise; reductions within 1e-6 relative (float) of the tuned path. The reference and
// finite-difference tests of test_kernels_rows.cpp run on the portable path in ctest unit_portable_np1
// (FSDPP_KERNELS=portable).
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

TEST_CASE("portable kernels: gelu matches the tuned kernel") {
  GeluCase k;
  k.N = 5000;
  k.inp = random_vec(k.N, 31, -8, 8), k.R = random_vec(k.N, 32), k.dinp0 = random_vec(k.N, 33);
  const auto r = on_both_paths<GeluResult>([&] { return run_gelu<float>(k); });
  CHECK(rel_err(r.second.out, r.first.out) < kPathTolerance);
  CHECK(rel_err(r.second.dinp, r.first.dinp) < kPathTolerance);
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
  for (const auto& shape : std::vector<std::pair<int, int>>{{1, 1}, {63, 257}, {200, 3}}) {
    const int N = shape.first, C = shape.second;  // not structured bindings: a lambda captures C (C++20 for those)
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
  // The team size the row kernels really got (ci-openmp asks for 2 and checks this line).
  View1<int> team_size("team_size", 1);
  Kokkos::parallel_for(
      "fsdpp::test_team_size", kernels::team::row_policy<float>(1), KOKKOS_LAMBDA(const kernels::team::Member& m) {
        if (m.team_rank() == 0) team_size(0) = m.team_size();
      });
  std::printf("portable kernels: row teams of %d thread(s)\n", static_cast<int>(to_vec(team_size)[0]));
  if (const char* file = std::getenv("FSDPP_KERNEL_DIGESTS")) {
    std::ofstream out(file);
    REQUIRE_MESSAGE(out, "cannot write FSDPP_KERNEL_DIGESTS=" << file);
    for (const auto& [name, values] : first) out << name << " " << std::hex << digest(values) << std::dec << "\n";
  }
}

// Not a pass/fail speed test: prints single-core timings at small.yaml's sizes (N = 8*256 rows, C = 256,
// V = 4096). Run with OPENBLAS_NUM_THREADS=1 (ctest sets it).
