// The GEMM entry point in each precision (tensor/matmul.hpp) against a double reference:
//   f32   bitwise what OpenBLAS's sgemm gives (host builds), within f32 accumulation error of the exact product;
//   bf16  the exact product of the bf16-rounded inputs up to f32 accumulation error, hence within
//         2 x 2^-8 (one rounding per input) x sum |a||b| of the exact product;
//   tf32  likewise with 2^-11 per input.
// Every transpose combination, padded leading dimensions, alpha/beta, K across several K-panels, batched
// strides, and that the packing scratch stops allocating once it has grown.
#include "mpi_test.hpp"
#include "test_helpers.hpp"

#include "fsdpp/runtime/memory_accounting.hpp"
#include "fsdpp/tensor/bf16.hpp"
#include "fsdpp/tensor/matmul.hpp"
#include "fsdpp/tensor/types.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#if !defined(KOKKOS_ENABLE_CUDA)
#include <cblas.h>
#endif

using namespace fsdpp;

namespace {

using fsdpp::test::to_host;
using fsdpp::test::to_view;

std::vector<float> uniform_floats(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// One product's shape and operands, stored row-major with padded leading dimensions; `batch` entries at
// strides a bit larger than one matrix.
struct Problem {
  Trans ta, tb;
  int M, N, K, batch;
  float alpha, beta;
  int lda, ldb, ldc;
  std::int64_t sa, sb, sc;
  std::vector<float> A, B, C0;
  Problem(Trans ta_, Trans tb_, int M_, int N_, int K_, int batch_, float alpha_, float beta_, unsigned seed)
      : ta(ta_), tb(tb_), M(M_), N(N_), K(K_), batch(batch_), alpha(alpha_), beta(beta_) {
    const int a_rows = ta == Trans::N ? M : K, a_cols = ta == Trans::N ? K : M;
    const int b_rows = tb == Trans::N ? K : N, b_cols = tb == Trans::N ? N : K;
    lda = a_cols + 3, ldb = b_cols + 5, ldc = N + 2;
    sa = std::int64_t(a_rows) * lda + 7, sb = std::int64_t(b_rows) * ldb + 1, sc = std::int64_t(M) * ldc + 4;
    A = uniform_floats(static_cast<std::size_t>(sa * batch), seed);
    B = uniform_floats(static_cast<std::size_t>(sb * batch), seed + 1);
    C0 = uniform_floats(static_cast<std::size_t>(sc * batch), seed + 2);
  }
  float a(int i, int m, int k) const { return ta == Trans::N ? A[i * sa + m * lda + k] : A[i * sa + k * lda + m]; }
  float b(int i, int k, int n) const { return tb == Trans::N ? B[i * sb + k * ldb + n] : B[i * sb + n * ldb + k]; }

  // Runs the entry point (gemm for batch 1, gemm_batched otherwise) on device copies; returns C.
  std::vector<float> run(bool batched) const {
    const View1<float> a = to_view(A), b = to_view(B), c = to_view(C0);
    if (batched)
      gemm_batched<float>(ta, tb, M, N, K, alpha, a.data(), lda, sa, b.data(), ldb, sb, beta, c.data(), ldc, sc, batch);
    else
      gemm<float>(ta, tb, M, N, K, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
    Kokkos::fence();
    return to_host(c);
  }
};

// Checks `got` against double references: |got - rounded| within f32 accumulation error (rounded: the exact
// product of the inputs after `round`), |got - exact| within `per_input` rounding error of each input. Returns
// the largest |got - exact| relative to sum |alpha a b|, to show the rounding happened.
template <class Round>
double check_against_reference(const Problem& p, const std::vector<float>& got, double per_input, Round round) {
  const double f32_sum_error = 2.0 * (p.K + 2) * std::ldexp(1.0, -24);  // f32 accumulation (and the beta term)
  double worst_relative = 0;
  for (int i = 0; i < p.batch; ++i)
    for (int m = 0; m < p.M; ++m)
      for (int n = 0; n < p.N; ++n) {
        double exact = 0, rounded = 0, magnitude = 0;
        for (int k = 0; k < p.K; ++k) {
          exact += double(p.a(i, m, k)) * p.b(i, k, n);
          rounded += double(round(p.a(i, m, k))) * round(p.b(i, k, n));
          magnitude += std::fabs(double(p.a(i, m, k)) * p.b(i, k, n));
        }
        const double c0 = p.C0[i * p.sc + m * p.ldc + n];
        exact = p.alpha * exact + p.beta * c0, rounded = p.alpha * rounded + p.beta * c0;
        magnitude = std::fabs(p.alpha) * magnitude + std::fabs(p.beta * c0);
        const double value = got[i * p.sc + m * p.ldc + n];
        CAPTURE(i);
        CAPTURE(m);
        CAPTURE(n);
        REQUIRE(std::fabs(value - rounded) <= f32_sum_error * magnitude * 1.5 + 1e-30);
        REQUIRE(std::fabs(value - exact) <= (2 * per_input + per_input * per_input + f32_sum_error) * magnitude);
        worst_relative = std::max(worst_relative, std::fabs(value - exact) / magnitude);
      }
  // Leading-dimension padding between rows and batch entries is untouched.
  for (std::size_t j = 0; j < got.size(); ++j) {
    const std::int64_t in_entry = static_cast<std::int64_t>(j) % p.sc;
    if (in_entry >= std::int64_t(p.M) * p.ldc || in_entry % p.ldc >= p.N || std::int64_t(j) >= p.sc * p.batch)
      REQUIRE(got[j] == p.C0[j]);
  }
  return worst_relative;
}

std::vector<Problem> problems(int batch) {
  std::vector<Problem> out;
  unsigned seed = 100;
  for (Trans ta : {Trans::N, Trans::T})
    for (Trans tb : {Trans::N, Trans::T}) {
      out.emplace_back(ta, tb, 9, 13, 37, batch, 1.0f, 0.0f, seed += 3);
      out.emplace_back(ta, tb, 7, 5, 1100, batch, 0.75f, 0.5f, seed += 3);  // K over three 512-wide panels
    }
  return out;
}

float identity(float x) { return x; }

}  // namespace

TEST_CASE("matmul: the precision setting is scoped and named") {
  REQUIRE(gemm_precision() == GemmPrecision::f32);  // the process default: exact
  {
    const ScopedGemmPrecision bf(GemmPrecision::bf16);
    CHECK(gemm_precision() == GemmPrecision::bf16);
    {
      const ScopedGemmPrecision tf(GemmPrecision::tf32);
      CHECK(gemm_precision() == GemmPrecision::tf32);
    }
    CHECK(gemm_precision() == GemmPrecision::bf16);
  }
  CHECK(gemm_precision() == GemmPrecision::f32);
  CHECK(gemm_precision_name(GemmPrecision::tf32) == "tf32");
  CHECK(gemm_precision_description(GemmPrecision::bf16).find("f32 accumulation") != std::string::npos);
}

TEST_CASE("matmul: f32 products are within f32 accumulation error of the exact product") {
  for (bool batched : {false, true})
    for (const Problem& p : problems(batched ? 3 : 1)) {
      CAPTURE(batched);
      CAPTURE(p.K);
      CAPTURE(p.ta == Trans::T);
      CAPTURE(p.tb == Trans::T);
      check_against_reference(p, p.run(batched), 0.0, identity);
    }
}

#if !defined(KOKKOS_ENABLE_CUDA)
TEST_CASE("matmul: f32 precision is bitwise OpenBLAS sgemm") {
  for (const Problem& p : problems(1)) {
    std::vector<float> want = p.C0;
    cblas_sgemm(CblasRowMajor, p.ta == Trans::T ? CblasTrans : CblasNoTrans,
                p.tb == Trans::T ? CblasTrans : CblasNoTrans, p.M, p.N, p.K, p.alpha, p.A.data(), p.lda, p.B.data(),
                p.ldb, p.beta, want.data(), p.ldc);
    const std::vector<float> got = p.run(false);
    CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
  }
}
#endif

TEST_CASE("matmul: bf16 products are the f32-accumulated product of bf16-rounded inputs") {
  const ScopedGemmPrecision bf(GemmPrecision::bf16);
  const double u = std::ldexp(1.0, -8);  // bf16: 8 significant bits, round to nearest
  for (bool batched : {false, true})
    for (const Problem& p : problems(batched ? 3 : 1)) {
      CAPTURE(batched);
      CAPTURE(p.K);
      CAPTURE(p.ta == Trans::T);
      CAPTURE(p.tb == Trans::T);
      const double worst = check_against_reference(p, p.run(batched), u, round_to_bf16);
      CHECK(worst > u / 64);  // the inputs were rounded: f32 alone stays near 2^-24
    }
}

TEST_CASE("matmul: tf32 products are the f32-accumulated product of tf32-rounded inputs") {
  const ScopedGemmPrecision tf(GemmPrecision::tf32);
  const double u = std::ldexp(1.0, -11);  // tf32: 11 significant bits
  for (bool batched : {false, true})
    for (const Problem& p : problems(batched ? 2 : 1)) {
      CAPTURE(batched);
      CAPTURE(p.K);
      CAPTURE(p.ta == Trans::T);
      CAPTURE(p.tb == Trans::T);
#if defined(KOKKOS_ENABLE_CUDA)
      // cuBLAS may round TF32 inputs differently (truncation on some parts): only the error bound holds.
      check_against_reference(p, p.run(batched), u, identity);
#else
      const double worst = check_against_reference(p, p.run(batched), u, round_to_tf32);
      CHECK(worst > u / 64);
#endif
    }
}

TEST_CASE("matmul: gemm_batched in bf16 is bitwise a loop of gemm") {
  const ScopedGemmPrecision bf(GemmPrecision::bf16);
  for (const Problem& p : problems(3)) {
    const std::vector<float> batched = p.run(true);
    const View1<float> a = to_view(p.A), b = to_view(p.B), c = to_view(p.C0);
    for (int i = 0; i < p.batch; ++i)
      gemm<float>(p.ta, p.tb, p.M, p.N, p.K, p.alpha, a.data() + i * p.sa, p.lda, b.data() + i * p.sb, p.ldb, p.beta,
                  c.data() + i * p.sc, p.ldc);
    const std::vector<float> looped = to_host(c);
    CHECK(std::memcmp(batched.data(), looped.data(), looped.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("matmul: double products ignore the precision setting") {
  const ScopedGemmPrecision bf(GemmPrecision::bf16);
  const double third = 1.0 / 3.0;  // not a bf16 value
  Kokkos::View<double*, MemSpace> a("a", 1), b("b", 1), c("c", 1);
  Kokkos::deep_copy(a, third);
  Kokkos::deep_copy(b, 3.0);
  gemm<double>(Trans::N, Trans::N, 1, 1, 1, 1.0, a.data(), 1, b.data(), 1, 0.0, c.data(), 1);
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), c);
  CHECK(h(0) == third * 3.0);
}

TEST_CASE("matmul: rounded products stop allocating once the scratch has grown") {
  const ScopedGemmPrecision bf(GemmPrecision::bf16);
  MemoryAccounting::install();
  const Problem p(Trans::N, Trans::T, 64, 96, 700, 1, 1.0f, 0.0f, 7);
  const View1<float> a = to_view(p.A), b = to_view(p.B), c = to_view(p.C0);
  auto product = [&] {
    gemm<float>(p.ta, p.tb, p.M, p.N, p.K, p.alpha, a.data(), p.lda, b.data(), p.ldb, p.beta, c.data(), p.ldc);
    Kokkos::fence();
  };
  product();  // grows the scratch
  MemoryAccounting::reset_peak();
  const std::int64_t live = MemoryAccounting::device().live_bytes;
  for (int r = 0; r < 3; ++r) product();
  CHECK(MemoryAccounting::device().live_bytes == live);
  CHECK(MemoryAccounting::device().peak_bytes == live);  // nothing was allocated, even for a moment
}
